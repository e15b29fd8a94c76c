"""The mLSTM time loop on CUDA GPUs, in Triton (kernels: app/model/triton_kernels.py).

Same function, parameters and precision rules as `mlstm_core.MLSTMFunction` (the reference and test oracle)
and the CPU op (`fused_core`): before the loop ONE product (T*B, D) x (D, 5H) gives both input projections;
per step 2 kernels forward and 2 backward, each a GEMM with the elementwise work in its epilogue; after the
loop one product per weight gradient over all T*B tokens (d(w_in) and dx one product each, K = 5H).

On CUDA the T-step loop (2T kernel launches each way) is captured once per (B, T, H, dtype) as a CUDA graph
and replayed: at small B a step is launch-bound, and a replay costs one launch per sequence. The graphs
read their inputs from static buffers (the weights and the projections are copied in before each replay)
and their outputs are copied out (a training step keeps several micro-batches' buffers alive until their
backward). At most GRAPH_CACHE graphs are kept (least recently used dropped); `MLSTM_CUDA_GRAPHS=0` turns
them off. A shape's first call runs eagerly (it compiles the kernels), its second captures.

Triton is optional (`pip install .[gpu]`; CUDA builds of torch bring it): `available()` says why not.
"""

from __future__ import annotations

import collections
import os
import re
from collections.abc import Callable

import torch

from app.model.matmul import grad_weight, linear

GRAPH_CACHE = int(os.environ.get("MLSTM_GRAPH_CACHE", "8"))
DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)
# The oldest release tested: tl.dot takes float64 operands from 3.5 on (3.2-3.4 refuse them). torch 2.6-2.8's
# CUDA builds bring 3.2-3.4: with those the dispatcher runs the reference core, and says why.
TRITON_MIN = (3, 5)
_graphs: collections.OrderedDict = collections.OrderedDict()  # key -> _Graph, least recently used first
_seen: set = set()  # keys run once eagerly (their kernels are compiled): the next call captures


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def _kernels():
    from app.model import triton_kernels

    return triton_kernels


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
        have = _kernels().triton.__version__
    except ImportError as e:
        return f"triton is not installed ({e}); pip install 'mlstm-ds[gpu]'"
    if too_old(have):
        want = ".".join(map(str, TRITON_MIN))
        return f"the Triton core needs triton>={want} (float64 tl.dot), found {have}; pip install 'mlstm-ds[gpu]'"
    return None


def _config(B: int, H: int, dtype: torch.dtype) -> dict:
    """Tile sizes and precision flags. tl.dot needs every tile side >= 16; at tiny sizes 32-wide blocks
    keep the interpreter fast (it runs programs one by one)."""
    tl = _kernels().tl
    bm = min(64, max(16, triton_next_pow2(B)))
    bn = 32 if H <= 512 or interpreting() else 64
    acc = tl.float64 if dtype == torch.float64 else tl.float32
    # fp32 operands: full fp32 products unless torch allows tf32 (the same switch cuBLAS follows)
    tf32 = dtype == torch.float32 and torch.backends.cuda.matmul.allow_tf32 and not interpreting()
    return dict(
        BM=bm,
        BN=bn,
        BK=32,
        UPCAST=interpreting() and dtype in (torch.bfloat16, torch.float16),
        ACC=acc,
        PREC="tf32" if tf32 else "ieee",
    )


def triton_next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def _forward_loop(bufs: dict, B: int, T: int, H: int, cfg: dict) -> None:
    """The T steps: 2 launches each (r / m, then the gates and cell)."""
    k = _kernels()
    grid = (-(-B // cfg["BM"]), -(-H // cfg["BN"]))
    w_mh, w_m, pm, pg = bufs["w_mh"], bufs["w_m"], bufs["pm"], bufs["pg"]
    for t in range(T):
        k.fwd_r[grid](bufs["hs"], w_mh, pm, bufs["rs"], bufs["ms"], t, B, H, **cfg)
        k.fwd_gates[grid](
            bufs["ms"],
            w_m,
            pg,
            bufs["gates"],
            bufs["cs"],
            bufs["tcs"],
            bufs["hs"],
            t,
            B,
            H,
            pg.stride(1),
            **cfg,
        )


def _backward_loop(bufs: dict, B: int, T: int, H: int, cfg: dict) -> None:
    """The T steps in reverse: step t's gate derivatives ride in the epilogue of the dh product."""
    k = _kernels()
    grid = (-(-B // cfg["BM"]), -(-H // cfg["BN"]))
    g = (bufs["gates"], bufs["cs"], bufs["tcs"], bufs["dc"], bufs["dP"])
    bufs["dc"].zero_()
    k.bwd_h[grid](bufs["dR"], bufs["w_mh"], bufs["dy"], *g, T - 1, B, H, WITH_DOT=False, **cfg)
    for t in range(T - 1, -1, -1):
        k.bwd_m[grid](bufs["dP"], bufs["w_m"], bufs["rs"], bufs["pm"], bufs["dR"], t, B, H, **cfg)
        if t > 0:
            k.bwd_h[grid](bufs["dR"], bufs["w_mh"], bufs["dy"], *g, t - 1, B, H, WITH_DOT=True, **cfg)


class _Graph:
    """One captured loop with its static buffers."""

    def __init__(self, bufs: dict, run: Callable[[dict], None]) -> None:
        self.bufs = {name: b.clone() for name, b in bufs.items()}
        torch.cuda.synchronize()
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            run(self.bufs)

    def replay(self, bufs: dict, inputs: tuple[str, ...], outputs: tuple[str, ...]) -> None:
        for name in inputs:
            self.bufs[name].copy_(bufs[name])
        self.graph.replay()
        for name in outputs:
            bufs[name].copy_(self.bufs[name])


def _run(kind: str, bufs: dict, inputs: tuple, outputs: tuple, B: int, T: int, H: int, cfg: dict) -> None:
    """Run a loop eagerly, or through its CUDA graph once its kernels are compiled."""
    loop = _forward_loop if kind == "fwd" else _backward_loop

    def run(b: dict) -> None:
        loop(b, B, T, H, cfg)

    on_cuda = bufs["w_mh"].is_cuda and not interpreting()
    if not on_cuda or GRAPH_CACHE <= 0 or os.environ.get("MLSTM_CUDA_GRAPHS", "1") == "0":
        return run(bufs)
    key = (kind, B, T, H, bufs["w_mh"].dtype, bufs["w_mh"].device.index)
    if key not in _graphs:
        if key not in _seen:
            _seen.add(key)
            return run(bufs)
        if len(_graphs) >= GRAPH_CACHE:
            _graphs.popitem(last=False)
        _graphs[key] = _Graph(bufs, run)
    _graphs.move_to_end(key)
    _graphs[key].replay(bufs, inputs, outputs)


class TritonMLSTMFunction(torch.autograd.Function):
    """(x, w_in, bias, w_mh, w_m) -> h, exactly `MLSTMFunction`'s contract; bias arrives in the state dtype."""

    @staticmethod
    def forward(ctx, x, w_in, bias, w_mh, w_m):
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
            hs=torch.zeros(T + 1, B, H, dtype=cdt, **kw),  # h_0 .. h_T
            cs=torch.zeros(T + 1, B, H, dtype=sdt, **kw),  # c_0 .. c_T
            rs=torch.empty(T, B, H, dtype=sdt, **kw),
            ms=torch.empty(T, B, H, dtype=cdt, **kw),
            gates=torch.empty(T, B, 4 * H, dtype=sdt, **kw),
            tcs=torch.empty(T, B, H, dtype=sdt, **kw),
        )
        cfg = _config(B, H, cdt)
        _run("fwd", bufs, ("w_mh", "w_m", "pm", "pg"), ("hs", "cs", "rs", "ms", "gates", "tcs"), B, T, H, cfg)
        b = bufs
        ctx.save_for_backward(
            xt, w_in, b["w_mh"], b["w_m"], b["pm"], b["gates"], b["cs"], b["tcs"], b["rs"], b["ms"], b["hs"]
        )
        return b["hs"][1:].transpose(0, 1).contiguous()  # (B, T, H)

    @staticmethod
    def backward(ctx, dy):
        xt, w_in, w_mh, w_m, pm, gates, cs, tcs, rs, ms, hs = ctx.saved_tensors
        T, B, H = pm.shape
        D = xt.shape[1]
        cdt, sdt = w_mh.dtype, cs.dtype
        kw = dict(device=xt.device)
        bufs = dict(
            w_mh=w_mh, w_m=w_m, pm=pm, gates=gates, cs=cs, tcs=tcs, rs=rs,
            dy=dy.transpose(0, 1).to(sdt).contiguous(),  # (T, B, H)
            dP=torch.empty(T, B, 5 * H, dtype=cdt, **kw),  # [d(pm) | dG] per row: w_in's row order
            dR=torch.empty(T, B, H, dtype=cdt, **kw),
            dc=torch.zeros(B, H, dtype=sdt, **kw),
        )  # fmt: skip
        cfg = _config(B, H, cdt)
        ins = ("w_mh", "w_m", "pm", "gates", "cs", "tcs", "rs", "dy")
        _run("bwd", bufs, ins, ("dP", "dR"), B, T, H, cfg)
        N = T * B
        dP2 = bufs["dP"].view(N, 5 * H)
        dG2 = dP2[:, H:]  # (N, 4H)
        d_w_m = grad_weight(dG2, ms.view(N, H))  # (4H, H)
        d_w_mh = grad_weight(bufs["dR"].view(N, H), hs[:-1].reshape(N, H))  # (H, H)
        d_bias = dG2.sum(dim=0, dtype=sdt)  # (4H,)
        d_w_in = grad_weight(dP2, xt)  # (5H, D): both input projections in one product
        dx = None
        if ctx.needs_input_grad[0]:
            dx = linear(dP2, w_in.t().contiguous()).view(T, B, D).transpose(0, 1)  # (B, T, D), K = 5H
        return dx, d_w_in, d_bias, d_w_mh, d_w_m
