"""Resume under another layout (app/checkpoints/universal.py): the optimizer state comes along.

The reference run (P = 2 stages, ZeRO-1, tests/conftest.py) resumed from its step-6 checkpoint as one
plain process (P = 1): step 7's loss shows the weights came back, step 8's loss and step 7's gradient norm
(after an Adam update that uses the moments and the lr schedule of the P = 2 run) that the optimizer state
did; both equal the uninterrupted P = 2 run's within fp32 rounding (the stages sum in another order).
"""

from __future__ import annotations

import shutil

import pytest
from launcher import ROOT, metrics, train, train_one_process


@pytest.mark.slow
def test_a_pp2_run_resumes_as_p1_with_its_optimizer_state(reference_run, prepared_dir, tmp_path):
    out = tmp_path / "p1"
    shutil.copytree(reference_run[0], out)
    p = train_one_process(prepared_dir, out, "--max-steps", "8", "--resume", "step_00000006", "--eval-every", "4",
                          "--save-every", "3", "--keep-last", "2", "--wandb-mode", "disabled")  # fmt: skip
    assert p.returncode == 0, p.stderr[-3000:]
    assert "step_00000006 at step 6" in p.stderr and "re-sliced for this one" in p.stderr, p.stderr[-3000:]
    ref = {m["step"]: m for m in metrics(reference_run[0]) if "train/loss" in m}
    got = {m["step"]: m for m in metrics(out) if "train/loss" in m}
    for step in (7, 8):
        for key in ("train/loss", "train/grad_norm", "train/lr"):
            assert got[step][key] == pytest.approx(ref[step][key], rel=1e-6, abs=1e-7), (step, key)
    assert not (out / "checkpoints" / "universal").exists(), "the converted copy outlived the resume"


@pytest.mark.slow
def test_a_pp2_run_resumes_on_two_ranks_with_half_the_accumulation(reference_run, prepared_dir, tmp_path):
    """The cluster case: a P = 2 x DP = 1 run (accumulation 4) resumed as P = 1 x DP = 2 with accumulation 2, the
    same 4 micro-batches a step, needs no --allow-data-change and repeats the uninterrupted run's steps."""
    out = tmp_path / "dp2"
    shutil.copytree(reference_run[0], out)
    cfg = tmp_path / "zero2.yaml"
    cfg.write_text(f"deepspeed: {ROOT / 'ds_configs' / 'cpu_zero2.json'}\ngrad_accum: 2\n")
    p = train(2, prepared_dir, out, "--config", str(cfg), "--max-steps", "8", "--resume", "step_00000006",
              "--eval-every", "4", "--save-every", "3", "--keep-last", "2", "--wandb-mode", "disabled",
              stages=1, config=None, check=False)  # fmt: skip
    assert p.returncode == 0, p.stderr[-3000:]
    assert "step_00000006 at step 6" in p.stderr and "re-sliced for this one" in p.stderr, p.stderr[-3000:]
    ref = {m["step"]: m for m in metrics(reference_run[0]) if "train/loss" in m}
    got = {m["step"]: m for m in metrics(out) if "train/loss" in m}
    for step in (7, 8):
        for key in ("train/loss", "train/grad_norm"):
            assert got[step][key] == pytest.approx(ref[step][key], rel=2e-5, abs=2e-5), (step, key)
