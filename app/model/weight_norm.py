"""Weight normalisation (Salimans & Kingma 2016) per output row: w = g * v / ||v||.

Done by hand rather than with torch's parametrizations so state dicts hold plain `v`/`g` tensors that
ZeRO and pipeline checkpoints treat like any other parameter. Called once per layer forward (not per
time step), so it costs one pass over each matrix.
"""

from __future__ import annotations

import torch


def weight_normed(v: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """v (out, in), g (out,) -> w (out, in) whose row norms are g."""
    return v * (g / v.norm(dim=1)).unsqueeze(1)  # (out, in)
