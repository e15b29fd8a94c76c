"""`sbatch launch/slurm_train.sbatch` on a real single-node Slurm (slurmctld + slurmd + munged, tests/cluster.py).

DeepSpeed's `--launcher slurm` starts one srun task per rank; each must learn its rank from Slurm, so the
job trains as one world of 2 (not two worlds of 1 writing the same run directory).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from conftest import FAKE_WANDB_KEY, REF_STEPS
from launcher import ROOT, env, free_port, train_losses
from test_multinode import REF_ARGS, assert_same_losses, script_args

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


def _submit(slurm_cluster, prepared_dir, tmp_path, out, wandb_mode, **extra) -> tuple[str, dict]:
    """sbatch the reference run's settings as two tasks on one node -> (job id, the environment used)."""
    e = env(
        **slurm_cluster.env, DS_CONFIG="ds_configs/cpu_pp2_zero1.json", STAGES="2", DATA=str(prepared_dir),
        OUT=str(out), MAX_STEPS=REF_STEPS, MODEL="debug", SECRET_DIR=str(tmp_path / "secrets"), **extra,
    )  # fmt: skip
    sbatch = ["sbatch", "--parsable", "--nodes=1", "--ntasks-per-node=2", "--gres=none", "--cpus-per-task=1",
              "--time=10", "launch/slurm_train.sbatch", *script_args(*REF_ARGS, "--wandb-mode", wandb_mode)]  # fmt: skip
    p = subprocess.run(sbatch, cwd=ROOT, env=e, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    return p.stdout.strip().split(";")[0], e


def test_sbatch_two_tasks_train_as_one_world(slurm_cluster, reference_run, prepared_dir, tmp_path):
    out = tmp_path / "slurm-run"
    job, _ = _submit(slurm_cluster, prepared_dir, tmp_path, out, "offline", WANDB_API_KEY=FAKE_WANDB_KEY)
    state = slurm_cluster.wait_job(job, 400)
    # the job log goes to the submit directory, which always exists (runs/ need not: a fresh checkout)
    log_path = ROOT / f"mlstm-ds-{job}.out"
    log = log_path.read_text() if log_path.exists() else "(no job log)"
    log_path.unlink(missing_ok=True)
    assert state == "COMPLETED", f"{state}\n{log[-6000:]}"
    assert os.readlink(out / f"slurm-{job}.out") == str(log_path), "job log not linked from the run"
    assert "INFO world 2 = 2 stages x 1 data-parallel" in log, "the srun tasks did not form one world"
    for noise in ("[INFO]", "Setting accelerator"):  # the launch scripts keep DeepSpeed's launcher quiet
        assert noise not in log, f"{noise!r} in the job log:\n{log[-3000:]}"
    assert json.loads((out / "config.json").read_text())["world_size"] == 2
    assert_same_losses(train_losses(out), train_losses(reference_run[0]), 1e-6)
    assert FAKE_WANDB_KEY not in log
    for f in out.rglob("*"):
        assert not f.is_file() or FAKE_WANDB_KEY.encode() not in f.read_bytes(), f"API key in {f}"
    assert list((out / "wandb").glob("offline-run-*/*.wandb")), "no W&B run on rank 0"
    assert not os.listdir(tmp_path / "secrets"), "secrets/env files outlived the job"


def test_srun_tasks_get_rank_and_world_from_slurm(slurm_cluster, prepared_dir, tmp_path):
    """What DeepSpeed's `--launcher slurm` runs, `srun -n 2 python app/train.py`, with no RANK/WORLD_SIZE set:
    the two tasks form one world of 2 (each used to start alone as rank 0 of 1)."""
    e = env(**slurm_cluster.env, MASTER_PORT=str(free_port()))
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR"):
        e.pop(var, None)
    cmd = ["srun", "-n", "2", "--cpus-per-task=1", sys.executable, "-u", "app/train.py", "--dry-run",
           "--deepspeed_config", "ds_configs/cpu_pp2_zero1.json", "--data", str(prepared_dir), "--out",
           str(tmp_path / "dry"), "--pipeline-stages", "2", "--model-config", "debug"]  # fmt: skip
    p = subprocess.run(cmd, cwd=ROOT, env=e, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, (p.stdout + p.stderr)[-4000:]
    worlds = [ln for ln in p.stderr.splitlines() if "INFO world " in ln]
    assert len(worlds) == 1 and "world 2 = 2 stages x 1 data-parallel" in worlds[0], p.stderr[-3000:]


def _job_field(cluster, job: str, field: str) -> str:
    p = subprocess.run(["scontrol", "show", "job", job], env=dict(os.environ, **cluster.env),
                       capture_output=True, text=True)  # fmt: skip
    return next((t.split("=", 1)[1] for t in p.stdout.split() if t.startswith(f"{field}=")), "")


# `long`: a minute of waiting on the scheduler's requeue; the signal's save and the rerun that loses nothing are
# test_training_preemption.py's; what only this test runs is the requeue by Slurm itself
@pytest.mark.long
def test_usr1_saves_the_step_and_the_job_requeues_and_resumes(
    slurm_cluster, reference_run, prepared_dir, tmp_path
):
    """What `#SBATCH --signal=USR1@120` does ahead of the time limit, by hand: `scancel --signal=USR1` to the
    job's tasks while they wait after step 5. They save step 5 and exit 75, the script requeues the job, and
    the requeued job resumes from step 5 and ends with the uninterrupted run's losses."""
    out = tmp_path / "requeued"
    job, e = _submit(
        slurm_cluster, prepared_dir, tmp_path, out, "disabled", MLSTM_DS_FAULTS="await_signal_after=5"
    )
    log_path = ROOT / f"mlstm-ds-{job}.out"
    try:
        deadline = time.time() + 300
        while 5 not in train_losses(out) and time.time() < deadline:
            time.sleep(0.5)
        assert 5 in train_losses(out), log_path.read_text()[-4000:] if log_path.exists() else "(no job log)"
        cancel = ["scancel", "--signal=USR1", job]
        assert subprocess.run(cancel, env=e, capture_output=True).returncode == 0
        while _job_field(slurm_cluster, job, "Restarts") != "1" and time.time() < deadline:
            time.sleep(0.5)
        assert _job_field(slurm_cluster, job, "Restarts") == "1", log_path.read_text()[-4000:]
        # the requeued job waits out the revoked credential (cred_expire, 10 s here: tests/cluster.py), then runs
        while _job_field(slurm_cluster, job, "JobState") == "REQUEUED" and time.time() < deadline:
            time.sleep(0.5)
        state = slurm_cluster.wait_job(job, 400)
        log = log_path.read_text()
    finally:
        log_path.unlink(missing_ok=True)
    assert state == "COMPLETED", f"{state}\n{log[-6000:]}"
    assert "preempted (SIGUSR1) after step 5" in log and f"requeueing job {job}" in log, log[-6000:]
    assert "step_00000005 at step 5" in log, log[-6000:]
    assert_same_losses(train_losses(out), train_losses(reference_run[0]), 1e-6)
