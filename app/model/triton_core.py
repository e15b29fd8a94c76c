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

import functools
import logging
import re

import torch

from app.model import gpu_health, gpu_tuning, op_graph, wgrad_overlap
from app.model.gpu_tiles import interpreting
from app.model.matmul import grad_weight, linear

DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)
# The oldest release tested: tl.dot takes float64 operands from 3.5 on (3.2-3.4 refuse them). torch 2.6-2.8's
# CUDA builds bring 3.2-3.4: with those the dispatcher runs the reference core, and says why.
TRITON_MIN = (3, 5)
log = logging.getLogger(__name__)


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


def _overlap(choice: gpu_tuning.Choice) -> int:
    """The time chunks of the overlapped backward (0: none): MLSTM_WGRAD_OVERLAP's, else the shape's choice."""
    forced = wgrad_overlap.chunks()
    return forced if forced is not None else choice.wgrad_chunks or 0


def _graph_why_not(choice: gpu_tuning.Choice, device) -> str | None:
    """Why the op does not run as CUDA graphs here (app/model/op_graph.py), or None."""
    if _overlap(choice):
        return "the weight gradients overlap the loop on a side stream (the shape's choice, or MLSTM_WGRAD_OVERLAP)"
    if gpu_health.host_wait():
        return "MLSTM_BARRIER_HOST_WAIT=1 waits on the host after each persistent launch"
    return op_graph.why_not(device)


def _graphed(choice: gpu_tuning.Choice, t: torch.Tensor) -> bool:
    """Whether this call runs through the op's graphs: the tuner chose them for the shape, and they run here."""
    return bool(choice.op_graph) and _graph_why_not(choice, t.device) is None


def _through_graph(choice: gpu_tuning.Choice, tag: tuple, fn, inputs: list, strict: bool) -> list:
    """fn(*inputs) from the op's graph (op_graph.call); where a capture or a replay fails, the shape runs without
    graphs from now on (one warning line) and this call eagerly, or (`strict`: the tuner's timing) it raises."""
    loop = (
        choice.fwd if tag[0] == "fwd" else choice.bwd
    )  # the direction's own loop (a dropped one: recaptured)
    try:
        return op_graph.call(
            id(choice), (*tag, loop.label if loop else None, gpu_health.generation()), fn, inputs
        )
    except op_graph.GraphFailed as e:
        if strict:
            raise
        choice.op_graph = False
        op_graph.forget(id(choice))
        log.warning("the mLSTM GPU core's whole-op CUDA graph failed (%s): the shape runs without it", e)
        return list(fn(*inputs))


def _fwd_outputs(choice: gpu_tuning.Choice, x, w_in, bias, w_mh, w_m, *state) -> tuple:
    """The forward as a function of tensors (op_graph can replay it): h (B, T, H), c_T (B, H), xt and the
    loop's buffers the backward keeps (pm, gates, cs, tcs, rs, ms, hs)."""
    bufs, xt = _forward(x, w_in, bias, w_mh, w_m, tuple(state) or None, choice)
    h = bufs["hs"][1:].transpose(0, 1).contiguous()  # (B, T, H)
    return (h, bufs["cs"][-1].clone(), xt, *(bufs[n] for n in ("pm", "gates", "cs", "tcs", "rs", "ms", "hs")))


def _run_forward(choice: gpu_tuning.Choice, leaves: list, state: tuple, grad: bool, strict: bool = False):
    """(h, c_T, what the backward keeps: `_grads`' arguments after dy), through the op's graph where the
    shape's choice has one and a gradient will be asked for (`grad`), else eagerly."""
    x, w_in, _, w_mh, w_m = leaves
    fn = functools.partial(_fwd_outputs, choice)
    inputs = [*leaves, *state]
    if grad and _graphed(choice, x):
        outs = _through_graph(choice, ("fwd", len(state)), fn, inputs, strict)
    else:
        outs = fn(*inputs)
    h, c_last, xt, *acts = outs
    return h, c_last, (xt, w_in, w_mh.contiguous(), w_m.contiguous(), *acts)


def _grad_outputs(choice: gpu_tuning.Choice, need_dx: bool, dy, *kept) -> tuple:
    """The backward as a function of tensors: (dx,) d(w_in), d(bias), d(w_mh), d(w_m) (dx where asked for)."""
    dx, *grads = _grads(choice, dy, *kept, need_dx=need_dx)
    return (dx, *grads) if need_dx else tuple(grads)


def _run_backward(choice: gpu_tuning.Choice, dy, kept: tuple, need_dx: bool, strict: bool = False) -> tuple:
    """(dx or None, d(w_in), d(bias), d(w_mh), d(w_m)) of a forward's kept tensors, through the op's graph
    where the shape's choice has one, else eagerly."""
    fn = functools.partial(_grad_outputs, choice, need_dx)
    inputs = [dy, *kept]
    outs = (
        _through_graph(choice, ("bwd", need_dx), fn, inputs, strict) if _graphed(choice, dy) else fn(*inputs)
    )
    return tuple(outs) if need_dx else (None, *outs)


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
    if n := _overlap(choice):  # the weight gradients overlapped with the loop, in time pieces
        run_piece = lambda piece, steps: gpu_tuning.run(choice, False, piece, B, steps, H)  # noqa: E731
        return wgrad_overlap.backward(run_piece, bufs, xt, w_in, ms, hs[:-1], need_dx, n)
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


def run_op(choice: gpu_tuning.Choice, leaves: list, dy: torch.Tensor | None) -> tuple:
    """The op's forward (x, w_in, bias, w_mh, w_m) -> h with `choice`'s loops and, given dy, its backward: the
    code TritonMLSTMFunction runs, without autograd's bookkeeping (the tuner times and checks candidates
    through it). With choice.op_graph, through the op's CUDA graphs as training runs them (raises where they
    cannot run: op_graph.Unavailable, or a capture that fails); with choice.wgrad_chunks, the weight gradients
    overlapped with the loop (app/model/wgrad_overlap.py). -> (h, (dx, d(w_in), d(bias), d(w_mh), d(w_m))
    or None)."""
    if choice.op_graph and (why := _graph_why_not(choice, leaves[0].device)):
        raise op_graph.Unavailable(why)
    h, _, kept = _run_forward(choice, leaves, (), grad=True, strict=True)
    grads = _run_backward(choice, dy, kept, need_dx=True, strict=True) if dy is not None else None
    return h, grads


class TritonMLSTMFunction(torch.autograd.Function):
    """(x, w_in, bias, w_mh, w_m) -> h, exactly `MLSTMFunction`'s contract; bias arrives in the state dtype."""

    @staticmethod
    def forward(ctx, x, w_in, bias, w_mh, w_m):
        loops = _loops(ctx, x, w_mh)
        h, _, kept = _run_forward(loops, [x, w_in, bias, w_mh, w_m], (), any(ctx.needs_input_grad))
        ctx.choice = loops
        ctx.save_for_backward(*kept)
        return h

    @staticmethod
    def backward(ctx, dy):
        return _run_backward(ctx.choice, dy, ctx.saved_tensors, ctx.needs_input_grad[0])


class TritonMLSTMFromState(torch.autograd.Function):
    """(x, w_in, bias, w_mh, w_m, h_0, c_0) -> (h (B, T, H), c_T (B, H)): `MLSTMFromState`'s contract. The
    state enters as a constant and c_T leaves without a gradient; the backward reads h_0 and c_0 from the
    saved hs[0] / cs[0]."""

    @staticmethod
    def forward(ctx, x, w_in, bias, w_mh, w_m, h0, c0):
        loops = _loops(ctx, x, w_mh)
        h, c_last, kept = _run_forward(loops, [x, w_in, bias, w_mh, w_m], (h0, c0), any(ctx.needs_input_grad))
        ctx.choice = loops
        ctx.save_for_backward(*kept)
        ctx.mark_non_differentiable(c_last)
        return h, c_last

    @staticmethod
    def backward(ctx, dy, _dc_last):
        return (*_run_backward(ctx.choice, dy, ctx.saved_tensors, ctx.needs_input_grad[0]), None, None)


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
