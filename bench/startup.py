"""A process's start-up: what a training rank spends before its first step, in CPU-seconds. JSON line last.

    PYTHONPATH=. python bench/startup.py [--rounds 3] [--steps 3]

1. Imports, each in a fresh interpreter: `import torch, deepspeed` (what every rank imports), then with
   `torch._dynamo` (what torch.optim imports the first time an optimizer adds a param group or steps), then
   with DeepSpeed's Muon module as well (what DeepSpeed's ZeRO optimizers import to ask whether the
   optimizer is Muon; its `torch.compile` decorators import TorchInductor's compiler).
2. `one_process`: `python app/train.py` as one process (world 1, one stage, ds_configs/cpu_pp2_zero1.json's
   ZeRO-1, the debug model, one step, no evaluation or save) on tiny prepared data: a rank's start-up
   and one step, with no peer to wait for.
3. `two_ranks`: a 2-rank launch of `app/train.py` (2 pipeline stages, `--max-steps` steps), started as the
   test suite starts it (DeepSpeed's per-node `launch.py`, one thread per process). Its CPU time also
   counts what the ranks spend waiting for each other, which grows with the machine's load.
Each run as users run it (`product`) and with the test harness's start-up saving (`harness`: tests/fast_start
on PYTHONPATH, the stand-ins the suite's launched processes get).

CPU-seconds are the children's user + system time (`getrusage(RUSAGE_CHILDREN)`). The variants are
interleaved, `--rounds` times; each figure is the median. The environment is the one tests/launcher.py
gives the suite's processes (one thread each, `MLSTM_MATMUL=mm`), with the fused core (and DeepSpeed's CPU
all-reduce op) built by warm-up runs (not counted) in a folder of this run's.
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


def base_env(harness: bool, extensions: Path) -> dict[str, str]:
    """The environment tests/launcher.py gives its processes (one thread, the CPU accelerator, one matmul
    path), with the fused core built in `extensions` (a folder of this run's: another tree's build of it in
    the shared default folder would make every process here compile it again)."""
    env = dict(
        os.environ, OMP_NUM_THREADS="1", DS_ACCELERATOR="cpu", WANDB_SILENT="true", PYTHONUNBUFFERED="1"
    )
    env.update(
        MLSTM_MATMUL="mm", TORCH_EXTENSIONS_DIR=str(extensions), MLSTM_CACHE_DIR=str(extensions / "cache")
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


def train_cmd(data: Path, out: Path, steps: int, ranks: int) -> list[str]:
    """`python app/train.py` (one process, one stage) or DeepSpeed's per-node launcher with `ranks` ranks."""
    if ranks == 1:
        head = [sys.executable, str(ROOT / "app" / "train.py"), "--pipeline-stages", "1"]
    else:
        world = base64.urlsafe_b64encode(json.dumps({"localhost": list(range(ranks))}).encode()).decode()
        head = [sys.executable, "-u", "-m", "deepspeed.launcher.launch", f"--world_info={world}",
                "--master_addr=127.0.0.1", f"--master_port={free_port()}", "--log_level=error",
                str(ROOT / "app" / "train.py"), "--pipeline-stages", str(ranks)]  # fmt: skip
    return [
        *head, "--deepspeed_config", str(ROOT / "ds_configs" / "cpu_pp2_zero1.json"), "--data", str(data),
        "--out", str(out), "--model-config", "debug", "--max-steps", str(steps), "--warmup-steps", "2",
        "--eval-every", "0", "--save-every", "0", "--sanity-eval-batches", "0", "--test-eval", "false",
        "--samples", "0", "--progress", "false", "--plots", "false", "--wandb-mode", "disabled",
    ]  # fmt: skip


def measure(tmp: Path, rounds: int, steps: int) -> dict[str, dict[str, list[float]]]:
    """{figure: {variant: CPU-s of each round}}, the variants interleaved."""
    data, ext = tmp / "data", tmp / "torch_extensions"
    prep = [sys.executable, "-m", "data_prep", "--out", str(data), "--tokenizer", "byte",
            "--default-max-mb", "0.3", "--max-seq-len", "64", "--quiet"]  # fmt: skip
    timed(prep, base_env(False, ext))
    for ranks in (1, 2):  # build the fused core, and DeepSpeed's CPU all-reduce op that several ranks use
        timed(train_cmd(data, tmp / f"warm{ranks}", 1, ranks), base_env(False, ext))
    variants = {"product": False, **({"harness": True} if HARNESS.is_dir() else {})}
    out: dict[str, dict[str, list[float]]] = {"imports": {k: [] for k in IMPORTS}}
    out |= {f"{kind}_wall_s" if wall else kind: {v: [] for v in variants}
            for kind in ("one_process", "two_ranks") for wall in (False, True)}  # fmt: skip
    for r in range(rounds):
        for name, code in IMPORTS.items():
            out["imports"][name].append(timed([sys.executable, "-c", code], base_env(False, ext))[0])
        for variant, harness in variants.items():
            for kind, ranks, n in (("one_process", 1, 1), ("two_ranks", 2, steps)):
                cpu, wall = timed(
                    train_cmd(data, tmp / f"{variant}_{kind}_{r}", n, ranks), base_env(harness, ext)
                )
                out[kind][variant].append(cpu)
                out[f"{kind}_wall_s"][variant].append(wall)
                print(f"round {r + 1}: {variant} {kind}: {cpu:.1f} CPU-s, {wall:.1f} s", flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        runs = measure(Path(tmp), args.rounds, args.steps)
    med = {fig: {k: round(statistics.median(v), 2) for k, v in by.items()} for fig, by in runs.items()}
    imports = med["imports"]
    result = {
        "machine": cpu_model(),
        "cpus": os.cpu_count(),
        "rounds": args.rounds,
        "import_cpu_s": imports,
        "dynamo_import_cpu_s": round(imports["with_dynamo"] - imports["torch_deepspeed"], 2),
        "muon_import_cpu_s": round(imports["with_dynamo_muon"] - imports["with_dynamo"], 2),
        **{fig: by for fig, by in med.items() if fig != "imports"},
        "cpu_s_each_round": {fig: by for fig, by in runs.items() if not fig.endswith("wall_s")},
    }
    if "harness" in med["one_process"]:
        result["harness_saves_one_process_cpu_s"] = round(
            med["one_process"]["product"] - med["one_process"]["harness"], 2
        )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
