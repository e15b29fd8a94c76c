"""Multi-node launches for real: DeepSpeed's hostfile runner over pdsh + ssh to two loopback "nodes"
(127.0.0.1, 127.0.0.2; tests/cluster.py), and the lifecycle of ranks whose peer or launcher dies.

Every run uses the reference run's settings (tests/conftest.py), so its per-step losses are the yardstick.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from conftest import FAKE_WANDB_KEY, REF_STEPS
from launcher import (
    _PORTS,
    CPU_CONFIG,
    ROOT,
    env,
    free_port,
    train_args,
    train_losses,
)

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

FAKE_HF_TOKEN = "hf_FAKEfakeFAKEfakeFAKEfakeFAKEfake0000"
LOST = "lost contact with its peers"
REF_ARGS = ["--save-every", "3", "--keep-last", "2", "--eval-every", "4"]


def script_args(*extra: str) -> list[str]:
    """train_args minus what train_multi_node.sh sets from its environment variables."""
    args = train_args(Path("x"), Path("x"), *extra)
    for flag in ("--deepspeed_config", "--data", "--out", "--pipeline-stages", "--model-config"):
        i = args.index(flag)
        del args[i : i + 2]
    return args


def hostfile_launch(cluster, hostfile: Path, data: Path, out: Path, *extra: str, stages: int = 2,
                    config: Path = CPU_CONFIG, port: int | None = None, **env_extra: str):  # fmt: skip
    """`launch/train_multi_node.sh` as docs/training.md shows it: returns (argv, environment) for Popen/run."""
    port = port or free_port()
    _PORTS.append(port)  # the session's /dev/shm clean-up covers killed runs
    e = env(
        HOSTFILE=str(hostfile), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), LAUNCHER="pdsh",
        DS_CONFIG=str(config), STAGES=str(stages), DATA=str(data), OUT=str(out), MAX_STEPS=REF_STEPS,
        MODEL="debug", SECRET_DIR=str(out.parent / "secrets"), **cluster.env, **env_extra,
    )  # fmt: skip
    return [
        "bash",
        str(ROOT / "launch" / "train_multi_node.sh"),
        *script_args("--max-steps", REF_STEPS, *extra),
    ], e


def shm_left(port: int, rank: str = "*") -> list[str]:
    return [p.name for p in Path("/dev/shm").glob(f"deepspeed_*_127.0.0.1_{port}_{rank}")]


def rank_pids(out: Path) -> dict[int, int]:
    """rank -> pid of this run's app/train.py processes (found in /proc: same machine, any 'node').

    A rank's launcher watcher is a fork of it (same command line): a train.py whose parent is one is skipped.
    """
    found: dict[int, tuple[int, int]] = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmd = (proc / "cmdline").read_bytes().split(b"\0")
            if not any(c.endswith(b"app/train.py") for c in cmd) or str(out).encode() not in cmd:
                continue
            environ = dict(
                kv.split(b"=", 1) for kv in (proc / "environ").read_bytes().split(b"\0") if b"=" in kv
            )
            ppid = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        if b"RANK" in environ:
            found[int(proc.name)] = (int(environ[b"RANK"]), ppid)
    return {rank: pid for pid, (rank, ppid) in found.items() if ppid not in found}


def wait_until(cond, timeout: float, what: str, proc: subprocess.Popen | None = None) -> None:
    """Poll `cond`; fail at once if `proc` (the launch being watched) ends first."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if cond():
            return
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the launch ended ({proc.returncode}) before {what}")
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def assert_same_losses(got: dict[int, float], ref: dict[int, float], tol: float) -> None:
    assert got.keys() == ref.keys(), (sorted(got), sorted(ref))
    for s in ref:
        assert got[s] == pytest.approx(ref[s], rel=tol, abs=tol), (s, got[s], ref[s])


def test_hostfile_p2_on_two_nodes_matches_single_node_and_keeps_keys_out_of_logs(
    ssh_cluster, reference_run, prepared_dir, tmp_path
):
    """P = 2 stages, one on each node, through pdsh + ssh; W&B on rank 0 gets the launching node's key.

    The key is in the launching shell's environment and a token in ~/.deepspeed_env (DeepSpeed's documented
    place for forwarded variables): neither may appear in the launcher's log or any run file.
    """
    home = tmp_path / "home"
    home.mkdir()
    (home / ".deepspeed_env").write_text(f"HF_TOKEN={FAKE_HF_TOKEN}\n")
    out = tmp_path / "p2"
    cmd, e = hostfile_launch(
        ssh_cluster, ssh_cluster.hostfile(tmp_path / "hostfile"), prepared_dir, out, *REF_ARGS,
        "--wandb-mode", "offline", WANDB_API_KEY=FAKE_WANDB_KEY, HOME=str(home),
        MLSTM_CACHE_DIR=os.environ.get("MLSTM_CACHE_DIR", str(Path.home() / ".cache/mlstm-ds")),  # our builds
    )  # fmt: skip
    p = subprocess.run(cmd, cwd=ROOT, env=e, capture_output=True, text=True, timeout=300)
    log = p.stdout + p.stderr
    assert p.returncode == 0, log[-6000:]
    assert "127.0.0.1: " in log and "127.0.0.2: " in log, "pdsh did not run a rank on each node"
    assert "Setting accelerator" not in log, "DS_ACCELERATOR was not decided once and forwarded"
    assert json.loads((out / "config.json").read_text())["world_size"] == 2
    assert_same_losses(train_losses(out), train_losses(reference_run[0]), 1e-6)
    assert "imported WANDB_API_KEY, HF_TOKEN from MLSTM_DS_SECRETS_FILE" in log
    assert list((out / "wandb").glob("offline-run-*/*.wandb")), "no W&B run on rank 0"
    for secret in (FAKE_WANDB_KEY, FAKE_HF_TOKEN):
        assert secret not in log, "a credential is in the launcher's log"
        for f in [*out.rglob("*"), *(tmp_path / "secrets").rglob("*")]:
            assert not f.is_file() or secret.encode() not in f.read_bytes(), f"credential in {f}"
    assert not list((tmp_path / "secrets").glob("secrets.*")), "the secrets file outlived the job"


def test_hostfile_dp2_node_rank_killed_one_line_then_rerun_resumes(
    ssh_cluster, reference_run, prepared_dir, tmp_path
):
    """P = 1 x DP = 2 across the nodes. Node 127.0.0.2's rank stops after step 3 and is SIGKILLed while rank 0
    waits on it: the job ends non-zero with one line from rank 0 well within --dist-timeout-s, rank 0's
    /dev/shm buffer is gone, and rerunning the same command resumes at step 3 and reproduces the curve."""
    cfg = json.loads((ROOT / "ds_configs" / "cpu_zero2.json").read_text())
    cfg["gradient_accumulation_steps"] = 2  # 2 x DP 2 = the reference's 4 micro-batches per step
    config = tmp_path / "zero2.json"
    config.write_text(json.dumps(cfg))
    out, port = tmp_path / "dp2", free_port()
    hostfile = ssh_cluster.hostfile(tmp_path / "hostfile")
    args = (
        ssh_cluster,
        hostfile,
        prepared_dir,
        out,
        *REF_ARGS,
        "--wandb-mode",
        "disabled",
        "--dist-timeout-s",
        "60",
    )
    cmd, e = hostfile_launch(
        *args, stages=1, config=config, port=port, MLSTM_DS_FAULTS="hang_after=3,hang_rank=1"
    )
    log_path = tmp_path / "launch.log"  # a file, not a pipe nobody reads while we wait
    p = subprocess.Popen(cmd, cwd=ROOT, env=e, stdout=log_path.open("w"), stderr=subprocess.STDOUT)
    try:
        wait_until(
            lambda: (out / "checkpoints" / "step_00000003" / "COMPLETE").exists(), 240, "checkpoint 3", p
        )
        wait_until(lambda: 1 in rank_pids(out), 30, "rank 1's pid")
        time.sleep(1.0)  # rank 0 is now inside step 4's first collective, waiting for rank 1
        os.kill(rank_pids(out)[1], signal.SIGKILL)
        t_kill = time.time()
        p.wait(timeout=120)
        elapsed = time.time() - t_kill
    finally:
        if p.poll() is None:
            p.kill()
    log = log_path.read_text()
    assert p.returncode != 0
    lines = [ln for ln in log.splitlines() if LOST in ln]
    assert len(lines) == 1 and "error: rank 0" in lines[0], log[-4000:]
    assert "Traceback" not in log, log[-4000:]
    assert elapsed < 60, f"the surviving rank took {elapsed:.0f}s"
    assert not shm_left(port, "0"), "rank 0 left its /dev/shm buffer"
    assert not rank_pids(out), "ranks outlived the job"

    cmd, e = hostfile_launch(*args, stages=1, config=config)
    p = subprocess.run(cmd, cwd=ROOT, env=e, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, (p.stdout + p.stderr)[-6000:]
    assert "resumed from" in p.stderr + p.stdout and "step_00000003 at step 3" in p.stderr + p.stdout
    assert_same_losses(train_losses(out), train_losses(reference_run[0]), 2e-5)
