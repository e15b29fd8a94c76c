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
