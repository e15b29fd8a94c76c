"""The machine's matrix-product peak, measured, so MFU means something on any CPU or GPU."""

from __future__ import annotations

import time

import torch


def measure_matmul_peak(
    dtype: torch.dtype, device: torch.device, n: int = 1024, seconds: float = 0.3
) -> float:
    """FLOP/s of an n x n x n product in `dtype` on `device` (best of a short burst)."""
    g = torch.Generator().manual_seed(0)  # its own: measuring must not move the training RNG streams
    a = torch.randn(n, n, generator=g).to(device, dtype)
    b = torch.randn(n, n, generator=g).to(device, dtype)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    torch.mm(a, b)
    sync()
    best = float("inf")
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
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


def mfu_peak(dtype: torch.dtype, device: torch.device) -> tuple[float, str]:
    """(the peak MFU divides by, one line saying which and giving the timed peak beside it).

    GPUs in the table: the datasheet dense peak for the dtype (a timed 1024^3 product reaches well under
    it, so MFU against it would read high); elsewhere (CPUs, unknown GPUs) the timed product's rate."""
    timed = measure_matmul_peak(dtype, device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    sheet = datasheet_peak(name, dtype) if device.type == "cuda" else None
    dt = str(dtype).removeprefix("torch.")
    if sheet is None:
        return timed, f"MFU against the timed {dt} 1024^3 product: {timed / 1e12:.2f} TFLOP/s ({name})"
    return sheet, (
        f"MFU against the {name} datasheet dense {dt} peak {sheet / 1e12:.1f} TFLOP/s "
        f"(timed 1024^3 product: {timed / 1e12:.1f} TFLOP/s)"
    )
