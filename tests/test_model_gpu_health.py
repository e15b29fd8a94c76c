"""app/model/gpu_health.py and the kernels' poison path: a persistent launch whose grid barrier gave up leaves NaN
in every output tile its programs own and its flag set; the host reads the flags where it already waits, drops
the loop from its ranking in one line, and an inference batch is run again. The poison path runs in Triton's
interpreter (tests/triton_checks.py poison); the flags' bookkeeping runs here on CPU tensors; and the app's own
paths (the trainer; evaluate, generate and classify in the `long` tier) run in the interpreter with the fault
injected (MLSTM_DS_FAULTS=barrier_timeout=N), against the same work without it."""

from __future__ import annotations

import json
import sys

import pytest
import torch
from test_model_triton_core import _check

from app.model import gpu_health


@pytest.fixture(scope="module")
def poisoned(tmp_path_factory) -> dict:
    return _check("poison", tmp_path_factory.mktemp("poison"), TRITON_INTERPRET="1", MLSTM_MATMUL="mm")


@pytest.mark.parametrize("case", ["persistent/fwd", "persistent/bwd", "splitk/bwd"])
def test_a_launch_whose_barrier_gave_up_poisons_every_tile_its_programs_own(poisoned, case):
    """`failed` pre-set: the kernel runs whole (every barrier returns at once), then each of its 3 programs
    writes NaN into every tile it owns, at every step: every element of every output is NaN (they were 7.0),
    the initial state is left alone, and the flag stays set for the host to read."""
    r = poisoned[case]
    assert r["programs"] == 3 and all(n > r["programs"] for n in r["tiles"]), r  # each owns several tiles
    assert r["nan"] and all(v == 1.0 for v in r["nan"].values()), r["nan"]
    assert not any(r["inputs_nan"]) and r["flag"][1] == 1, r


class _Loop:
    def __init__(self, name: str) -> None:
        self.name = name


@pytest.fixture
def clean(monkeypatch):
    for name in ("_flags", "_slots", "_owners"):
        monkeypatch.setattr(gpu_health, name, {})


def test_a_set_flag_drops_its_loop_from_its_ranking_in_one_line(clean, caplog):
    persistent, splitk, cublas = _Loop("persistent"), _Loop("splitk"), _Loop("cublas")
    fwd, bwd = [persistent, cublas], [splitk, persistent, cublas]
    words = [gpu_health.flag(torch.device("cpu"), r, r[0], f"{d} loop {r[0].name} at B16 H8")
             for r, d in ((fwd, "forward"), (bwd, "backward"))]  # fmt: skip
    assert gpu_health.active() and gpu_health.check() == []  # nothing set: nothing said
    words[1][1] = 1  # the backward's barrier gave up
    with caplog.at_level("WARNING", logger="app.model.gpu_health"):
        lines = gpu_health.check()
    assert len(lines) == 1 and "backward loop splitk at B16 H8 on cpu" in lines[0], lines
    assert (
        "the persistent loop runs it from now on" in lines[0] and [r.message for r in caplog.records] == lines
    )
    assert bwd == [persistent, cublas] and fwd == [persistent, cublas]  # only the failed loop left
    assert gpu_health.check() == []  # the flag was cleared


def test_the_flags_grow_past_their_first_rows_and_keep_what_is_set(clean):
    rankings = [[_Loop("persistent")] for _ in range(gpu_health.SLOTS + 3)]
    gpu_health.flag("cpu", rankings[0], rankings[0][0], "forward loop persistent at B0")
    gpu_health.flag("cpu", rankings[1], rankings[1][0], "forward loop persistent at B1")
    gpu_health.flag("cpu", rankings[2], rankings[2][0], "forward loop persistent at B2")[1] = (
        1  # set, then grown
    )
    for i, r in enumerate(rankings[3:], 3):
        gpu_health.flag("cpu", r, r[0], f"forward loop persistent at B{i}")
    assert gpu_health._flags[torch.device("cpu")].shape[0] > gpu_health.SLOTS
    lines = gpu_health.check()
    assert len(lines) == 1 and "at B2 on cpu" in lines[0] and rankings[2] == [], lines
    assert "no other loop is left" in lines[0]


def test_an_inference_batch_in_which_a_loop_failed_is_run_again(clean):
    ranking = [_Loop("persistent"), _Loop("cublas")]
    word = gpu_health.flag("cpu", ranking, ranking[0], "forward loop persistent at B16 H8")
    calls = []

    def batch() -> int:
        calls.append(ranking[0].name)
        if len(calls) == 1:
            word[1] = 1  # the first run's barrier gave up
        return len(calls)

    assert gpu_health.checked(batch) == 2 and calls == ["persistent", "cublas"]
    assert gpu_health.checked(batch) == 3  # a healthy batch: run once


def test_checked_reads_nothing_without_a_barrier_loop(clean, monkeypatch):
    monkeypatch.setattr(gpu_health, "check", lambda: pytest.fail("read flags that do not exist"))
    assert gpu_health.checked(lambda: 5) == 5


def test_an_evaluation_batch_is_redone_only_when_its_loss_is_not_finite_on_a_gpu(clean, monkeypatch):
    """Every rank sees the same summed loss, so every rank decides the same: a NaN batch on a GPU (or the
    interpreter) is run once more, a finite one never, and on the CPU's own cores never."""
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert gpu_health.redo(float("nan"), torch.device("cuda")) is True
    assert gpu_health.redo(float("inf"), "cuda:0") is True
    assert gpu_health.redo(3.0, torch.device("cuda")) is False
    assert gpu_health.redo(float("nan"), torch.device("cpu")) is False
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert gpu_health.redo(float("nan"), torch.device("cpu")) is True


def test_the_old_host_wait_is_an_environment_switch(monkeypatch):
    monkeypatch.delenv("MLSTM_BARRIER_HOST_WAIT", raising=False)
    assert gpu_health.host_wait() is False
    monkeypatch.setenv("MLSTM_BARRIER_HOST_WAIT", "1")
    assert gpu_health.host_wait() is True


# ---- the app's own paths in Triton's interpreter, a persistent launch made to give up. A loop is checked before
# its first run each way (gpu_tuning.run), a launch each: step 1 is launches 1-4 (check and run, forward and
# backward), step 2's forward launch 5; an inference's first run is launch 2

INTERPRETED = {"TRITON_INTERPRET": "1"}
TINY_MODEL = ["--model-config", "debug", "model.hidden_dim=16", "model.embed_dim=16", "model.num_layers=1"]


@pytest.fixture(scope="module")
def tiny_runs(tmp_path_factory) -> dict:
    """Byte data of 16-token pieces from 4 KB of the novel, and two 4-step trainings of a 16-wide model
    (one process, ZeRO-2 fp32, micro-batch 4): in the interpreter with the 5th persistent launch's barrier
    made to give up (step 2's forward), and on the CPU's own fused core with step 2's loss made NaN. (About a
    minute on an idle 2-core machine: the interpreter runs each program of each step in Python.)"""
    from launcher import ROOT, metrics, run

    from data_prep.cli import main as prep_main

    tmp = tmp_path_factory.mktemp("health")
    text = (ROOT / "tests" / "fixtures" / "corpora" / "botchan.txt").read_bytes()[2000:6000]
    (tmp / "text.txt").write_bytes(text)
    argv = ["--input", str(tmp / "text.txt"), "--out", str(tmp / "data"), "--tokenizer", "byte",
            "--max-seq-len", "16", "--val-fraction", "0.1", "--quiet", "--num-proc", "1"]  # fmt: skip
    assert prep_main(argv) == 0
    out: dict = {"tmp": tmp}
    for name, env in (("poisoned", {**INTERPRETED, "MLSTM_DS_FAULTS": "barrier_timeout=5"}),
                      ("nan_step", {"MLSTM_DS_FAULTS": "nan_step=2"})):  # fmt: skip
        args = ["--deepspeed_config", str(ROOT / "ds_configs" / "cpu_zero2.json"), "--data", str(tmp / "data"),
                "--out", str(tmp / name), "--pipeline-stages", "1", *TINY_MODEL, "--micro-batch", "4",
                "--grad-accum", "1", "--max-steps", "4", "--warmup-steps", "1", "--eval-every", "0",
                "--sanity-eval-batches", "0", "--progress", "false", "--plots", "false", "--log-every", "1",
                "--wandb-mode", "disabled", "--samples", "0"]  # fmt: skip
        p = run([sys.executable, str(ROOT / "app" / "train.py"), *args], env, timeout=600)
        assert p.returncode == 0, p.stderr[-4000:]
        out[name] = (p, {m["step"]: m for m in metrics(tmp / name) if "train/loss" in m})
    return out


def _health_lines(stderr: str) -> list[str]:
    return [ln for ln in stderr.splitlines() if "grid barrier gave up" in ln]


@pytest.mark.long  # a training run in Triton's interpreter: the poison path itself is checked above
def test_the_trainer_skips_a_poisoned_step_as_a_nan_step_and_names_the_loop(tiny_runs):
    """Step 2's forward ran a loop whose barrier gave up: its loss is NaN, the trainer's non-finite rule skips
    it (DeepSpeed applied no update), one warning line names the loop, and the run goes on with the next loop:
    every loss and the final validation equal those of the run whose step 2 was made NaN on purpose."""
    p, recs = tiny_runs["poisoned"]
    _, want = tiny_runs["nan_step"]
    lines = _health_lines(p.stderr)
    assert len(lines) == 1 and "mLSTM GPU forward loop persistent" in lines[0], lines
    assert "the cublas loop runs it from now on" in lines[0]
    assert "step 2: non-finite loss/gradient" in p.stderr and "Traceback" not in p.stderr
    assert [recs[s]["train/skipped_steps"] for s in (1, 2, 3, 4)] == [0, 1, 1, 1]
    for s in (1, 3, 4):
        assert recs[s]["train/loss"] == pytest.approx(want[s]["train/loss"], rel=1e-5), s


@pytest.mark.long
def test_evaluate_redoes_a_poisoned_batch_and_names_the_loop(tiny_runs):
    """app/evaluate.py --text --stream in the interpreter, the first run's persistent launch made to give up: the same
    bits/byte (static and stream) as the CPU's own core, and one warning line naming the loop."""
    from launcher import ROOT, run

    tmp = tiny_runs["tmp"]
    (tmp / "short.txt").write_bytes(
        (ROOT / "tests" / "fixtures" / "corpora" / "botchan.txt").read_bytes()[240:300]
    )
    got = {}
    for name, env in (("poisoned", {**INTERPRETED, "MLSTM_DS_FAULTS": "barrier_timeout=2"}), ("cpu", {})):
        args = ["--checkpoint", str(tmp / "poisoned"), "--text", str(tmp / "short.txt"), "--text-chunk-len", "16",
                "--stream", "--out", str(tmp / f"eval_{name}.json")]  # fmt: skip
        p = run([sys.executable, str(ROOT / "app" / "evaluate.py"), *args], env, timeout=600)
        assert p.returncode == 0, p.stderr[-4000:]
        got[name] = (p, json.loads((tmp / f"eval_{name}.json").read_text()))
    lines = _health_lines(got["poisoned"][0].stderr)
    assert len(lines) == 1 and "forward loop persistent" in lines[0], lines
    keys = ("loss", "bits/byte", "stream loss", "stream bits/byte")
    (a,), (b,) = (got[n][1]["texts"] for n in ("poisoned", "cpu"))
    assert [a[k] for k in keys] == pytest.approx([b[k] for k in keys], rel=1e-5), (a, b)


@pytest.mark.long
def test_generate_redoes_a_poisoned_prefill_and_names_the_loop(tiny_runs):
    """app/generate.py in the interpreter: the prompt's prefill made to give up is read again, and the text is
    the one the same seed gives without the fault; one warning line."""
    from launcher import ROOT, run

    tmp = tiny_runs["tmp"]
    args = [
        "--checkpoint",
        str(tmp / "poisoned"),
        "--prompt",
        "The school",
        "--max-new-tokens",
        "8",
        "--seed",
        "3",
    ]
    runs = {name: run([sys.executable, str(ROOT / "app" / "generate.py"), *args], env, timeout=600)
            for name, env in (("poisoned", {**INTERPRETED, "MLSTM_DS_FAULTS": "barrier_timeout=2"}),
                              ("healthy", INTERPRETED))}  # fmt: skip
    assert all(p.returncode == 0 for p in runs.values()), runs["poisoned"].stderr[-3000:]
    assert runs["poisoned"].stdout == runs["healthy"].stdout and runs["poisoned"].stdout.startswith(
        "The school"
    )
    lines = _health_lines(runs["poisoned"].stderr)
    assert (
        len(lines) == 1
        and "forward loop persistent" in lines[0]
        and not _health_lines(runs["healthy"].stderr)
    )


@pytest.mark.long
def test_classify_redoes_a_poisoned_batch_and_names_the_loop(tiny_runs):
    """app/classify.py --checkpoint --features-out in the interpreter, the first run's persistent launch made to give
    up: the features the CPU's own core gives, and one warning line."""
    import numpy as np
    from launcher import ROOT, run

    tmp = tiny_runs["tmp"]
    (tmp / "texts.txt").write_text("a short line\nanother, longer line of text\nthe third\n")
    feats = {}
    for name, env in (("poisoned", {**INTERPRETED, "MLSTM_DS_FAULTS": "barrier_timeout=2"}), ("cpu", {})):
        args = ["--checkpoint", str(tmp / "poisoned"), "--input", str(tmp / "texts.txt"), "--features-out",
                str(tmp / f"f_{name}.npy"), "--features", "mean_hidden"]  # fmt: skip
        p = run([sys.executable, str(ROOT / "app" / "classify.py"), *args], env, timeout=600)
        assert p.returncode == 0, p.stderr[-4000:]
        feats[name] = (p, np.load(tmp / f"f_{name}.npy"))
    lines = _health_lines(feats["poisoned"][0].stderr)
    assert len(lines) == 1 and "forward loop persistent" in lines[0], lines
    got, want = feats["poisoned"][1], feats["cpu"][1]
    assert got.shape == want.shape == (3, 16) and np.isfinite(got).all()
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()
