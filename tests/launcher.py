"""Run app entry points the way users do: DeepSpeed's real launcher (its per-node `launch.py`, or the `deepspeed`
runner where that is the subject), real processes, CPU + gloo."""

from __future__ import annotations

import base64
import json
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
CPU_CONFIG = ROOT / "ds_configs" / "cpu_pp2_zero1.json"
FAST_START = ROOT / "tests" / "fast_start"  # its sitecustomize.py: the launched processes' start-up saving
TIMEOUT = 300
# our cache folder (builds, the matmul peak) for the suite's own process and every process it starts: the fused
# core built once up front (conftest.py) is the one the launches load, not built again inside a test's time-out
SUITE_CACHE = str(Path(tempfile.gettempdir()) / f"mlstm-ds-suite-cache-{os.getuid()}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def env(**extra: str) -> dict[str, str]:
    e = dict(os.environ)
    # one kernel for every launch: runs compared bit for bit (a resume vs the reference run) are separate
    # processes, and the per-process MKL-vs-oneDNN timing can pick differently under load
    e.update(WANDB_SILENT="true", PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", MLSTM_MATMUL="mm")
    e.pop("MLSTM_DS_FAULTS", None)
    # the machine's matmul peak (app/training/peak_flops.py) measured under the suite's load stays the suite's
    e.setdefault("MLSTM_CACHE_DIR", SUITE_CACHE)
    if not torch_sees_an_accelerator():  # as launch/setup_env.sh does: one decision, no warning per process
        e.setdefault("DS_ACCELERATOR", "cpu")
    # the harness's start-up saving (tests/fast_start/sitecustomize.py): no TorchDynamo or TorchInductor import
    e["PYTHONPATH"] = os.pathsep.join(
        [str(FAST_START), *filter(None, e.get("PYTHONPATH", "").split(os.pathsep))]
    )
    e.update(extra)
    return e


def torch_sees_an_accelerator() -> bool:
    import torch

    return torch.accelerator.is_available()


_PORTS: list[int] = []


def release_shm() -> None:
    """Killed runs cannot unlink DeepSpeed's shared-memory buffers; remove those of this session's ports."""
    from app.parallel.runtime import unlink_shm_segments

    for port in _PORTS:
        unlink_shm_segments("127.0.0.1", str(port))


def deepspeed_cmd(nprocs: int, script: str, args: list[str], runner: bool = False) -> list[str]:
    """`script` is a file (app/train.py) or a module (app.train: `deepspeed --module`, as installed users run
    it). The launcher logs errors only, as the launch/ scripts make it.

    By default DeepSpeed's per-node launcher, `python -m deepspeed.launcher.launch`, with the arguments the
    `deepspeed` runner gives it on one node: the runner only builds that command and waits for it (it
    imports torch and DeepSpeed to do so: ~3 s of a core and ~4 s of every launch). `runner=True`: the
    `deepspeed` command users type, for the tests of what the runner itself does (a signal sent to it;
    test_launch, test_docs and test_multinode run it through the launch/ scripts and hostfiles)."""
    _PORTS.append(free_port())
    target = [str(ROOT / script)] if script.endswith(".py") else ["--module", script]
    if runner:
        return [str(BIN / "deepspeed"), "--log_level", "error", "--num_gpus", str(nprocs),
                "--master_port", str(_PORTS[-1]), *target, *args]  # fmt: skip
    # the runner's --world_info: its hosts and slots as JSON in URL-safe base64 (deepspeed.launcher.runner)
    world = base64.urlsafe_b64encode(json.dumps({"localhost": list(range(nprocs))}).encode()).decode()
    return [sys.executable, "-u", "-m", "deepspeed.launcher.launch", f"--world_info={world}",
            "--master_addr=127.0.0.1", f"--master_port={_PORTS[-1]}", "--log_level=error", *target, *args]  # fmt: skip


def run(cmd: list[str], extra_env: dict | None = None, timeout: int = TIMEOUT) -> subprocess.CompletedProcess:
    return subprocess.run(
        cmd, cwd=ROOT, env=env(**(extra_env or {})), capture_output=True, text=True, timeout=timeout
    )


def train_args(
    data: Path,
    out: Path,
    *extra: str,
    stages: int = 2,
    config: Path | None = CPU_CONFIG,
    progress: bool = False,
    model: str | None = "debug",
) -> list[str]:
    """`config=None`: the caller names the DeepSpeed JSON in `extra` (--deepspeed FILE, a --config file).
    `progress`: leave the progress bar at its default (on, but only on a terminal) instead of turning it off.
    `model=None`: no --model-config."""
    return [
        *(["--deepspeed_config", str(config)] if config is not None else []),
        "--data",
        str(data),
        "--out",
        str(out),
        "--pipeline-stages",
        str(stages),
        *(["--model-config", model] if model else []),
        "--warmup-steps",
        "2",
        "--eval-max-batches",
        "1",
        "--sanity-eval-batches",
        "1",
        *([] if progress else ["--progress", "false"]),
        "--plots",  # about a second of rank 0 per validation; the reference run draws them (conftest)
        "false",
        "--log-every",
        "1",
        *extra,
    ]


def train(
    nprocs: int,
    data: Path,
    out: Path,
    *extra: str,
    stages: int = 2,
    config: Path | None = CPU_CONFIG,
    extra_env: dict | None = None,
    check: bool = True,
    script: str = "app/train.py",
    progress: bool = False,
    runner: bool = False,
) -> subprocess.CompletedProcess:
    args = train_args(data, out, *extra, stages=stages, config=config, progress=progress)
    p = run(deepspeed_cmd(nprocs, script, args, runner=runner), extra_env)
    if check and p.returncode != 0:
        raise AssertionError(f"training failed ({p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-6000:]}")
    return p


def train_one_process(
    data: Path, out: Path, *extra: str, config: Path | None = CPU_CONFIG, model: str | None = "debug"
) -> subprocess.CompletedProcess:
    """`python app/train.py` without the launcher: the documented plain single-process run (world 1, one
    stage). For the refusals rank 0 makes before any peer matters (arguments, --out's lock, the resume
    tag, a checkpoint's model/tokenizer/data): the same code and the same one line as under the launcher,
    without its two extra interpreters (~12 s a launch against ~4-7 s here)."""
    return train_process(train_args(data, out, *extra, stages=1, config=config, model=model))


def train_process(args: list[str]) -> subprocess.CompletedProcess:
    """`python app/train.py ARGS`: one process, no launcher."""
    return run([sys.executable, str(ROOT / "app" / "train.py"), *args])


def metrics(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    return [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()] if path.exists() else []


def train_losses(run_dir: Path) -> dict[int, float]:
    """step -> train loss, the last record of each step winning (a resumed run rewrites later steps)."""
    return {m["step"]: m["train/loss"] for m in metrics(run_dir) if "train/loss" in m}
