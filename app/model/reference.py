"""The mLSTM equations stepped through time in Python with autograd recording every step.

This is how the OpenAI and NVIDIA reference implementations run the cell. It is kept as the
correctness reference for the fast core (tests) and as the speed baseline (bench); never train with it.
"""

from __future__ import annotations

import torch


def naive_mlstm(
    x: torch.Tensor,
    w_mx: torch.Tensor,
    w_x: torch.Tensor,
    bias: torch.Tensor,
    w_mh: torch.Tensor,
    w_m: torch.Tensor,
    state: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """x (B, T, in) -> h (B, T, H) from `state` (h_0, c_0), zero when None; w_mx (H, in), w_x (4H, in) rows
    i, f, o, u; w_mh (H, H); w_m (4H, H)."""
    B, T, _ = x.shape
    H = w_mh.shape[0]
    h, c = (x.new_zeros(B, H), x.new_zeros(B, H)) if state is None else state
    outs = []
    for t in range(T):
        x_t = x[:, t]  # (B, in)
        m = (x_t @ w_mx.t()) * (h @ w_mh.t())  # (B, H)
        z = x_t @ w_x.t() + m @ w_m.t() + bias  # (B, 4H)
        i, f, o, u = z.chunk(4, dim=1)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(u)
        h = torch.sigmoid(o) * torch.tanh(c)
        outs.append(h)
    return torch.stack(outs, dim=1)  # (B, T, H)
