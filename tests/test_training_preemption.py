"""Preemption (app/training/preemption.py): real signals to real `deepspeed` launches (CPU, gloo).

One run, two launches, against the reference run's settings (tests/conftest.py; the
signals land between its saves, every 3 steps):
1. SIGTERM to the `deepspeed` runner alone (what `kill` or a scheduler sends it) while both ranks wait after
   step 2: the launcher watch passes it on, every rank saves step 2 and stops with one line;
2. the rerun resumes from 2; SIGUSR1 to rank 1 alone after step 5 (Slurm's `--signal=USR1@...` reaches
   every task; here one rank is enough) while rank 0 has gone on into the next step's agreement: both save
   step 5 and the job exits 75; the steps in between repeat the uninterrupted run's losses bit for bit.
"""

from __future__ import annotations

import os
import signal
import subprocess

import pytest
from conftest import REF_STEPS
from launcher import ROOT, deepspeed_cmd, env, train_args, train_losses
from test_multinode import REF_ARGS, alive, rank_pids, wait_until

from app.training.preemption import EXIT_PREEMPTED

pytestmark = [pytest.mark.cluster, pytest.mark.slow]  # real signals, waited for on the clock

PREEMPTED = "preempted ("


def _latest(out) -> str:
    return (out / "checkpoints" / "latest").read_text().strip()


def test_signals_save_the_step_reached_and_a_rerun_loses_nothing(reference_run, prepared_dir, tmp_path):
    out = tmp_path / "preempted"
    args = train_args(prepared_dir, out, "--max-steps", REF_STEPS, *REF_ARGS, "--wandb-mode", "disabled")
    # 1. SIGTERM to the runner only: launch.py and the ranks are its descendants and get no signal from it
    log = tmp_path / "launch1.log"
    p = subprocess.Popen(deepspeed_cmd(2, "app/train.py", args, runner=True), cwd=ROOT, env=env(MLSTM_DS_FAULTS="await_signal_after=2"),
                         stdout=subprocess.DEVNULL, stderr=log.open("w"), start_new_session=True)  # fmt: skip
    try:
        wait_until(lambda: 2 in train_losses(out) and len(rank_pids(out)) == 2, 240, "step 2", p)
        ranks = rank_pids(out)
        p.send_signal(signal.SIGTERM)
        p.wait(timeout=30)
        wait_until(lambda: not any(alive(pid) for pid in ranks.values()), 120, "the ranks to save and exit")
    finally:
        if any(alive(pid) for pid in rank_pids(out).values()):
            os.killpg(p.pid, signal.SIGKILL)
    text = log.read_text()
    assert max(train_losses(out)) == 2 and _latest(out) == "step_00000002", text[-4000:]
    lines = [ln for ln in text.splitlines() if PREEMPTED in ln]
    assert len(lines) == 1 and "(SIGTERM) after step 2" in lines[0], text[-4000:]
    assert "Traceback" not in text, text[-4000:]
    # 2. SIGUSR1 to rank 1 alone; rank 0 waits for it in the step's agreement
    log = tmp_path / "launch2.log"
    p = subprocess.Popen(deepspeed_cmd(2, "app/train.py", args), cwd=ROOT,
                         env=env(MLSTM_DS_FAULTS="await_signal_after=5,hang_rank=1"),
                         stdout=subprocess.DEVNULL, stderr=log.open("w"), start_new_session=True)  # fmt: skip
    try:
        wait_until(lambda: 5 in train_losses(out) and len(rank_pids(out)) == 2, 240, "step 5", p)
        os.kill(rank_pids(out)[1], signal.SIGUSR1)
        rc = p.wait(timeout=120)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    text = log.read_text()
    assert "resumed from" in text and "step_00000002 at step 2" in text, text[-4000:]
    assert rc == EXIT_PREEMPTED, text[-4000:]
    assert max(train_losses(out)) == 5 and _latest(out) == "step_00000005", text[-4000:]
    lines = [ln for ln in text.splitlines() if PREEMPTED in ln]
    assert len(lines) == 1 and "(SIGUSR1) after step 5" in lines[0], text[-4000:]
    # the steps after the first stop repeat the uninterrupted run's: resumed from the preemption's checkpoint
    ref = train_losses(reference_run[0])
    assert train_losses(out) == {k: v for k, v in ref.items() if k <= 5}, "the resumed run diverged"
