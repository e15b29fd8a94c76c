"""The two matrix-product shapes the recurrent core uses, each routed to the fastest kernel we measured.

Measured on the 2-core Zen 5 dev box (torch 2.13 CPU, MKL 2024.2, oneDNN 3.12), GFLOP/s, same run,
machine shared (absolute numbers noisy, ratios stable); `bench/mlstm_layer.py` re-measures the peaks:

    x @ w.T (forward products, per-step recurrent products)      torch.mm (MKL)   oneDNN linear   bf16 mm
      (8192 x 1024) @ (1024 x 5120)   input projection              120-129        168-174          320-330
      (64 x 1024) @ (1024 x 4096)     per-step, large model          40-88          145              170-294
      (16 x 256) @ (256 x 1024)       per-step, small model          57-74          60-89            108-123
    dy.T @ x (weight gradients, reduction over all B*T tokens)   torch.mm(a.t()) oneDNN linear
      (5120 x 8192) @ (8192 x 1024)                                 146-169        115-139          350-365 (mm)

So: fp32 `x @ w.T` on CPU goes to oneDNN through `torch.ops.mkldnn._linear_pointwise` (plain dense
weight; pre-packing the weight as an mkldnn tensor measured no faster), 1.3-2x over MKL. Weight
gradients stay on `torch.mm` with a transposed view (MKL/oneDNN take the transpose for free; the
oneDNN linear op would copy it). bf16 already routes to oneDNN through plain `torch.mm`/`F.linear`.
CUDA, float64 and anything else use `F.linear` / `torch.mm`. Neither helper records autograd; they
are called inside the custom autograd Function.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

_ONEDNN_LINEAR = (
    getattr(torch.ops.mkldnn, "_linear_pointwise", None) if torch.backends.mkldnn.is_available() else None
)


def use_onednn_fp32(t: torch.Tensor) -> bool:
    return _ONEDNN_LINEAR is not None and t.device.type == "cpu" and t.dtype == torch.float32


def linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x (..., K) @ w (N, K).T -> (..., N), no bias."""
    if use_onednn_fp32(x):
        return _ONEDNN_LINEAR(x, w, None, "none", [], "")
    return F.linear(x, w)


def grad_weight(dy: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """dy (N, O).T @ x (N, I) -> (O, I): the after-loop weight gradient, summed over all N tokens."""
    return torch.mm(dy.t(), x)
