"""Learning-rate schedule: linear warmup, then cosine or linear decay to a floor.

Two clocks drive the decay: the step count (`lr_multiplier`, a run of known length), or the elapsed
fraction of a wall-clock budget (`budget_lr_multiplier`, `--time-budget`), where the decay ends when the
budget's training time does, however many steps that turns out to be.
"""

from __future__ import annotations

import math


def decay_shape(progress: float, decay: str, min_ratio: float) -> float:
    """Multiplier at `progress` in [0, 1] of the decay: 1 at the start, `min_ratio` at the end."""
    progress = min(1.0, max(0.0, progress))
    if decay == "constant":
        return 1.0
    if decay == "cosine":
        shape = 0.5 * (1.0 + math.cos(math.pi * progress))
    elif decay == "linear":
        shape = 1.0 - progress
    else:
        raise ValueError(f"unknown lr decay {decay!r}")
    return min_ratio + (1.0 - min_ratio) * shape


def lr_multiplier(step: int, *, warmup: int, total: int, decay: str, min_ratio: float) -> float:
    """Factor applied to the peak lr at optimizer step `step` (0-based)."""
    if step < warmup:
        return (step + 1) / warmup
    if decay == "constant" or total <= warmup:
        return 1.0
    return decay_shape((step - warmup) / max(1, total - warmup), decay, min_ratio)


def budget_lr_multiplier(
    step: int, fraction: float, decay_from: float, *, warmup: int, decay: str, min_ratio: float
) -> float:
    """Factor on the peak lr at step `step` of a time-budgeted run.

    `fraction` is the elapsed share of the budget's training time (0 at the start, 1 when training must
    stop to leave time for the final evaluation and save); `decay_from` is the fraction at which the
    warmup ended. Warmup counts steps, because what it protects (Adam's first moment estimates) is a
    number of updates, not seconds; the decay then runs over the rest of the budget's time.
    """
    if step < warmup:
        return (step + 1) / warmup
    span = 1.0 - decay_from
    return decay_shape((fraction - decay_from) / span if span > 0 else 1.0, decay, min_ratio)
