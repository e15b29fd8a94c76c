"""The mLSTM time loop on CUDA GPUs: the op (autograd Functions) around the Triton kernels.

Same function, parameters and precision rules as `mlstm_core.MLSTMFunction` (the reference and test oracle)
and the CPU op (`fused_core`): before the loop ONE product (T*B, D) x (D, 5H) gives both input projections;
the loop itself runs through one of the loops of app/model/gpu_loops.py (step, cublas, persistent, splitk), the
fastest for the shape as app/model/gpu_tuning.py measured it; after the loop one product per weight
gradient over all T*B tokens (d(w_in) and dx one product each, K = 5H).

    TritonMLSTMFunction   (x, w_in, bias, w_mh, w_m) -> h, from a zero state
    TritonMLSTMFromState  (x, w_in, bias, w_mh, w_m, h_0, c_0) -> (h, c_T), weight gradients only (the state
                          enters as a constant: --carry-state, dynamic evaluation)
    prefill               inference from a zero or given state: h and each row's state after its length

Triton is optional (`pip install .[gpu]`; CUDA builds of torch bring it): `available()` says why not.
"""

from __future__ import annotations

import re

import torch

from app.model import gpu_tuning, wgrad_overlap
from app.model.gpu_tiles import interpreting
from app.model.matmul import grad_weight, linear

DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)
# The oldest release tested: tl.dot takes float64 operands from 3.5 on (3.2-3.4 refuse them). torch 2.6-2.8's
# CUDA builds bring 3.2-3.4: with those the dispatcher runs the reference core, and says why.
TRITON_MIN = (3, 5)


def too_old(version: str) -> bool:
    """A triton release (``triton.__version__``: "3.4.0", "3.5.0+git1234") below TRITON_MIN."""
    return tuple(int(p) for p in re.findall(r"\d+", version)[:2]) < TRITON_MIN


def available(x: torch.Tensor, w: torch.Tensor) -> str | None:
    """None when this core runs these operands, else why not (one line)."""
    if x.device.type != "cuda" and not interpreting():
        return f"the Triton core runs on CUDA devices, got {x.device.type}"
    if w.dtype not in DTYPES:
        return f"the Triton core takes float32/float64/bfloat16/float16 operands, got {w.dtype}"
    try:
        import triton
    except ImportError as e:
        return f"triton is not installed ({e}); pip install 'mlstm-ds[gpu]'"
    if too_old(triton.__version__):
        want = ".".join(map(str, TRITON_MIN))
        return (
            f"the Triton core needs triton>={want} (float64 tl.dot), found {triton.__version__}; "
            "pip install 'mlstm-ds[gpu]'"
        )
    return None


def _forward(x, w_in, bias, w_mh, w_m, state, choice: gpu_tuning.Choice) -> tuple[dict, torch.Tensor]:
    """Run the shape's forward loop from `state` (None: zero; falling back to the next loop of the ranking
    where one fails, gpu_tuning.run); returns (buffers, xt (T*B, D))."""
    B, T, D = x.shape
    H = w_mh.shape[0]
    sdt, cdt = bias.dtype, w_mh.dtype
    kw = dict(device=x.device)
    xt = x.transpose(0, 1).reshape(T * B, D)  # (T*B, D): one step's rows contiguous
    proj = linear(xt, w_in).view(T, B, 5 * H).to(sdt)  # (T, B, 5H) [W_mx x | W_x x]
    bufs = dict(
        w_mh=w_mh.contiguous(),
        w_m=w_m.contiguous(),
        pm=proj[..., :H].contiguous(),  # (T, B, H)
        pg=(proj[..., H:] + bias).contiguous(),  # (T, B, 4H) W_x x_t + b
        hs=torch.empty(T + 1, B, H, dtype=cdt, **kw),  # h_0 .. h_T
        cs=torch.empty(T + 1, B, H, dtype=sdt, **kw),  # c_0 .. c_T
        rs=torch.empty(T, B, H, dtype=sdt, **kw),
        ms=torch.empty(T, B, H, dtype=cdt, **kw),
        gates=torch.empty(T, B, 4 * H, dtype=sdt, **kw),
        tcs=torch.empty(T, B, H, dtype=sdt, **kw),
    )
    if state is None:
        bufs["hs"][0].zero_()
        bufs["cs"][0].zero_()
    else:
        bufs["hs"][0].copy_(state[0])
        bufs["cs"][0].copy_(state[1])
    gpu_tuning.run(choice, True, bufs, B, T, H)
    return bufs, xt


def _loops(ctx, x: torch.Tensor, w_mh: torch.Tensor) -> gpu_tuning.Choice:
    """The tuned loops for this call (the backward's timed too only where a gradient will be asked for)."""
    loops = gpu_tuning.loops_for(x, w_mh, backward=any(ctx.needs_input_grad), op=run_op)
    if loops.fwd is None:  # core="fused" on a device where no loop runs ("auto" runs the reference instead)
        raise RuntimeError(f"core='fused': {_why_none(loops)}")
    return loops


def _why_none(loops: gpu_tuning.Choice) -> str:
    """Why no loop runs: the tuner's reason, or that every loop of the ranking failed in this process."""
    return loops.times.get("failed", f"every GPU loop of this shape failed in this process ({loops.times})")


def _save(ctx, bufs: dict, xt: torch.Tensor, w_in: torch.Tensor, choice: gpu_tuning.Choice) -> None:
    ctx.choice = choice
    ctx.save_for_backward(*_kept(bufs, xt, w_in))


def _kept(b: dict, xt: torch.Tensor, w_in: torch.Tensor) -> tuple:
    """What the backward needs of the forward (`_grads`' arguments after dy)."""
    return xt, w_in, b["w_mh"], b["w_m"], b["pm"], b["gates"], b["cs"], b["tcs"], b["rs"], b["ms"], b["hs"]


def _backward(ctx, dy: torch.Tensor) -> tuple:
    """(dx, d(w_in), d(bias), d(w_mh), d(w_m)) of the saved forward."""
    return _grads(ctx.choice, dy, *ctx.saved_tensors, need_dx=ctx.needs_input_grad[0])


def _grads(choice, dy, xt, w_in, w_mh, w_m, pm, gates, cs, tcs, rs, ms, hs, need_dx: bool) -> tuple:
    """The backward loop (the choice's, falling back as gpu_tuning.run does) and the products after it."""
    T, B, H = pm.shape
    D = xt.shape[1]
    cdt, sdt = w_mh.dtype, cs.dtype
    kw = dict(device=xt.device)
    bufs = dict(
        w_mh_t=w_mh.t().contiguous(), w_m_t=w_m.t().contiguous(), pm=pm, gates=gates, cs=cs, tcs=tcs, rs=rs,
        dy=torch.empty(T, B, H, dtype=sdt, **kw).copy_(dy.transpose(0, 1)),  # (T, B, H), a copy of its own
        dp=torch.empty(T, B, 5 * H, dtype=cdt, **kw),  # [d(pm) | dG] per row: w_in's row order
        dr=torch.empty(T, B, H, dtype=cdt, **kw),
        dc=torch.zeros(B, H, dtype=sdt, **kw),
    )  # fmt: skip
    if n := wgrad_overlap.chunks():  # the weight gradients overlapped with the loop, in time pieces
        return wgrad_overlap.backward(choice, bufs, xt, w_in, ms, hs[:-1], need_dx, n)
    gpu_tuning.run(choice, False, bufs, B, T, H)
    N = T * B
    dP2 = bufs["dp"].view(N, 5 * H)
    dG2 = dP2[:, H:]  # (N, 4H)
    d_w_m = grad_weight(dG2, ms.view(N, H))  # (4H, H)
    d_w_mh = grad_weight(bufs["dr"].view(N, H), hs[:-1].reshape(N, H))  # (H, H)
    d_bias = dG2.sum(dim=0, dtype=sdt)  # (4H,)
    d_w_in = grad_weight(dP2, xt)  # (5H, D): both input projections in one product
    dx = None
    if need_dx:
        dx = linear(dP2, w_in.t().contiguous()).view(T, B, D).transpose(0, 1)  # (B, T, D), K = 5H
    return dx, d_w_in, d_bias, d_w_mh, d_w_m


def run_op(choice: gpu_tuning.Choice, leaves: list, dy: torch.Tensor | None) -> None:
    """The op's forward (x, w_in, bias, w_mh, w_m) -> h with `choice`'s loops and, given dy, its backward: the
    code TritonMLSTMFunction runs, without autograd's bookkeeping (the tuner times candidates through it)."""
    x, w_in, bias, w_mh, w_m = leaves
    bufs, xt = _forward(x, w_in, bias, w_mh, w_m, None, choice)
    bufs["hs"][1:].transpose(0, 1).contiguous()  # the op's output, as the Function hands it on
    if dy is not None:
        _grads(choice, dy, *_kept(bufs, xt, w_in), need_dx=True)


class TritonMLSTMFunction(torch.autograd.Function):
    """(x, w_in, bias, w_mh, w_m) -> h, exactly `MLSTMFunction`'s contract; bias arrives in the state dtype."""

    @staticmethod
    def forward(ctx, x, w_in, bias, w_mh, w_m):
        loops = _loops(ctx, x, w_mh)
        bufs, xt = _forward(x, w_in, bias, w_mh, w_m, None, loops)
        _save(ctx, bufs, xt, w_in, loops)
        return bufs["hs"][1:].transpose(0, 1).contiguous()  # (B, T, H)

    @staticmethod
    def backward(ctx, dy):
        return _backward(ctx, dy)


class TritonMLSTMFromState(torch.autograd.Function):
    """(x, w_in, bias, w_mh, w_m, h_0, c_0) -> (h (B, T, H), c_T (B, H)): `MLSTMFromState`'s contract. The
    state enters as a constant and c_T leaves without a gradient; the backward reads h_0 and c_0 from the
    saved hs[0] / cs[0]."""

    @staticmethod
    def forward(ctx, x, w_in, bias, w_mh, w_m, h0, c0):
        loops = _loops(ctx, x, w_mh)
        bufs, xt = _forward(x, w_in, bias, w_mh, w_m, (h0, c0), loops)
        _save(ctx, bufs, xt, w_in, loops)
        c_last = bufs["cs"][-1].clone()  # (B, H)
        ctx.mark_non_differentiable(c_last)
        return bufs["hs"][1:].transpose(0, 1).contiguous(), c_last

    @staticmethod
    def backward(ctx, dy, _dc_last):
        return (*_backward(ctx, dy), None, None)


@torch.no_grad()
def prefill(x, lengths, w_in, bias, w_mh, w_m, state=None) -> tuple[torch.Tensor, tuple]:
    """Inference: x (B, T, in) from `state` (zero when None) -> (h (B, T, H), (h, c) after row b's first
    lengths[b] steps); `mlstm_core.mlstm_prefill`'s contract, through the forward loop alone."""
    loops = gpu_tuning.loops_for(x, w_mh, backward=False, op=run_op)
    if loops.fwd is None:
        raise RuntimeError(f"core='fused': {_why_none(loops)}")
    bufs, _ = _forward(x, w_in, bias, w_mh, w_m, state, loops)
    rows = torch.arange(x.shape[0], device=x.device)
    lengths = lengths.to(x.device)
    hs, cs = bufs["hs"], bufs["cs"]
    return hs[1:].transpose(0, 1), (hs[lengths, rows], cs[lengths, rows])
