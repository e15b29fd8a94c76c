"""app/classifying/run.py: the walk's frictions. Ctrl-C is one line saying how to resume (a real SIGINT to
the process group, as a terminal sends it), and the rerun resumes; a rank stops when the `deepspeed`
launcher that started it is killed (kill -9: the real runner, one rank); one long text streams through in
pieces with its progress said as it goes."""

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
import pytest
from launcher import ROOT, deepspeed_cmd, env, run
from test_classifying_inputs import cheap_classifier, classify, said_lines, texts


@pytest.fixture(scope="module")
def clf(tmp_path_factory):
    return cheap_classifier(tmp_path_factory.mktemp("run"), ["neg", "pos"])


def many_texts(path, n: int):
    sentences = texts(200)
    path.write_text("".join(sentences[i % len(sentences)] + "\n" for i in range(n)), encoding="utf-8")
    return path


def _ctrl_c_as_on_a_terminal() -> None:
    """The child starts with SIGINT's default action, as a command typed at a terminal does: a suite started
    in the background (`nohup ... &`, a CI runner) has SIGINT ignored, which every child inherits, and Python
    then leaves it ignored."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_is_one_line_that_says_how_to_resume(clf, tmp_path):
    src = many_texts(tmp_path / "in.txt", 200)
    out = tmp_path / "labels.csv"
    args = [
        sys.executable,
        "app/classify.py",
        "--classifier",
        str(clf),
        "--input",
        str(src),
        "--chunk-rows",
        "20",
    ]
    p = subprocess.Popen([*args, "--output", str(out)], cwd=ROOT, env=env(MLSTM_DS_FAULTS="hang_after_part=2", PYTHONFAULTHANDLER="1"),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                         preexec_fn=_ctrl_c_as_on_a_terminal)  # fmt: skip
    parts, t0 = tmp_path / "labels.csv.parts", time.monotonic()
    while len(list(parts.glob("part-*.json"))) < 2 and p.poll() is None and time.monotonic() < t0 + 600:
        time.sleep(0.1)
    seen = sorted(q.name for q in parts.glob("*")) if parts.is_dir() else []
    assert len([n for n in seen if n.startswith("part-") and n.endswith(".json")]) >= 2, (
        f"after {time.monotonic() - t0:.1f} s, exit status {p.poll()}: {seen} in {parts}; "
        f"{sorted(q.name for q in tmp_path.iterdir())} in {tmp_path}"
    )
    os.killpg(p.pid, signal.SIGINT)  # what Ctrl-C on a terminal does: the whole foreground group
    try:
        _, err = p.communicate(timeout=120)
    except subprocess.TimeoutExpired:  # every thread's stack (faulthandler on SIGABRT) and the signal masks
        status = [ln for ln in Path(f"/proc/{p.pid}/status").read_text().splitlines() if ln.startswith("Sig")]
        os.kill(p.pid, signal.SIGABRT)
        err = p.communicate(timeout=60)[1]
        pytest.fail(f"classify did not stop within 120 s of Ctrl-C: {status}\n{err[-6000:]}")
    assert p.returncode == 130, err[-3000:]
    lines = said_lines(err)
    assert lines == [
        f"classify: interrupted (Ctrl-C); 2 classified chunks are kept in {parts}: run the same command again "
        "to continue from them"
    ], err[-3000:]
    again = run([*args, "--output", str(out)], timeout=600)
    assert again.returncode == 0 and "2 of 10 chunks from an earlier run" in again.stdout, again.stdout


def test_a_rank_stops_when_its_launcher_is_killed(clf, tmp_path):
    """kill -9 of the `deepspeed` runner: its one rank is stopped (SIGTERM from the launcher watch) within
    seconds and never writes the output."""
    src = many_texts(tmp_path / "in.txt", 3000)
    out = tmp_path / "labels.csv"
    args = ["--classifier", str(clf), "--input", str(src), "--chunk-rows", "20", "--output", str(out)]
    cmd = deepspeed_cmd(1, "app/classify.py", args, runner=True)
    p = subprocess.Popen(cmd, cwd=ROOT, env=env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         start_new_session=True)  # fmt: skip
    parts, deadline = tmp_path / "labels.csv.parts", time.time() + 600
    while not list(parts.glob("part-*.json")) and p.poll() is None and time.time() < deadline:
        time.sleep(0.1)
    assert p.poll() is None, "the launch ended before it could be killed"
    os.kill(p.pid, signal.SIGKILL)  # the launcher only
    p.wait()

    def ranks() -> list[str]:
        found = subprocess.run(["pgrep", "-f", f"classify.py.*{out}"], capture_output=True, text=True)
        return found.stdout.split()

    deadline = time.time() + 60
    while ranks() and not out.exists() and time.time() < deadline:
        time.sleep(0.2)
    left = ranks()
    for pid in left:  # a test never leaves a process behind
        os.kill(int(pid), signal.SIGKILL)
    assert not left and not out.exists(), (
        f"ranks {left} outlived the launcher; output written: {out.exists()}"
    )


def test_one_long_text_streams_in_pieces_and_says_how_far_it_is(clf, tmp_path, capsys, monkeypatch):
    """A 60,000-byte text through --batch-tokens 1024: its features are the whole text's (the state carried
    from piece to piece), and the progress line, every heartbeat, counts its tokens while it is read."""
    import torch

    from app.checkpoints.loader import open_source
    from app.classifier.features import batch_feature_sets, token_ids

    monkeypatch.setenv("MLSTM_HEARTBEAT_S", "0.2")
    rng = np.random.default_rng(0)
    words = " ".join(rng.choice(texts(50)) for _ in range(2000))[:60_000]
    src, feats = tmp_path / "long.jsonl", tmp_path / "f.npy"
    src.write_text(json.dumps({"text": words}) + "\n", encoding="utf-8")
    assert (
        classify("--classifier", clf, "--input", src, "--features-out", feats, "--batch-tokens", "1024") == 0
    )
    said = capsys.readouterr().err
    counts = [int(c.replace(",", "")) for c in re.findall(r"classify: \d+ s so far, ([\d,]+) tokens", said)]
    read = sorted({c for c in counts if c})  # tokens read by each line's time, the first line's maybe none
    assert len(read) >= 2 and counts == sorted(counts) and read[-1] <= 60_001, said[-2000:]
    lm = open_source(clf)
    model, tok = lm.load_model(), lm.tokenizer()
    ids = torch.as_tensor(token_ids(tok, [words])[0])[None]
    with torch.no_grad():
        want = batch_feature_sets(model, ids, torch.tensor([ids.shape[1]]), [1])["final_cell"].numpy()
    np.testing.assert_allclose(np.load(feats), want, rtol=1e-4, atol=1e-6)
