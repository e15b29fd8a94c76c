"""Benchmark results as committed data: `bench/results/<bench>-<device>-<date>.json`, one JSON line per run
(appended), each carrying the device name, the git commit, torch, Triton, CUDA and the driver, so a figure can
be checked against the code and software that produced it; bench/gpu_tables.py makes bench/README.md's GPU
tables from them. `BENCH_RESULTS_DIR` writes elsewhere (the GPU session script points it at $OUT)."""

from __future__ import annotations

import datetime
import json
import os
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def git_commit() -> str:
    """HEAD, with "+dirty" when the tree has uncommitted changes; "unknown" outside a checkout.
    MLSTM_GIT_COMMIT wins: a copy of the tree on another machine may carry a .git that is not the code's."""
    if os.environ.get("MLSTM_GIT_COMMIT"):
        return os.environ["MLSTM_GIT_COMMIT"]
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
        )
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True).stdout.strip()  # fmt: skip
        return head.stdout.strip() + ("+dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def software() -> dict:
    """What ran the benchmark besides the code: torch, Triton, CUDA and the NVIDIA driver where there are."""
    out: dict = {}
    try:
        import torch

        out["torch"] = torch.__version__
        if torch.version.cuda:
            out["cuda"] = torch.version.cuda
    except ImportError:
        pass
    try:
        import triton

        out["triton"] = triton.__version__
    except ImportError:
        pass
    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30)  # fmt: skip
        if smi.returncode == 0 and smi.stdout.strip():
            out["driver"] = smi.stdout.strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError):
        pass
    return out


def save(result: dict, bench: str, device: str) -> Path:
    """Append `result` (plus device, commit, UTC time, torch, Triton, CUDA and driver) as one JSON line;
    returns the file."""
    now = datetime.datetime.now(datetime.timezone.utc)
    slug = re.sub(r"[^A-Za-z0-9]+", "-", device).strip("-").lower() or "unknown"
    folder = Path(os.environ.get("BENCH_RESULTS_DIR", ROOT / "bench" / "results"))
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{bench}-{slug}-{now:%Y-%m-%d}.json"
    line = {**result, **software(), "device": device, "git_commit": git_commit(),
            "utc": now.isoformat(timespec="seconds")}  # fmt: skip
    with path.open("a") as f:
        f.write(json.dumps(line) + "\n")
    return path
