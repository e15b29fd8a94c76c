"""Learning-rate schedule: linear warmup, then cosine or linear decay to a floor."""

from __future__ import annotations

import math


def lr_multiplier(step: int, *, warmup: int, total: int, decay: str, min_ratio: float) -> float:
    """Factor applied to the peak lr at optimizer step `step` (0-based)."""
    if step < warmup:
        return (step + 1) / warmup
    if decay == "constant" or total <= warmup:
        return 1.0
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    if decay == "cosine":
        shape = 0.5 * (1.0 + math.cos(math.pi * progress))
    elif decay == "linear":
        shape = 1.0 - progress
    else:
        raise ValueError(f"unknown lr decay {decay!r}")
    return min_ratio + (1.0 - min_ratio) * shape
