"""The machine's matrix-product peak, measured, so MFU means something on any CPU or GPU."""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from app.common import faults


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
    it, so MFU against it would read high); elsewhere (CPUs, unknown GPUs) the timed product's rate, with
    the threads this process uses."""
    timed = measure_matmul_peak(dtype, device) / faults.peak_divisor()
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    sheet = datasheet_peak(name, dtype) if device.type == "cuda" else None
    dt = str(dtype).removeprefix("torch.")
    if sheet is None:
        n = torch.get_num_threads()
        threads = f", {n} thread{'s' if n != 1 else ''}" if device.type == "cpu" else ""
        return (
            timed,
            f"MFU against the timed {dt} 1024^3 product: {timed / 1e12:.3g} TFLOP/s per rank ({name}{threads})",
        )
    return sheet, (
        f"MFU against the {name} datasheet dense {dt} peak {sheet / 1e12:.1f} TFLOP/s "
        f"(timed 1024^3 product: {timed / 1e12:.1f} TFLOP/s)"
    )
