"""The backward's weight-gradient products overlapped with its time loop, where the tuner measured that it pays
(app/model/gpu_ranking.rank_paths: AUTO_CHUNKS time chunks), or everywhere with MLSTM_WGRAD_OVERLAP=N (0: off).

Without it the GPU core's backward runs the whole time loop, then five products over all T*B
rows (d(w_m), d(w_mh), d(bias), d(w_in), dx: app/model/triton_core.py). With N chunks the loop runs over the
time steps in N pieces, the latest first (the dc carry left in its buffer from one piece to the next, the
piece's last step given d(r) of the step after it through dy: dy_{b-1} += d(r_b) W_mh), and as each piece
finishes, its rows' products start on a side CUDA stream while the loop goes on with the next piece; the main
stream waits for them once, at the end. The products sum into float32 accumulators (float64 for float64
operands), cast to the weights' dtype at the end. The same gradients as without overlap, up to the order of
the sums (tests/test_model_wgrad_overlap.py: against the float64 reference, every loop, in Triton's
interpreter, where a side stream is none). Whether it pays is measured per shape by the tuner, and on a GPU at
2, 4 and 8 chunks by bench/wgrad_overlap.py; graphed loops run their pieces eagerly (a piece carries its dc in, which a captured graph zeroes).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable

import torch

from app.common.errors import UserError

_side: dict[torch.device, torch.cuda.Stream] = {}


AUTO_CHUNKS = 4  # the time chunks the tuner tries where MLSTM_WGRAD_OVERLAP leaves it to it


def chunks() -> int | None:
    """MLSTM_WGRAD_OVERLAP: the time chunks of the overlapped backward for every shape (0: off); None where it is
    unset or "auto" (the tuner's choice per shape, app/model/gpu_ranking.rank_paths)."""
    raw = os.environ.get("MLSTM_WGRAD_OVERLAP", "auto")
    if raw in ("", "auto"):
        return None
    try:
        n = int(raw)
    except ValueError:
        n = -1
    if n < 0:
        raise UserError(f"MLSTM_WGRAD_OVERLAP must be a number of time chunks (0: off) or auto, got {raw!r}")
    return n


def bounds(T: int, n: int) -> list[tuple[int, int]]:
    """The time pieces [a, b), latest first, as even as they come (n capped at T)."""
    n = max(1, min(n, T))
    edges = [T * i // n for i in range(n + 1)]
    return [(edges[i], edges[i + 1]) for i in range(n - 1, -1, -1)]


def _streams(device: torch.device):
    """(main, side) CUDA streams of `device`; (None, None) off CUDA (the products then run in line)."""
    if device.type != "cuda":
        return None, None
    if device not in _side:
        _side[device] = torch.cuda.Stream(device)
    return torch.cuda.current_stream(device), _side[device]


def backward(run_piece: Callable[[dict, int], None], bufs: dict, xt: torch.Tensor, w_in: torch.Tensor,
             ms: torch.Tensor, hs: torch.Tensor, need_dx: bool, n: int) -> tuple:  # fmt: skip
    """triton_core._grads' results, (dx, d(w_in), d(bias), d(w_mh), d(w_m)), with the loop in `n` time pieces
    and each piece's products on the side stream. `run_piece(piece, steps)` runs the backward loop over a
    piece's buffers (the shape's loop, falling back as gpu_tuning.run does). `bufs`: the backward loop's
    buffers (dy a private copy: its rows at the pieces' edges are added to)."""
    dy, dp, dr = bufs["dy"], bufs["dp"], bufs["dr"]
    T, B, H = dy.shape
    D, dev, cdt, sdt = xt.shape[1], dy.device, dp.dtype, bufs["cs"].dtype
    acc = torch.float64 if cdt == torch.float64 else torch.float32
    kw = dict(dtype=acc, device=dev)
    grads = dict(w_m=torch.zeros(4 * H, H, **kw), w_mh=torch.zeros(H, H, **kw), bias=torch.zeros(4 * H, **kw),
                 w_in=torch.zeros(5 * H, D, **kw))  # fmt: skip
    dx_t = torch.empty(T, B, D, dtype=cdt, device=dev) if need_dx else None
    w_mh = bufs["w_mh_t"].t()  # (H, H) W_mh
    main, side = _streams(dev)
    bufs["dc"].zero_()
    for a, b in bounds(T, n):
        if b < T:  # the piece's last step: d(r) of the step after it, which the piece does not hold
            dy[b - 1].add_(
                torch.mm(dr[b].to(dy.dtype), w_mh.to(dy.dtype))
            )  # (B, H) d(r_b) W_mh, as the loop does
        piece = {k: bufs[k][a:b] for k in ("pm", "gates", "tcs", "rs", "dy", "dp", "dr")}
        piece.update(w_mh_t=bufs["w_mh_t"], w_m_t=bufs["w_m_t"], cs=bufs["cs"][a : b + 1], dc=bufs["dc"],
                     dc_carry=bufs["dc"])  # fmt: skip
        run_piece(piece, b - a)
        if side is not None:
            side.wait_stream(main)  # the piece's outputs are written
        with torch.cuda.stream(side) if side is not None else contextlib.nullcontext():
            dx = dx_t[a:b] if need_dx else None
            _products(grads, dx, dp[a:b], dr[a:b], ms[a:b], hs[a:b], xt[a * B : b * B], w_in, H)
    if side is not None:
        main.wait_stream(side)  # once: every product is in before the gradients are handed on
    dx = dx_t.transpose(0, 1) if need_dx else None
    return (
        dx,
        grads["w_in"].to(w_in.dtype),
        grads["bias"].to(sdt),
        grads["w_mh"].to(cdt),
        grads["w_m"].to(cdt),
    )


def _products(grads: dict, dx, dp, dr, ms, hs, xt, w_in, H: int) -> None:
    """One piece's share of each weight gradient (its N = steps x B rows), added to the accumulators; its rows
    of dx (steps, B, D) written."""
    N = dp.shape[0] * dp.shape[1]
    dP2 = dp.reshape(N, 5 * H)  # [d(pm) | dG] per row: w_in's row order
    dG2 = dP2[:, H:]
    acc = grads["w_m"].dtype
    grads["w_m"] += torch.mm(dG2.t(), ms.reshape(N, H)).to(acc)  # (4H, H)
    grads["w_mh"] += torch.mm(dr.reshape(N, H).t(), hs.reshape(N, H)).to(acc)  # (H, H)
    grads["bias"] += dG2.sum(dim=0, dtype=acc)
    grads["w_in"] += torch.mm(dP2.t(), xt).to(acc)  # (5H, D)
    if dx is not None:
        torch.mm(dP2, w_in, out=dx.view(N, -1))  # (N, D) = dP (N, 5H) W_in (5H, D)
