"""Hostile inputs: every recoverable problem is skipped and counted, every fatal one is one clean line."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from in_process import call

from data_prep.cli import main as prep_main
from data_prep.format import SPLITS, load_prepared
from data_prep.tokenizer import load_tokenizer_from_dir

GOOD_TXT = "Hello world.\n\n    indented code\n\tx = 1  \n"


def _hostile_corpus(root: Path) -> list[str]:
    """Write one file per bad case; return the texts of the documents that must survive."""
    root.mkdir()
    (root / "good.txt").write_text(GOOD_TXT)
    (root / "empty.txt").write_text("")
    (root / "blank.txt").write_text("   \n\t\n")
    (root / "latin1.txt").write_bytes(b"caf\xe9 au lait\n")
    (root / "nul.txt").write_bytes(b"abc\x00def\n")
    lines = [
        json.dumps({"text": "json doc one", "id": 1}),
        '{"text": "unterminated',
        json.dumps({"body": "no text field"}),
        json.dumps({"text": None}),
        json.dumps({"text": 5}),
        json.dumps([1, 2]),
        "",
        json.dumps({"text": "json doc \u00e9\u4e2d two"}),
        json.dumps({"text": "bad \ud800 surrogate"}),  # valid JSON, no UTF-8 form: skipped, counted
    ]
    (root / "rows.jsonl").write_text("\n".join(lines) + "\n")
    (root / "array.json").write_text(json.dumps([{"text": "array doc"}, {"text": ""}], indent=1))
    (root / "latin1.csv").write_bytes(b'text\n"caf\xe9 csv"\n')  # a mixed-encoding CSV: repaired, kept
    (root / "table.csv").write_text('text,label\n"csv, doc one",1\n,2\n"multi\nline csv",3\n')
    pq.write_table(pa.table({"text": ["parquet doc", None, "  ", "parquet doc 2"]}), root / "rows.parquet")
    return [
        GOOD_TXT, "caf\ufffd au lait\n", "json doc one", "json doc \u00e9\u4e2d two", "array doc",
        "caf\ufffd csv", "csv, doc one", "multi\nline csv", "parquet doc", "parquet doc 2",
    ]  # fmt: skip


EXPECTED_SKIPS = {
    "empty": 5,  # empty.txt, blank.txt, array.json "", table.csv empty cell, parquet "  "
    "nul_bytes": 1,
    "lone_surrogate": 1,
    "malformed_json": 1,
    "not_an_object": 1,
    "missing_text_field": 1,
    "null_text": 2,  # jsonl null, parquet null
    "non_string_text": 1,
}


def _docs_by_id(out: Path) -> dict[int, str]:
    """Reassemble every document from its chunks (in stored order) and decode it."""
    data, tok = load_prepared(out), load_tokenizer_from_dir(out)
    docs: dict[int, list[int]] = {}
    for name in SPLITS:
        for row in data.split(name):
            docs.setdefault(row["doc_id"], []).extend(row["input_ids"])
    return {k: tok.decode(v) for k, v in docs.items()}


def test_hostile_corpus_counts_and_loses_nothing(tmp_path, capsys):
    good = _hostile_corpus(tmp_path / "in")
    out = tmp_path / "out"
    args = ["--input", str(tmp_path / "in"), "--out", str(out), "--tokenizer", "byte", "--max-seq-len", "8"]
    assert prep_main([*args, "--val-fraction", "0.2", "--test-fraction", "0.2", "--quiet"]) == 0
    err = capsys.readouterr().err
    assert err.count("latin1.txt:1: invalid UTF-8 at byte 3") == 1, err  # warned once, not once per pass
    assert err.count("latin1.csv:2: invalid UTF-8 at byte 9") == 1, err  # a CSV as a text file
    meta = load_prepared(out).meta
    assert {k: v for k, v in meta["skipped"].items() if v} == EXPECTED_SKIPS
    assert meta["documents"]["repaired_invalid_utf8"] == 2
    assert meta["documents"]["kept"] == len(good)
    # every good document is in exactly one split, whole: counts and bytes in == out
    assert sum(meta["splits"][s]["docs"] for s in SPLITS) == len(good)
    assert sum(meta["splits"][s]["bytes"] for s in SPLITS) == sum(len(g.encode()) for g in good)
    assert sorted(_docs_by_id(out).values()) == sorted(good)
    assert all(meta["splits"][s]["docs"] > 0 for s in SPLITS)
    for name in SPLITS:  # chunking: all chunks full except each document's last
        ds = load_prepared(out).split(name)
        lengths = np.asarray(ds.data.table.column("length"))
        assert lengths.max() <= 8 and lengths.sum() == meta["splits"][name]["tokens"]


def test_sentencepiece_roundtrip_on_code_and_prose(tmp_path):
    src = tmp_path / "in"
    src.mkdir()
    texts = [
        f"def f{i}(x):\n    if x:\n\t\treturn  {i} * x   # caf\u00e9\n\n" * (i % 5 + 1) for i in range(40)
    ]
    texts += [
        f"Paragraph {i}: the quick brown fox jumps over the lazy dog; \ufb01ne \u00a0 {i}.\r\n" * 3
        for i in range(40)
    ]
    for i, t in enumerate(texts):
        (src / f"doc{i:03d}.md").write_bytes(t.encode())
    out = tmp_path / "out"
    assert (
        prep_main(
            ["--input", str(src), "--out", str(out), "--vocab-size", "312", "--max-seq-len", "16", "--quiet"]
        )
        == 0
    )
    # the text builder reads with universal newlines, so \r\n arrives as \n
    assert sorted(_docs_by_id(out).values()) == sorted(t.replace("\r\n", "\n") for t in texts)


def test_doc_split_modes(tmp_path):
    src = tmp_path / "a.txt"
    src.write_text("p1 l1\np1 l2\n\n\np2 l1\n  \np3\n")
    counts = {}
    for mode in ("file", "paragraph", "line"):
        out = tmp_path / mode
        assert (
            prep_main(
                [
                    "--input",
                    str(src),
                    "--out",
                    str(out),
                    "--tokenizer",
                    "byte",
                    "--doc-split",
                    mode,
                    "--quiet",
                ]
            )
            == 0
        )
        meta = load_prepared(out).meta
        counts[mode] = (meta["documents"]["kept"], meta["skipped"]["empty"])
    assert counts == {"file": (1, 0), "paragraph": (3, 0), "line": (4, 3)}


def test_adding_files_does_not_reshuffle(tmp_path):
    src = tmp_path / "in"
    src.mkdir()
    (src / "a.txt").write_text("".join(f"first file line {i}\n" for i in range(60)))
    common = [
        "--tokenizer",
        "byte",
        "--doc-split",
        "line",
        "--val-fraction",
        "0.2",
        "--test-fraction",
        "0.2",
        "--quiet",
    ]

    def split_of(out: Path) -> dict[int, str]:
        data = load_prepared(out)
        return {d: name for name in SPLITS for d in data.split(name)["doc_id"]}

    assert prep_main(["--input", str(src), "--out", str(tmp_path / "o1"), *common]) == 0
    (src / "b.txt").write_text("".join(f"second file line {i}\n" for i in range(60)))
    assert prep_main(["--input", str(src), "--out", str(tmp_path / "o2"), *common]) == 0
    before, after = split_of(tmp_path / "o1"), split_of(tmp_path / "o2")
    assert len(after) == 120 and all(after[d] == s for d, s in before.items())
    assert len(set(before.values())) == 3  # the fractions actually produced all three splits


def _fatal_cases(tmp_path: Path) -> dict[str, tuple[list[str], str]]:
    """name -> (argv, text the one error line must contain)."""
    (tmp_path / "bin.dat").write_bytes(b"\x00\x01")
    (tmp_path / "only_empty.txt").write_text(" \n")
    (tmp_path / "one.txt").write_text("one line\n")
    (tmp_path / "broken.csv").write_text('text\n"a"\n"b",extra,fields\n')
    full = tmp_path / "full"
    full.mkdir()
    (full / "x").write_text("x")
    out = str(tmp_path / "o")
    return {
        "missing path": (["--input", str(tmp_path / "nope.txt"), "--out", out], "nope.txt: no such file"),
        # a block no memory holds (it read the whole corpus into one block)
        "huge block": (["--input", str(tmp_path / "one.txt"), "--block-mb", "1e9", "--out", out], "--block-mb 1e+09: a block and its tokens need about"),
        "unknown format": (["--input", str(tmp_path / "bin.dat"), "--out", out], "bin.dat: unknown format"),
        "no documents": (["--input", str(tmp_path / "only_empty.txt"), "--out", out], "no documents left in " + str(tmp_path / "only_empty.txt")),
        "broken csv": (["--input", str(tmp_path / "broken.csv"), "--out", out], "broken.csv: cannot load as csv"),
        "out not empty": (["--tokenizer", "byte", "--out", str(full)], "--out is not empty; pass --overwrite"),
        "not a prep dir": (["--tokenizer", "byte", "--out", str(full), "--overwrite"], "refusing to --overwrite"),
        "bad fraction": (["--val-fraction", "0.7", "--test-fraction", "0.4", "--out", out], "--val-fraction 0.7 + --test-fraction 0.4"),
        "hub offline": (["--hub", "someone/some_dataset", "--out", out], "--hub someone/some_dataset: cannot"),
    }  # fmt: skip


def _fatal_line(name: str, rc: int, stdout: str, stderr: str, needle: str) -> None:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert rc == 2, (name, stderr)
    assert "Traceback" not in stderr and stdout == "", (name, stderr)
    # warnings may precede it (e.g. what was skipped); the error itself is exactly one last line
    assert [line for line in lines if line.startswith("error: ")] == lines[-1:], (name, stderr)
    assert needle in lines[-1], (name, lines[-1])


def test_fatal_errors_are_one_line_exit_2(tmp_path, capsys):
    """Each case by data prep's main in this process (tests/in_process.py); the hub's by `python -m data_prep`
    itself, the launch that keeps the entry point honest (and the hub client's state out of this process)."""
    cases = _fatal_cases(tmp_path)
    argv, needle = cases.pop("hub offline")
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "data_prep", *argv, "--quiet"], capture_output=True, text=True,
                       env={**os.environ, "PYTHONWARNINGS": "ignore"}, timeout=120)  # fmt: skip
    _fatal_line("hub offline", p.returncode, p.stdout, p.stderr, needle)
    assert time.monotonic() - t0 < 90  # the hub case fails fast instead of retrying
    for name, (argv, needle) in cases.items():
        ran = call(prep_main, [*argv, "--quiet"], capsys)
        _fatal_line(name, ran.code, ran.out, ran.err, needle)
    assert not (tmp_path / "o").exists()


@pytest.mark.skipif(os.geteuid() == 0, reason="root can read any file")
def test_unreadable_file(tmp_path, capsys):
    f = tmp_path / "secret.txt"
    f.write_text("hidden")
    f.chmod(0)
    assert prep_main(["--input", str(f), "--out", str(tmp_path / "o"), "--tokenizer", "byte", "--quiet"]) == 2
    assert "secret.txt: cannot read file" in capsys.readouterr().err


def _digests(out: Path) -> list[str]:
    return [
        f["xxh3_128"]
        for g in json.loads((out / "manifest.json").read_text())["groups"]
        for f in g["files"].values()
    ]


def _lines_flags(block_mb: str = "0.02") -> list[str]:
    return ["--doc-split", "line", "--tokenizer", "byte", "--block-mb", block_mb, "--shard-mb", "0.1",
            "--num-proc", "2", "--quiet"]  # fmt: skip


@pytest.fixture(scope="module")
def lines_reference(tmp_path_factory) -> tuple[Path, Path]:
    """~420 KB of lines (~1.7 MB of shards in ~20 blocks) and an uninterrupted prep of them."""
    root = tmp_path_factory.mktemp("lines")
    src = root / "lines.txt"
    src.write_text("".join(f"line {i}: the quick brown fox jumps over the lazy dog\n" for i in range(8000)))
    assert prep_main(["--input", str(src), *_lines_flags(), "--out", str(root / "reference")]) == 0
    return src, root / "reference"


def _prep(
    src: Path, out: Path, faults: dict[str, str] | None = None, block_mb: str = "0.02"
) -> subprocess.CompletedProcess:
    """``python -m data_prep`` on `src` in a session of its own. A run that hangs is stopped with SIGABRT,
    so faulthandler prints where every process of it waits, and the test fails with that."""
    cmd = [sys.executable, "-m", "data_prep", "--input", str(src), *_lines_flags(block_mb), "--out", str(out)]
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "PYTHONFAULTHANDLER": "1", **(faults or {})}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)  # fmt: skip
    try:
        out_text, err = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGABRT)
        time.sleep(2)
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail(f"data prep hung; where it waited:\n{proc.communicate()[1][-6000:]}")
    return subprocess.CompletedProcess(cmd, proc.returncode, out_text, err)


def _one_error_line(p: subprocess.CompletedProcess) -> str:
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert p.returncode == 2 and len(lines) == 1, p.stderr
    return lines[0]


def test_disk_full_is_one_line_and_resumes(tmp_path, lines_reference):
    """Data prep fills the disk mid-encode: one line saying so and where, the finished shard groups kept;
    once there is room the same command resumes, and writes the shards of an uninterrupted prep. The disk
    is a real 1 MiB tmpfs where this machine lets us mount one, else ENOSPC injected into the shard writes
    (MLSTM_DS_FAULTS=enospc_after_bytes); the test's output says which ran."""
    src, reference = lines_reference
    mnt = tmp_path / "small_disk"
    mnt.mkdir()
    mount = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], capture_output=True, text=True
    )
    faults = {} if mount.returncode == 0 else {"MLSTM_DS_FAULTS": "enospc_after_bytes=800000"}
    print(
        f"disk full: {'a 1 MiB tmpfs' if not faults else 'injected ENOSPC (mount refused: ' + mount.stderr.strip() + ')'}"
    )
    try:
        line = _one_error_line(_prep(src, mnt / "o", faults))
        assert (
            line.startswith(f"error: {mnt / 'o'}: no space left on device")
            and "rerun the same command" in line
        )
        assert len(json.loads((mnt / "o" / "manifest.json").read_text())["groups"]) > 0
        first = (mnt / "o" / "train" / "00000.arrow").stat().st_mtime_ns
        if not faults:
            subprocess.run(["mount", "-o", "remount,size=8m", str(mnt)], check=True)
        p = _prep(src, mnt / "o")
        assert p.returncode == 0, p.stderr
        assert (mnt / "o" / "train" / "00000.arrow").stat().st_mtime_ns == first  # kept, not rewritten
        assert _digests(mnt / "o") == _digests(reference)
        assert load_prepared(mnt / "o").meta["documents"]["kept"] == 8000
        assert not (mnt / "o" / ".spool").exists()
    finally:
        if not faults:
            subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_a_killed_worker_is_one_line_and_the_rerun_resumes(tmp_path, lines_reference):
    """An encode worker killed mid-run (SIGKILL, as the OOM killer does; MLSTM_DS_FAULTS=kill_worker_at_block)
    ends the run with one line, not a wait for the lost block forever; the finished groups are kept and the
    same command resumes to the shards of an uninterrupted prep. Blocks of 80 KB, over a pipe's 64 KiB: a
    block sent through the pool's queue could hang the executor's cleanup on Python < 3.11.5 (CPython
    94777), so blocks go through spool files (data_prep.pool._send)."""
    src, _ = lines_reference
    reference, out = tmp_path / "reference", tmp_path / "o"
    assert prep_main(["--input", str(src), *_lines_flags("0.08"), "--out", str(reference)]) == 0
    # block 4 is handed out once block 0's result is written (two blocks in flight per worker): a group is done
    line = _one_error_line(_prep(src, out, {"MLSTM_DS_FAULTS": "kill_worker_at_block=4"}, block_mb="0.08"))
    assert (
        line.startswith(f"error: {out}: a data prep worker process ended abruptly")
        and "rerun the same command" in line
    )
    assert len(json.loads((out / "manifest.json").read_text())["groups"]) > 0
    first = (out / "train" / "00000.arrow").stat().st_mtime_ns
    p = _prep(src, out, block_mb="0.08")
    assert p.returncode == 0, p.stderr
    assert (out / "train" / "00000.arrow").stat().st_mtime_ns == first
    assert _digests(out) == _digests(reference)


def _cut_streams(root: Path) -> bytes:
    """.gz, .xz and .zst copies of one text, each cut at 80% of its compressed size; returns the text."""
    import gzip
    import lzma

    import zstandard

    rng = np.random.default_rng(0)
    words = [f"w{i}" for i in range(500)]
    text = "".join(" ".join(rng.choice(words, 150)) + "\n" for _ in range(2500)).encode()  # ~1.7 MB
    for ext, compress in (("gz", gzip.compress), ("xz", lzma.compress), ("zst", zstandard.compress)):
        blob = compress(text)
        (root / f"cut.txt.{ext}").write_bytes(blob[: len(blob) * 4 // 5])
    return text


def test_corpora_as_they_come(tmp_path, capsys):
    """NUL bytes in JSON and CSV text, a CSV field over 1 MB, parquet with null and non-string text, and
    truncated .gz/.xz/.zst files: every good record kept, every bad one counted and named. A truncated
    stream keeps its whole lines read before the break (it refused the whole prep before)."""
    src = tmp_path / "in"
    src.mkdir()
    (src / "nul.jsonl").write_text(
        json.dumps({"text": "a\x00b"}) + "\n" + json.dumps({"text": "fine json"}) + "\n"
    )
    (src / "nul.csv").write_bytes(b'text\n"a\x00b"\n"fine csv"\n')
    big = "".join(f"field {i} " for i in range(150_000))  # ~1.4 MB in one CSV field (csv's limit: 128 KiB)
    (src / "big.csv").write_text(f'text\n"{big}"\nsmall\n')
    pq.write_table(pa.table({"text": ["parquet ok", None]}), src / "nulls.parquet")
    pq.write_table(pa.table({"text": [1, 2]}), src / "ints.parquet")
    text = _cut_streams(src)
    kept_text = text[: text.index(b"\n", (1 << 20) - 1) + 1]  # the first 1 MiB read, finished to its line end
    out = tmp_path / "out"
    args = ["--input", str(src), "--out", str(out), "--tokenizer", "byte", "--doc-split", "line"]
    assert prep_main([*args, "--max-seq-len", "1024", "--quiet"]) == 0
    err = capsys.readouterr().err
    meta = load_prepared(out).meta
    assert {k: v for k, v in meta["skipped"].items() if v} == {
        "nul_bytes": 2,
        "null_text": 1,
        "non_string_text": 2,
    }
    at = kept_text.count(b"\n") + 1  # the line the failed read started at
    assert sorted(meta["documents"]["inputs_cut_short"]) == [
        f"{src}/cut.txt.{e}:{at}" for e in ("gz", "xz", "zst")
    ]
    for ext in ("gz", "xz", "zst"):
        assert f"cut.txt.{ext}:" in err and "compressed stream truncated or corrupt" in err
    lines = kept_text.decode().splitlines()
    good = ["fine json", "fine csv", big, "small", "parquet ok", *lines * 3]
    assert meta["documents"]["kept"] == len(good)
    assert sum(meta["splits"][s]["bytes"] for s in SPLITS) == sum(len(g.encode()) for g in good)


@pytest.mark.parametrize("cpus, block_mb, why", [(None, "4", "the input makes 1 block(s) of --block-mb 4 to encode"),
                                                 ({0}, "0.02", "1 CPU(s) are available to this process")])  # fmt: skip
def test_num_proc_is_capped_at_the_cpus_and_the_blocks_in_one_line(
    tmp_path, lines_reference, cpus, block_mb, why
):
    """--num-proc 4096 on a 2-core box forked 656 workers and made no progress in 300 s; a worker count above
    the CPUs the process may use, or above the blocks the input makes, is now capped with one warning line
    (the output is the same for any count)."""
    src, _ = lines_reference
    cmd = [sys.executable, "-m", "data_prep", "--input", str(src), "--doc-split", "line", "--tokenizer", "byte",
           "--block-mb", block_mb, "--num-proc", "9", "--out", str(tmp_path / "o")]  # fmt: skip
    p = subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
        preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None,
    )
    assert p.returncode == 0, p.stderr
    capped = [ln for ln in p.stderr.splitlines() if "--num-proc" in ln]
    assert len(capped) == 1 and capped[0].endswith(f"WARNING --num-proc 9 capped at 1: {why}"), p.stderr


def test_a_tokenizer_sample_larger_than_memory_holds_is_capped_in_one_line(tmp_path, lines_reference):
    """--tokenizer-train-mb 1e9 (a terabyte): the scan would keep that much text twice over, and SentencePiece's
    trainer many times more; it is capped at what the free memory holds, in one line (this corpus is far
    smaller, so the tokenizer is the one an uncapped run trains)."""
    src, _ = lines_reference
    cmd = [sys.executable, "-m", "data_prep", "--input", str(src), "--doc-split", "line",
           "--tokenizer-train-mb", "1e9", "--out", str(tmp_path / "o")]  # fmt: skip
    p = subprocess.run(
        cmd, capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONWARNINGS": "ignore"}
    )
    assert p.returncode == 0, p.stderr
    capped = [ln for ln in p.stderr.splitlines() if "--tokenizer-train-mb" in ln]
    assert len(capped) == 1 and "WARNING --tokenizer-train-mb 1000000000.0 capped at " in capped[0], p.stderr
    why = r"capped at \d+: SentencePiece training needs about 22x its sample, and [\d.]+ [GM]iB is available$"
    assert re.search(why, capped[0]), capped[0]
