"""app/classify.py: the classifier app/transfer.py kept labels new text: the accuracy transfer.json reports,
every input format and stdin, bad rows named, the raw features, the same bytes from 1 rank and from 2
(the real deepspeed launcher, gloo) and after a kill and a rerun, a progress bar on a terminal.

The texts are sentences of a public-domain novel (tests/fixtures/corpora/botchan.txt), labelled "dialogue"
when they hold a quotation mark; the model is the tiny random byte-level one of tests/test_transfer.py,
whose features separate them only in part, so the accuracies compared are not all 1.
"""

from __future__ import annotations

import contextlib
import csv
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from launcher import ROOT, deepspeed_cmd, env, run
from test_checkpoints_consolidate import fake_checkpoint, tiny

from app.classify import main as classify_main
from app.transfer import main as transfer_main

BOTCHAN = ROOT / "tests" / "fixtures" / "corpora" / "botchan.txt"


def botchan_sentences() -> list[str]:
    """The novel's sentences (from CHAPTER I on), 20 to 300 characters, in order."""
    text = BOTCHAN.read_text(encoding="utf-8")
    body = text[text.find("CHAPTER I") :]
    parts = (s.strip().replace("\n", " ") for s in re.split(r"(?<=[.!?])\s+", body))
    return [s for s in parts if 20 < len(s) < 300]


def write_rows(path: Path, rows: list[dict]) -> Path:
    """rows as CSV, JSONL or Parquet (by the suffix)."""
    if path.suffix == ".csv":
        with path.open("w", newline="", encoding="utf-8") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    elif path.suffix == ".jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    else:
        import datasets

        datasets.Dataset.from_list(rows).to_parquet(path)
    return path


def dialogue_rows(sentences: list[str]) -> list[dict]:
    return [
        {"id": f"s{i}", "text": s, "label": "dialogue" if '"' in s else "narration"}
        for i, s in enumerate(sentences)
    ]


@pytest.fixture(scope="module")
def kept(tmp_path_factory):
    """A tiny model's probe on 400 training sentences, kept by app/transfer.py; 240 test sentences."""
    root = tmp_path_factory.mktemp("classify")
    fake_checkpoint(root / "run", tiny(), "module")
    rows = dialogue_rows(botchan_sentences())
    write_rows(root / "train.csv", rows[:400])
    write_rows(root / "test.jsonl", rows[1000:1240])
    args = [
        "--checkpoint",
        str(root / "run"),
        "--train",
        str(root / "train.csv"),
        "--test",
        str(root / "test.jsonl"),
    ]
    args += ["--out", str(root / "out"), "--finetune-epochs", "0", "--heatmap-texts", "0"]
    assert transfer_main(args) == 0
    return root, json.loads((root / "out" / "transfer.json").read_text())


@pytest.fixture(autouse=True)
def _one_thread(monkeypatch):
    """In-process runs take one thread, as the launched ones do (OpenMP's spinning threads crawl on a loaded
    2-core machine); the thread count this process had is restored after."""
    import torch

    threads = torch.get_num_threads()
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    yield
    torch.set_num_threads(threads)


def classify(*args: str) -> int:
    return classify_main([str(a) for a in args])


def read_csv(path: Path) -> list[dict]:
    with path.open(newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def test_the_test_split_gets_the_accuracy_transfer_reported(kept, tmp_path, capsys):
    root, res = kept
    clf = res["classifier"]
    assert Path(clf) == root / "out" / "classifier" and res["chosen"]["method"] == "probe"
    out = tmp_path / "labels.csv"
    assert (
        classify(
            "--classifier", clf, "--input", root / "test.jsonl", "--output", out, "--keep-fields", "label"
        )
        == 0
    )
    rows = read_csv(out)
    assert [int(r["row"]) for r in rows] == list(range(1, 241))  # every text, in input order
    acc = np.mean([r["predicted"] == r["label"] for r in rows])
    assert acc == res["chosen"]["test_accuracy"] == res["test_accuracy"]
    assert 0.5 < acc < 1 and {r["predicted"] for r in rows} == {"dialogue", "narration"}  # a real comparison
    p = np.asarray([[float(r["p_dialogue"]), float(r["p_narration"])] for r in rows])
    np.testing.assert_allclose(p.sum(1), 1, atol=1e-6)
    assert all((r["predicted"] == "dialogue") == (float(r["p_dialogue"]) > 0.5) for r in rows)
    top = [t["neuron"] for t in res["top_neurons"][:3]]
    assert list(rows[0])[-3:] == [f"neuron_{n}" for n in top]  # the probe's strongest neurons, their values
    said = capsys.readouterr().out
    assert "classified 240 texts" in said and "texts/s" in said and "bytes/s" in said
    assert not (tmp_path / "labels.csv.parts").exists()  # the parts are gone once the output is written


def test_every_input_format_and_stdin_give_the_same_labels_and_bad_rows_are_named(kept, tmp_path, capsys):
    clf = kept[1]["classifier"]
    rows = dialogue_rows(botchan_sentences()[1000:1060])
    want = None
    for suffix in (".csv", ".jsonl", ".parquet", ".txt"):
        src = tmp_path / f"in{suffix}"
        if suffix == ".txt":
            src.write_text("".join(r["text"] + "\n" for r in rows), encoding="utf-8")
        else:
            write_rows(src, rows)
        out = tmp_path / f"out_{suffix[1:]}.jsonl"
        assert classify("--classifier", clf, "--input", src, "--output", out, "--chunk-rows", "16") == 0
        got = [
            (r["row"], r["predicted"], r["p_dialogue"]) for r in map(json.loads, out.read_text().splitlines())
        ]
        assert want is None or got == want, suffix
        want = got
    lines = subprocess.run(
        [sys.executable, "app/classify.py", "--classifier", clf, "--output", str(tmp_path / "stdin.jsonl")],
        input="".join(r["text"] + "\n" for r in rows).encode(), cwd=ROOT, env=env(), capture_output=True, timeout=300,
    )  # fmt: skip
    assert lines.returncode == 0, lines.stderr.decode()[-2000:]
    got = [
        (r["row"], r["predicted"], r["p_dialogue"])
        for r in map(json.loads, (tmp_path / "stdin.jsonl").read_text().splitlines())
    ]
    assert got == want


def test_bad_rows_are_counted_and_named_and_the_rest_classified(kept, tmp_path, capsys):
    clf = kept[1]["classifier"]
    good = botchan_sentences()[:3]
    src = tmp_path / "mixed.jsonl"
    src.write_bytes(
        b"\n".join(
            [
                json.dumps({"text": good[0]}).encode(),
                b'{"text": "   "}',
                b"not json at all",
                json.dumps({"body": good[1]}).encode(),
                b'{"text": "caf\xe9"}',  # Latin-1, not UTF-8
                b"[1, 2]",
                json.dumps({"text": 17}).encode(),
                json.dumps({"text": good[2]}).encode(),
            ]
        )
        + b"\n"
    )
    out = tmp_path / "labels.parquet"
    assert classify("--classifier", clf, "--input", src, "--output", out, "--chunk-rows", "3") == 0
    said = capsys.readouterr().out
    assert "6 bad rows skipped: row 2 (empty text), row 3 (not JSON" in said
    for piece in ("row 4 (no 'text')", "row 5 (invalid UTF-8)", "row 6 (a JSON list, not an object)",
                  "row 7 ('text' is int, not text)"):  # fmt: skip
        assert piece in said, said
    import pyarrow.parquet as pq

    table = pq.read_table(out)
    assert table.column("row").to_pylist() == [1, 8] and table.schema.field("p_dialogue").type == "float"
    short = tmp_path / "short.csv"
    short.write_text('id,text\na,"fine text here"\nb\nc,"more text",extra\n', encoding="utf-8")
    assert (
        classify("--classifier", clf, "--input", short, "--output", tmp_path / "s.csv", "--keep-fields", "id")
        == 0
    )
    said = capsys.readouterr().out
    assert (
        "2 bad rows skipped: row 2 (1 fields, the header has 2), row 3 (3 fields, the header has 2)" in said
    )
    assert [(r["row"], r["id"]) for r in read_csv(tmp_path / "s.csv")] == [("1", "a")]


def test_features_out_are_what_transfer_reads(kept, tmp_path):
    """--features-out: the classifier's features of each text, as app/transfer.py featurized them; with
    --checkpoint, the language model's features of any kind (OpenAI's `transform`)."""
    import torch

    from app.checkpoints.loader import open_source
    from app.classifier.features import token_ids
    from app.probing.features import featurize_sets

    root, res = kept
    rows = dialogue_rows(botchan_sentences()[1000:1100])
    src = write_rows(tmp_path / "in.csv", rows)
    feats = tmp_path / "f.npy"
    assert classify("--classifier", res["classifier"], "--input", src, "--features-out", feats) == 0
    lm = open_source(root / "run")
    model, tok = lm.load_model(), lm.tokenizer()
    ids = token_ids(tok, [r["text"] for r in rows])
    with torch.no_grad():
        want = featurize_sets(model, ids, [1], 16384, tok.pad_id).features
    np.testing.assert_allclose(np.load(feats), want[res["features"]], rtol=1e-5, atol=1e-6)
    again = tmp_path / "g.npy"
    args = ("--checkpoint", root / "run", "--features", "mean_hidden", "--layer", "0,1", "--input", src)
    assert classify(*args, "--features-out", again, "--chunk-rows", "7") == 0
    with torch.no_grad():
        want = featurize_sets(model, ids, [0, 1], 16384, tok.pad_id).features["mean_hidden"]
    np.testing.assert_allclose(np.load(again), want, rtol=1e-5, atol=1e-6)


def launch(nprocs: int, *args, extra_env: dict | None = None) -> subprocess.CompletedProcess:
    p = run(
        deepspeed_cmd(nprocs, "app/classify.py", [str(a) for a in args]), extra_env=extra_env, timeout=600
    )
    assert p.returncode == 0, (p.stdout + p.stderr)[-4000:]
    return p


def one_process(*args) -> subprocess.CompletedProcess:
    """python app/classify.py in a process of its own, with the launches' environment (tests/launcher.py: one
    thread and one matmul kernel a process, so separate processes compare bit for bit; README "Failures")."""
    p = run([sys.executable, "app/classify.py", *map(str, args)], timeout=600)
    assert p.returncode == 0, (p.stdout + p.stderr)[-4000:]
    return p


@pytest.fixture(scope="module")
def big_input(kept):
    """600 sentences (three bad rows among them) as CSV, in chunks of 32 rows: 19 parts."""
    root, _ = kept
    rows = dialogue_rows(botchan_sentences()[:600])
    for i in (5, 300, 599):
        rows[i]["text"] = " "
    return write_rows(root / "big.csv", rows)


@pytest.fixture(scope="module")
def one_rank(kept, big_input, tmp_path_factory):
    """The 1-process output of big_input: labels (Parquet) and features."""
    out = tmp_path_factory.mktemp("one")
    args = (
        "--classifier",
        kept[1]["classifier"],
        "--input",
        big_input,
        "--chunk-rows",
        "32",
        "--keep-fields",
        "id",
    )
    one_process(*args, "--output", out / "labels.parquet", "--features-out", out / "f.npy")
    return args, out


def test_two_ranks_write_the_bytes_one_rank_writes(one_rank, tmp_path):
    args, one = one_rank
    p = launch(2, *args, "--output", tmp_path / "labels.parquet", "--features-out", tmp_path / "f.npy")
    assert "(2 ranks)" in p.stdout and "3 bad rows skipped: row 6 (empty text), row 301" in p.stdout
    for name in ("labels.parquet", "f.npy"):
        assert (tmp_path / name).read_bytes() == (one / name).read_bytes(), name
    import pyarrow.parquet as pq

    assert pq.read_table(one / "labels.parquet").column("id").to_pylist()[:3] == ["s0", "s1", "s2"]


def test_a_killed_run_rerun_writes_the_uninterrupted_bytes_and_draws_a_bar(one_rank, tmp_path):
    """The process stops after its 3rd part (MLSTM_DS_FAULTS) and is SIGKILLed; the same command again skips
    the parts written and gives the bytes of the uninterrupted run. stderr a terminal: a progress bar."""
    import fcntl
    import pty
    import struct
    import termios

    args, one = one_rank
    outs = ("--output", tmp_path / "labels.parquet", "--features-out", tmp_path / "f.npy")
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))  # a terminal 100 columns wide
    cmd = [sys.executable, "app/classify.py", *map(str, args), *map(str, outs)]
    p = subprocess.Popen(cmd, cwd=ROOT, env=env(MLSTM_DS_FAULTS="hang_after_part=3"), stdout=subprocess.PIPE,
                         stderr=slave, start_new_session=True)  # fmt: skip
    os.close(slave)
    parts, err, deadline = tmp_path / "labels.parquet.parts", b"", time.time() + 300
    os.set_blocking(master, False)
    while len(list(parts.glob("part-*.json"))) < 3 and p.poll() is None and time.time() < deadline:
        try:
            err += os.read(master, 1 << 16)
        except (BlockingIOError, OSError):
            time.sleep(0.2)
    time.sleep(1)  # the bar's redraw after the 3rd part
    with contextlib.suppress(BlockingIOError, OSError):
        err += os.read(master, 1 << 16)
    os.killpg(p.pid, signal.SIGKILL)
    p.wait()
    os.close(master)
    assert len(list(parts.glob("part-*.json"))) == 3 and not (tmp_path / "labels.parquet").exists()
    assert re.search(rb"classify: \d+text", err), err[-500:]  # tqdm's bar, texts counted
    again = one_process(*args, *outs)
    assert "3 of 19 chunks from an earlier run" in again.stdout, again.stdout
    for name in ("labels.parquet", "f.npy"):
        assert (tmp_path / name).read_bytes() == (one / name).read_bytes(), name
    assert not parts.exists()


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--output", "x.txt"], "--output x.txt: the suffix says the format"),
        (["--checkpoint", "RUN"], "give --classifier (labels) or --checkpoint"),
        (["--keep-fields", "nope"], "no column 'nope' (--keep-fields)"),
        (["--keep-fields", "predicted"], "--keep-fields predicted: the output writes a column of that name"),
        (["--text-field", "body"], "no column 'body' (--text-field)"),
        (["--classifier", "RUN"], "not a classifier folder"),
        (["--chunk-rows", "0"], "--chunk-rows must be >= 1"),
        (["--input-format", "parquet", "--input", "-"], "stdin can be csv, jsonl or lines"),
    ],
)
def test_bad_requests_are_one_line(kept, tmp_path, capsys, argv, needle):
    root, res = kept
    src = write_rows(tmp_path / "in.csv", [{"text": "a text", "predicted": "x"}])
    base = {"--classifier": res["classifier"], "--input": str(src), "--output": str(tmp_path / "o.csv")}
    for flag, value in zip(argv[::2], argv[1::2]):
        base[flag] = value.replace("RUN", str(root / "run"))
    args = [a for kv in base.items() for a in kv]
    assert classify(*args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and needle in err[0], err


@pytest.mark.gpu
def test_on_a_gpu_transfer_fine_tunes_and_one_launched_rank_labels_as_the_cpu_does(kept, tmp_path):
    """Issue 40 on a GPU: app/transfer.py --device cuda featurizes, probes and fine-tunes there, and probes
    as --device cpu does; the CPU's kept probe, run by `deepspeed --num_gpus 1 app/classify.py --device
    cuda`, gives the CPU run's labels and probabilities (fp32 on both: the Triton core, the fused CPU op).
    The launched rank sees the GPU although this suite hides it from what it launches
    (`_cpu_for_launched_processes`): DeepSpeed's launch.py sets CUDA_VISIBLE_DEVICES for its ranks."""
    root, _ = kept
    args = ["--checkpoint", str(root / "run"), "--train", str(root / "train.csv"), "--test"]
    args += [str(root / "test.jsonl"), "--finetune-epochs", "1", "--heatmap-texts", "0"]
    res = {}
    for dev in ("cpu", "cuda"):
        assert transfer_main([*args, "--out", str(tmp_path / dev), "--device", dev]) == 0
        res[dev] = json.loads((tmp_path / dev / "transfer.json").read_text())
        assert res[dev]["featurize"]["device"] == dev and res[dev]["finetune"]["epochs"] == 1
    assert abs(res["cuda"]["test_accuracy"] - res["cpu"]["test_accuracy"]) <= 2 / 240  # features to rounding
    flags = (
        "--classifier",
        res["cpu"]["classifier"],
        "--input",
        root / "test.jsonl",
        "--keep-fields",
        "label",
    )
    assert classify(*flags, "--output", tmp_path / "cpu.csv", "--device", "cpu") == 0
    p = launch(1, *flags, "--output", tmp_path / "gpu.csv", "--device", "cuda")
    assert "classified 240 texts" in p.stdout
    cpu, gpu = read_csv(tmp_path / "cpu.csv"), read_csv(tmp_path / "gpu.csv")
    labels = [k[2:] for k in cpu[0] if k.startswith("p_")]
    pc = np.asarray([[float(r[f"p_{k}"]) for k in labels] for r in cpu])
    pg = np.asarray([[float(r[f"p_{k}"]) for k in labels] for r in gpu])
    np.testing.assert_allclose(pg, pc, atol=1e-3)
    clear = np.abs(pc[:, 0] - 0.5) > 1e-2  # a label can only flip where the two probabilities straddle 0.5
    assert clear.sum() > 200
    assert [r["predicted"] for r, c in zip(gpu, clear) if c] == [
        r["predicted"] for r, c in zip(cpu, clear) if c
    ]
