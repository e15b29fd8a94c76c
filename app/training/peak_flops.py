"""The machine's matrix-product peak, so MFU means something on any CPU or GPU, and the same thing in every
run on one machine.

A GPU in the datasheet table divides by its datasheet peak. Elsewhere (CPUs, other GPUs) the peak is
measured: once per machine (the CPU model or GPU name), thread count and dtype, then cached in
`$MLSTM_CACHE_DIR/matmul_peak.json` (default ~/.cache/mlstm-ds). A peak timed afresh at each start-up read
what the machine's load allowed then: two runs doing the same work at 0.085 TFLOP/s read 40-55% and 80-93%
MFU against start-up peaks of 0.18 and 0.10 TFLOP/s. Against one cached peak they read the same.
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import json
import os
import platform
import time
from collections.abc import Iterator
from pathlib import Path

import torch
import torch.distributed as dist

from app.common import faults
from app.common.files import atomic_write

PEAK_FILE = "matmul_peak.json"
MEASURE_S = 1.0  # the machine's one measurement: longer than each run's start-up could afford
MEASURE_AT_LEAST = 16


def measure_matmul_peak(
    dtype: torch.dtype, device: torch.device, n: int = 1024, seconds: float = 0.25, at_least: int = 8
) -> float:
    """FLOP/s of an n x n x n product in `dtype` on `device`: the best of a burst of at least `at_least`
    products and `seconds`, with the threads this process uses (the best: a product slowed by other work on
    the core reads low, never high; a peak read low is raised by the first faster step: `StepLogger`)."""
    g = torch.Generator().manual_seed(0)  # its own: measuring must not move the training RNG streams
    a = torch.randn(n, n, generator=g).to(device, dtype)
    b = torch.randn(n, n, generator=g).to(device, dtype)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    torch.mm(a, b)
    sync()
    best = float("inf")
    end, done = time.perf_counter() + seconds, 0
    while time.perf_counter() < end or done < at_least:
        done += 1
        t = time.perf_counter()
        torch.mm(a, b)
        sync()
        best = min(best, time.perf_counter() - t)
    return 2 * n**3 / best


# Datasheet dense (no sparsity) peaks in TFLOP/s per GPU, by a substring of torch.cuda.get_device_name():
# the first match wins, so the more specific names come first. fp32: the non-tensor-core rate (what an fp32
# product runs at unless tf32 is allowed); tf32 when torch.backends.cuda.matmul.allow_tf32 is set.
DATASHEET_TFLOPS: list[tuple[str, dict[str, float]]] = [
    ("H200 NVL", {"bf16": 835.5, "fp16": 835.5, "tf32": 417.5, "fp32": 60.0}),
    ("H200", {"bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 66.9}),  # SXM
    ("H100 NVL", {"bf16": 835.5, "fp16": 835.5, "tf32": 417.5, "fp32": 60.0}),
    ("H100 PCIe", {"bf16": 756.5, "fp16": 756.5, "tf32": 378.0, "fp32": 51.2}),
    ("H100", {"bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 66.9}),  # SXM5 ("H100 80GB HBM3")
    ("A100", {"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "fp32": 19.5}),
    ("L40S", {"bf16": 362.1, "fp16": 362.1, "tf32": 183.0, "fp32": 91.6}),
    ("L4", {"bf16": 121.0, "fp16": 121.0, "tf32": 60.0, "fp32": 30.3}),
    ("A10", {"bf16": 125.0, "fp16": 125.0, "tf32": 62.5, "fp32": 31.2}),
    ("V100", {"fp16": 125.0, "fp32": 15.7}),  # SXM2; no bf16 tensor cores
    ("RTX 4090", {"bf16": 165.2, "fp16": 165.2, "tf32": 82.6, "fp32": 82.6}),
]


def datasheet_peak(device_name: str, dtype: torch.dtype) -> float | None:
    """FLOP/s of the device's datasheet dense peak for products in `dtype`; None when not in the table."""
    key = {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(dtype)
    if key is None:
        key = "tf32" if dtype == torch.float32 and torch.backends.cuda.matmul.allow_tf32 else "fp32"
    for pattern, peaks in DATASHEET_TFLOPS:
        if pattern in device_name:
            return peaks[key] * 1e12 if key in peaks else None
    return None


def cache_path() -> Path:
    base = os.environ.get("MLSTM_CACHE_DIR") or Path.home() / ".cache" / "mlstm-ds"
    return Path(base) / PEAK_FILE


def device_name(device: torch.device) -> str:
    """The GPU's name, or the CPU's model (/proc/cpuinfo; else what `platform` knows)."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine() or "cpu"


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """The cache file to one process at a time: ranks starting together measure once, one after another
    (the second finds the first's figure)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _read(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def machine_peak(dtype: torch.dtype, device: torch.device) -> tuple[float, str]:
    """(FLOP/s of this machine's n^3 product in `dtype` with the threads this process uses, where it comes
    from: "measured now", "cached <date>", or measured now and why it could not be cached)."""
    n = torch.get_num_threads()
    key = f"{device_name(device)} | {n} thread{'s' if n != 1 else ''} | {str(dtype).removeprefix('torch.')}"
    path = cache_path()
    try:
        with _locked(path):
            entry = _read(path).get(key)
            if isinstance(entry, dict) and isinstance(entry.get("flops"), float) and entry["flops"] > 0:
                return entry["flops"], f"cached {entry.get('measured', '')} in {path}"
            flops = measure_matmul_peak(dtype, device, seconds=MEASURE_S, at_least=MEASURE_AT_LEAST)
            today = datetime.date.today().isoformat()
            atomic_write(path, json.dumps(_read(path) | {key: {"flops": flops, "measured": today}}, indent=1))
            return flops, f"measured now, cached in {path}"
    except OSError as e:  # a read-only home: this run's own measurement
        flops = measure_matmul_peak(dtype, device, seconds=MEASURE_S, at_least=MEASURE_AT_LEAST)
        return flops, f"measured now, not cached ({path}: {e.strerror or e})"


def world_peak(dtype: torch.dtype, device: torch.device, world: int) -> tuple[float, str]:
    """Every rank, together (a collective): (the peak of the WHOLE world, which MFU divides the world's
    throughput by, and one line saying which peak it is). Each rank times its own product once every rank
    has reached this point (a barrier first: no rank times while another still does its start-up work on
    a shared core), and the ranks' peaks are summed: throughput and peak count the same hardware."""
    dist.barrier()
    local, line = mfu_peak(dtype, device)
    total = torch.tensor([local], dtype=torch.float64, device=device)
    dist.all_reduce(total)
    if world > 1:
        line += f"; for the {world} ranks together: {total.item() / 1e12:.3g} TFLOP/s"
    return total.item(), line


def mfu_peak(dtype: torch.dtype, device: torch.device) -> tuple[float, str]:
    """(the peak of this process's device MFU divides by, one line saying which and giving the timed peak).

    GPUs in the table: the datasheet dense peak for the dtype (a timed 1024^3 product reaches well under
    it, so MFU against it would read high); elsewhere (CPUs, unknown GPUs) the machine's peak with the
    threads this process uses, measured once and cached (`machine_peak`)."""
    name = device_name(device)
    sheet = datasheet_peak(name, dtype) if device.type == "cuda" else None
    dt = str(dtype).removeprefix("torch.")
    if sheet is None:
        peak, where = machine_peak(dtype, device)
        peak /= faults.peak_divisor()
        n = torch.get_num_threads()
        threads = f", {n} thread{'s' if n != 1 else ''}" if device.type == "cpu" else ""
        return peak, (
            f"MFU against this machine's {dt} 1024^3 product peak: {peak / 1e12:.3g} TFLOP/s per rank "
            f"({name}{threads}; {where})"
        )
    timed = measure_matmul_peak(dtype, device) / faults.peak_divisor()
    return sheet, (
        f"MFU against the {name} datasheet dense {dt} peak {sheet / 1e12:.1f} TFLOP/s "
        f"(timed 1024^3 product: {timed / 1e12:.1f} TFLOP/s)"
    )
