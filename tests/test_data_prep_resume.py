"""Sharded output: kill-and-rerun resumes, changed input is refused, one book still gets all three splits,
old-format data says to re-run, memory-mapped loading, adaptive buckets on real short-sentence text."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from corpus_variants import BOOK

from data_prep.cli import main as prep_main
from data_prep.format import FORMAT_VERSION, SPLITS, PreparedDataError, load_prepared
from data_prep.tokenizer import ByteTokenizer

ROOT = Path(__file__).resolve().parents[1]


def _shards(out: Path) -> dict[str, tuple[str, int]]:
    """shard file -> (sha256, inode): a kept file has the same inode, a rewritten one not."""
    return {
        str(p.relative_to(out)): (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_ino)
        for p in sorted(out.rglob("*.arrow"))
    }


def _big_corpus(path: Path, copies: int, paragraph: int = 0) -> None:
    """The novel's lines, numbered per copy so every line is its own document (with ``paragraph``:
    a blank line after every that many lines)."""
    lines = [ln for ln in BOOK.read_text(encoding="utf-8-sig").splitlines() if ln.strip()]
    with open(path, "w", encoding="utf-8") as f:
        for c in range(copies):
            f.writelines(
                f"{c}: {ln}\n" + ("\n" if paragraph and i % paragraph == paragraph - 1 else "")
                for i, ln in enumerate(lines)
            )


def _start_and_kill(cmd: list[str], out: Path, groups: int) -> None:
    """Run a real prep and SIGKILL it once ``groups`` shard groups are finished."""
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if len(json.loads((out / "manifest.json").read_text())["groups"]) >= groups:
                break
        except (OSError, ValueError, KeyError):
            pass
        time.sleep(0.005)
    os.kill(proc.pid, signal.SIGKILL)  # the pool's workers die with it (lifetime.die_with_parent)
    try:
        proc.communicate(timeout=60)  # returns once no process holds its pipes: the workers are gone
    except subprocess.TimeoutExpired:
        subprocess.run(["pkill", "-KILL", "-f", str(out)], check=False)
        pytest.fail("data prep's workers outlived its SIGKILL (they hold its pipes open)")
    assert proc.returncode == -signal.SIGKILL, (
        "prep finished before it could be killed: make the corpus bigger"
    )


def test_kill_and_rerun_resumes_and_changed_input_is_refused(tmp_path, capsys):
    src = tmp_path / "corpus.txt"
    _big_corpus(src, 40)  # ~11 MB, ~170k documents
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "data_prep", "--input", str(src), "--out", str(out), "--doc-split", "line",
           "--tokenizer", "byte", "--block-mb", "0.05", "--shard-mb", "0.5", "--num-proc", "2"]  # fmt: skip
    _start_and_kill(cmd, out, groups=2)
    assert not (out / "meta.json").exists()
    kept = json.loads((out / "manifest.json").read_text())["groups"]
    kept_files = {f["name"] for g in kept for f in g["files"].values()}
    before = _shards(out)
    assert len(kept) >= 2 and kept_files <= set(before)
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)

    # the input only touched (as a copy without -p does): same size and content, so it resumes
    st = src.stat()
    os.utime(src, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert f"resuming {out}: the scan and {len(kept)} finished shard group(s) are kept" in p.stderr
    after = _shards(out)
    assert all(after[name] == before[name] for name in kept_files)  # same bytes, same inode: not rewritten
    fresh = tmp_path / "fresh"
    assert subprocess.run([*cmd[:5], "--out", str(fresh), *cmd[7:], "--quiet"], cwd=ROOT).returncode == 0
    assert {k: v[0] for k, v in after.items()} == {k: v[0] for k, v in _shards(fresh).items()}
    assert json.loads((out / "manifest.json").read_text()) == json.loads(
        (fresh / "manifest.json").read_text()
    )
    n_lines = src.read_text(encoding="utf-8").count("\n")
    meta = load_prepared(out).meta
    assert meta["documents"]["kept"] == n_lines
    assert (
        sum(meta["splits"][s]["bytes"] for s in SPLITS) == src.stat().st_size - n_lines
    )  # newlines not kept

    # a changed input or setting is refused in one line naming it, and the unfinished output is kept
    def refused(*extra: str) -> str:
        capsys.readouterr()
        assert prep_main([*cmd[3:5], "--out", str(copy), *cmd[7:], *extra]) == 2
        lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
        assert len(lines) == 1 and "unfinished data_prep run of another command" in lines[0], lines
        assert "--overwrite" in lines[0] and {k: v[0] for k, v in _shards(copy).items()} == {
            k: v[0] for k, v in before.items()
        }
        return lines[0]

    original = src.read_bytes()
    data = bytearray(original)
    data[1000:1003] = b"XYZ" if data[1000:1003] != b"XYZ" else b"ABC"  # same size, same mtime
    src.write_bytes(bytes(data))
    os.utime(src, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    assert f"(input {src} has other content (same size))" in refused()
    with open(src, "a", encoding="utf-8") as f:
        f.write("one more line\n")
    assert f"(input {src} was {len(data)} bytes, now {len(data) + 14})" in refused()
    assert f"was {len(data)} bytes, now {len(data) + 14}; --max-seq-len was 256, now 128)" in refused(
        "--max-seq-len", "128"
    )
    # an edit the samples miss (same size, between the last two sampled windows, in blocks not yet
    # encoded) that changes the text's byte count: refused at the end, where the bytes must add up
    from data_prep.sources import SAMPLE_EDGE, SAMPLE_WINDOW, SAMPLE_WINDOWS

    span = len(original) - 2 * SAMPLE_EDGE - SAMPLE_WINDOW
    cut = original.index(b"\n", len(original) - SAMPLE_EDGE - span // (2 * (SAMPLE_WINDOWS - 1)))
    src.write_bytes(original[:cut] + b" " + original[cut + 1 :])  # two lines become one
    capsys.readouterr()
    assert prep_main([*cmd[3:5], "--out", str(copy), *cmd[7:], "--quiet"]) == 2
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "the input changed while data_prep was reading it" in lines[0], lines


def test_one_book_gets_contiguous_train_validation_test(tmp_path):
    out = tmp_path / "out"
    assert prep_main(["--input", str(BOOK), "--out", str(out), "--tokenizer", "byte", "--quiet"]) == 0
    data = load_prepared(out)
    meta = data.meta
    assert meta["split_mode"] == "segments" and meta["documents"]["kept"] == 1
    tokens = {s: meta["splits"][s]["tokens"] for s in SPLITS}
    assert all(tokens[s] > 0 for s in SPLITS)
    total = sum(tokens.values())
    assert abs(tokens["validation"] / total - 0.05) < 0.01 and abs(tokens["test"] / total - 0.05) < 0.01
    # train, validation, test are consecutive pieces of the book: together they are the book
    stream = [np.concatenate(list(map(np.asarray, data.split(s)["input_ids"]))) for s in SPLITS]
    text = ByteTokenizer().decode(np.concatenate(stream).tolist())
    # the book as shipped, less its byte-order mark (no text: the readers drop it) and its CRs
    assert text == BOOK.read_bytes().decode("utf-8-sig").replace("\r\n", "\n")


def test_old_format_says_rerun(tmp_path):
    """A format_version 1 directory (save_to_disk splits) as the previous data_prep wrote it."""
    import datasets

    old = tmp_path / "old"
    old.mkdir()
    (old / "meta.json").write_text(
        json.dumps({"format_version": 1, "tokenizer": {"type": "byte"}, "buckets": [8]})
    )
    datasets.Dataset.from_dict(
        {"input_ids": [[5, 6]], "length": [2], "num_bytes": [2], "bucket": [0], "doc_id": [1]}
    ).save_to_disk(str(old / "train"))
    with pytest.raises(
        PreparedDataError,
        match=rf"format_version 1, this version reads {FORMAT_VERSION}: re-run `python -m data_prep",
    ):
        load_prepared(old)
    # and the trainer's entry point turns it into one line, not a traceback
    p = subprocess.run(
        [sys.executable, "-c", "import sys; from data_prep.format import load_prepared; load_prepared(sys.argv[1])", str(old)],
        cwd=ROOT, capture_output=True, text=True,
    )  # fmt: skip
    assert "re-run `python -m data_prep" in p.stderr


def test_split_is_memory_mapped(prepared_byte_dir):
    import pyarrow as pa

    before = pa.total_allocated_bytes()
    ds = load_prepared(prepared_byte_dir).split("train")
    assert len(ds) == load_prepared(prepared_byte_dir).meta["splits"]["train"]["examples"]
    col = ds.data.column("input_ids")
    # the token buffers live in the mapped files, not in Arrow's heap (only the small bucket column does)
    assert pa.total_allocated_bytes() - before < 8 * len(ds) + (1 << 16)
    assert sum(c.nbytes for c in col.chunks) > 4 * len(ds)


@pytest.mark.parametrize("doc_split", ["line", "paragraph"])
def test_adaptive_buckets_on_short_sentences(tmp_path, doc_split):
    """One line (or short paragraph) per example: the buckets reach the target at the default batch."""
    src = tmp_path / "lines.txt"
    _big_corpus(src, 2, paragraph=3 if doc_split == "paragraph" else 0)
    out = tmp_path / "out"
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
                doc_split,
                "--quiet",
            ]
        )
        == 0
    )
    meta = load_prepared(out).meta
    assert meta["padding_efficiency"] >= 0.98 > meta["padding_efficiency_unbucketed"]
    assert len(meta["buckets"]) <= 64


def test_one_book_that_hashes_to_validation_still_trains_a_tokenizer(tmp_path):
    """With --seed 6 the whole book hashes into validation: no train document to sample by hash."""
    from data_prep.documents import content_id, split_coordinate

    text = BOOK.read_bytes().decode("utf-8").replace("\r\n", "\n")
    assert split_coordinate(content_id(text.encode()), 6) < 0.05  # the premise of this test
    out = tmp_path / "out"
    args = ["--input", str(BOOK), "--out", str(out), "--seed", "6", "--vocab-size", "500", "--quiet"]
    assert prep_main(args) == 0
    meta = load_prepared(out).meta
    assert meta["split_mode"] == "segments" and meta["tokenizer"]["type"] == "sentencepiece"
    assert all(meta["splits"][s]["examples"] > 0 for s in SPLITS)
    assert meta["splits"]["train"]["tokens"] > 10 * meta["splits"]["validation"]["tokens"]
