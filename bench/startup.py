"""A process's start-up: what a training rank spends before its first step, in CPU-seconds. JSON line last.

    PYTHONPATH=. python bench/startup.py [--rounds 3] [--steps 3]

1. Imports, each in a fresh interpreter: `import torch, deepspeed` (what every rank imports), then with
   `torch._dynamo` (what torch.optim imports the first time an optimizer adds a param group or steps), then
   with DeepSpeed's Muon module as well (what DeepSpeed's ZeRO optimizers import to ask whether the
   optimizer is Muon; its `torch.compile` decorators import TorchInductor's compiler).
2. A 2-rank launch of `app/train.py` (2 pipeline stages, ds_configs/cpu_pp2_zero1.json, the debug model,
   `--max-steps` steps) on tiny prepared data, started as the test suite starts it (DeepSpeed's per-node
   `launch.py`, one thread per process), as users run it (`product`) and with the test harness's start-up
   saving (`harness`: tests/fast_start on PYTHONPATH, the stand-ins the suite's launched processes get).

CPU-seconds are the children's user + system time (`getrusage(RUSAGE_CHILDREN)`), which other work on the
machine does not inflate the way it inflates wall time. The variants are interleaved, `--rounds` times;
each figure is the median. A warm-up launch first builds the fused core for this tree (not counted).
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import platform
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HARNESS = ROOT / "tests" / "fast_start"
IMPORTS = {
    "torch_deepspeed": "import torch, deepspeed",
    "with_dynamo": "import torch, deepspeed, torch._dynamo",
    "with_dynamo_muon": "import torch, deepspeed, torch._dynamo, deepspeed.runtime.zero.muon.muon_optimizer",
}


def children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def timed(cmd: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(CPU-s of the command and every process it waited for, wall s)."""
    cpu, t0 = children_cpu(), time.perf_counter()
    p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    if p.returncode:
        raise RuntimeError(f"{cmd[:4]} failed ({p.returncode}):\n{p.stderr[-4000:]}")
    return children_cpu() - cpu, time.perf_counter() - t0


def base_env(harness: bool) -> dict[str, str]:
    env = dict(
        os.environ, OMP_NUM_THREADS="1", DS_ACCELERATOR="cpu", WANDB_SILENT="true", PYTHONUNBUFFERED="1"
    )
    paths = [str(HARNESS)] if harness else []
    paths += [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and Path(p) != HARNESS]
    env["PYTHONPATH"] = os.pathsep.join(paths)
    return env


def cpu_model() -> str:
    """The CPU's model name, as lscpu says it."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.machine()
    return next(
        (ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("model name")), platform.machine()
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_cmd(data: Path, out: Path, steps: int) -> list[str]:
    world = base64.urlsafe_b64encode(json.dumps({"localhost": [0, 1]}).encode()).decode()
    return [
        sys.executable, "-u", "-m", "deepspeed.launcher.launch", f"--world_info={world}", "--master_addr=127.0.0.1",
        f"--master_port={free_port()}", "--log_level=error", str(ROOT / "app" / "train.py"),
        "--deepspeed_config", str(ROOT / "ds_configs" / "cpu_pp2_zero1.json"), "--data", str(data), "--out", str(out),
        "--pipeline-stages", "2", "--model-config", "debug", "--max-steps", str(steps), "--warmup-steps", "2",
        "--eval-max-batches", "1", "--sanity-eval-batches", "1", "--progress", "false", "--plots", "false",
        "--wandb-mode", "disabled",
    ]  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=3)
    args = ap.parse_args()
    variants = {"product": False, **({"harness": True} if HARNESS.is_dir() else {})}
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "data"
        prep = [sys.executable, "-m", "data_prep", "--out", str(data), "--tokenizer", "byte",
                "--default-max-mb", "0.3", "--max-seq-len", "64", "--quiet"]  # fmt: skip
        timed(prep, base_env(False))
        timed(launch_cmd(data, Path(tmp) / "warm", args.steps), base_env(False))  # builds the fused core
        imports: dict[str, list[float]] = {k: [] for k in IMPORTS}
        launches: dict[str, list[float]] = {k: [] for k in variants}
        walls: dict[str, list[float]] = {k: [] for k in variants}
        for r in range(args.rounds):
            for name, code in IMPORTS.items():
                imports[name].append(timed([sys.executable, "-c", code], base_env(False))[0])
            for name, harness in variants.items():
                cpu, wall = timed(launch_cmd(data, Path(tmp) / f"{name}{r}", args.steps), base_env(harness))
                launches[name].append(cpu)
                walls[name].append(wall)
                print(f"round {r + 1}: {name} launch {cpu:.1f} CPU-s, {wall:.1f} s", flush=True)
    med = {k: round(statistics.median(v), 2) for k, v in imports.items()}
    result = {
        "machine": cpu_model(),
        "cpus": os.cpu_count(),
        "rounds": args.rounds,
        "import_cpu_s": med,
        "dynamo_import_cpu_s": round(med["with_dynamo"] - med["torch_deepspeed"], 2),
        "muon_import_cpu_s": round(med["with_dynamo_muon"] - med["with_dynamo"], 2),
        "launch_2_ranks_cpu_s": {k: round(statistics.median(v), 2) for k, v in launches.items()},
        "launch_2_ranks_wall_s": {k: round(statistics.median(v), 2) for k, v in walls.items()},
        "launch_cpu_s_all": {k: [round(x, 2) for x in v] for k, v in launches.items()},
    }
    if "harness" in launches:
        result["harness_saves_per_rank_cpu_s"] = round(
            (statistics.median(launches["product"]) - statistics.median(launches["harness"])) / 2, 2
        )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
