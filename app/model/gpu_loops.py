"""Four ways to run the mLSTM time loop on a GPU, over the same buffers and the same kernels
(app/model/triton_kernels.py); app/model/gpu_tuning.py times them per shape and keeps the fastest.

    step        two Triton launches per step each way, the product in the kernel (its gate / cell math in
                the epilogue); the T-step loop replayed as a CUDA graph
    cublas      per step, cuBLAS products (torch.mm) and the same kernels with the product read back
                (USE_DOT off: only their epilogues run); replayed as a CUDA graph
    persistent  ONE launch per sequence each way: a cooperative grid of at most the SM count loops over
                the steps with a grid barrier between phases; no graph, nothing captured per length
    splitk      the persistent loop, its backward's K = 4H phase split over K (a third phase sums the
                slices, in a fixed order): a backward-only candidate

Buffers (dicts of tensors; forward: hs, cs, w_mh, w_m, pm, pg, rs, ms, gates, tcs; backward: dr, w_mh_t,
w_m_t, dy, gates, cs, tcs, dc, dp, rs, pm) are described in triton_kernels.py. Graphs: one per (loop,
direction, B, T, H, dtype, device), all of a (loop, direction, B, H, dtype, device) sharing ONE arena of
static buffers sized for the longest T seen, so a new length costs a capture (the kernel nodes), not a copy
of every buffer; inputs are copied into the arena before a replay and outputs out after it (a training step
keeps several micro-batches' buffers alive until their backward). At most GRAPH_CACHE graphs and MAX_ARENAS
arenas are kept (the least recently used go first).
"""

from __future__ import annotations

import collections
import os
from collections.abc import Callable
from dataclasses import dataclass

import torch

GRAPH_CACHE = int(os.environ.get("MLSTM_GRAPH_CACHE", "64"))
MAX_ARENAS = 4  # (loop, direction, B, H, dtype, device) shapes whose buffers are kept for their graphs
MAX_SPIN = 1 << 22  # grid-barrier polls before a program gives up (seconds of waiting, never forever)
FWD_IN = ("w_mh", "w_m", "pm", "pg")  # and row 0 of hs / cs (the initial state)
FWD_OUT = ("hs", "cs", "rs", "ms", "gates", "tcs")
BWD_IN = ("w_mh_t", "w_m_t", "dy", "gates", "cs", "tcs", "rs", "pm")
BWD_OUT = ("dp", "dr")
TIME_PLUS_ONE = ("hs", "cs")  # (T + 1, B, ...): step 0's state first
TIMED = ("pm", "pg", "rs", "ms", "gates", "tcs", "dy", "dp", "dr")  # (T, B, ...)


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def _k():
    from app.model import triton_kernels

    return triton_kernels


@dataclass(frozen=True)
class Tiles:
    """Tile sizes of the phases (batch rows BB, units BU; a forward phase-2 / backward phase-1 tile holds 4 BU
    weight rows), the K step, the launch's warps and pipeline depth. The backward's phase 1 (and phase 3)
    takes the forward phase 1's tiles, its phase 2 `bb_m` x `bu_m` (0: the forward phase 2's), split `split`
    ways over K (1: not split)."""

    bb_r: int
    bu_r: int
    bb_g: int
    bu_g: int
    bk: int
    warps: int = 4
    stages: int = 3
    bb_m: int = 0
    bu_m: int = 0
    split: int = 1

    def n_r(self, B: int, H: int) -> int:
        return -(-B // self.bb_r) * -(-H // self.bu_r)

    def n_g(self, B: int, H: int) -> int:
        return -(-B // self.bb_g) * -(-H // self.bu_g)

    def bwd(self) -> tuple[int, int, int, int]:
        """(BB_H, BU_H, BB_M, BU_M)."""
        return self.bb_r, self.bu_r, self.bb_m or self.bb_g, self.bu_m or self.bu_g

    def n_m(self, B: int, H: int) -> int:
        """Programs of the backward's phase 2 (its output tiles times the K slices)."""
        _, _, bb, bu = self.bwd()
        return -(-B // bb) * -(-H // bu) * self.split


def _precision(dtype: torch.dtype) -> dict:
    tl = _k().tl
    acc = tl.float64 if dtype == torch.float64 else tl.float32
    # fp32 operands: full fp32 products unless torch allows tf32 (the switch cuBLAS follows too)
    tf32 = dtype == torch.float32 and torch.backends.cuda.matmul.allow_tf32 and not interpreting()
    return dict(
        UPCAST=interpreting() and dtype in (torch.bfloat16, torch.float16),
        ACC=acc,
        PREC="tf32" if tf32 else "ieee",
    )


def _fwd_args(b: dict, prod_r, prod_g, bar):
    return (b["hs"], b["cs"], b["w_mh"], b["w_m"], b["pm"], b["pg"], b["rs"], b["ms"], b["gates"], b["tcs"],
            prod_r, prod_g, bar)  # fmt: skip


def _bwd_args(b: dict, prod_h, prod_m, bar):
    return (b["dr"], b["w_mh_t"], b["w_m_t"], b["dy"], b["gates"], b["cs"], b["tcs"], b["dc"], b["dp"],
            b["rs"], b["pm"], prod_h, prod_m, b.get("part", prod_h), bar)  # fmt: skip


class Loop:
    """One way to run the loop: `forward(bufs, B, T, H)` / `backward(bufs, B, T, H)` fill the outputs."""

    name = "loop"
    graphed = False
    directions = ("fwd", "bwd")  # the directions the tuner times it in

    def __init__(self, tiles: Tiles) -> None:
        self.tiles = tiles

    def __repr__(self) -> str:
        return f"{self.name}{self.tiles}"

    def _consts(self, dtype: torch.dtype, phase: int, sync: bool, use_dot: bool, fwd: bool) -> dict:
        t = self.tiles
        if fwd:
            tiles = dict(BB_R=t.bb_r, BU_R=t.bu_r, BB_G=t.bb_g, BU_G=t.bu_g)
        else:
            tiles = dict(zip(("BB_H", "BU_H", "BB_M", "BU_M"), t.bwd()), SPLIT=t.split)
        cache = ".cg" if sync and not interpreting() else ""
        # fp fusion stated (Triton's default, which 3.9+ warns it will change): the tests and timings hold for it
        launch = {} if interpreting() else dict(num_warps=t.warps, num_stages=t.stages, enable_fp_fusion=True)
        return dict(PHASE=phase, SYNC=sync, USE_DOT=use_dot, BK=t.bk, CACHE=cache, MAX_SPIN=MAX_SPIN,
                    **tiles, **_precision(dtype), **launch)  # fmt: skip

    def scratch(self, B: int, H: int, dtype: torch.dtype, device) -> dict:
        """Per-loop work buffers (no time axis), made once per arena or call: the K slices of a split phase."""
        if self.tiles.split == 1:
            return {}
        acc = torch.float64 if dtype == torch.float64 else torch.float32  # the kernels' accumulator dtype
        return dict(part=torch.empty(self.tiles.split, B, H, dtype=acc, device=device))

    def bwd_phases(self, B: int, H: int) -> list[tuple[int, int]]:
        """(phase, programs) of one backward step run phase by phase."""
        t = self.tiles
        phases = [(1, t.n_r(B, H)), (2, t.n_m(B, H))]
        return phases + ([(3, t.n_r(B, H))] if t.split > 1 else [])


class StepLoop(Loop):
    """A launch per phase and step, the products in the kernels."""

    name = "step"
    graphed = True

    def forward(self, b: dict, B: int, T: int, H: int) -> None:
        k, t_ = _k(), self.tiles
        c1 = self._consts(b["w_mh"].dtype, 1, False, True, True)
        c2 = self._consts(b["w_mh"].dtype, 2, False, True, True)
        args = _fwd_args(b, b["w_mh"], b["w_m"], b["w_mh"])  # prod/bar unused
        for t in range(T):
            k.mlstm_fwd[(t_.n_r(B, H),)](*args, t, t + 1, B, H, **c1)
            k.mlstm_fwd[(t_.n_g(B, H),)](*args, t, t + 1, B, H, **c2)

    def backward(self, b: dict, B: int, T: int, H: int) -> None:
        k = _k()
        phases = [
            (n, self._consts(b["w_mh_t"].dtype, p, False, True, False)) for p, n in self.bwd_phases(B, H)
        ]
        args = _bwd_args(b, b["w_mh_t"], b["w_m_t"], b["w_mh_t"])
        b["dc"].zero_()
        for t in range(T - 1, -1, -1):
            for n, c in phases:
                k.mlstm_bwd[(n,)](*args, t, t + 1, T, B, H, **c)


class CublasLoop(Loop):
    """cuBLAS products each step; the kernels run only their epilogues (a pointwise pass each)."""

    name = "cublas"
    graphed = True

    def scratch(self, B: int, H: int, dtype: torch.dtype, device) -> dict:
        kw = dict(dtype=dtype, device=device)
        return dict(p_r=torch.empty(B, H, **kw), p_g=torch.empty(B, 4 * H, **kw), p_h=torch.empty(B, H, **kw))

    def forward(self, b: dict, B: int, T: int, H: int) -> None:
        k, t_ = _k(), self.tiles
        c1 = self._consts(b["w_mh"].dtype, 1, False, False, True)
        c2 = self._consts(b["w_mh"].dtype, 2, False, False, True)
        p_r, p_g = b["p_r"], b["p_g"]
        args = _fwd_args(b, p_r, p_g, p_r)
        w_mh_t, w_m_t = b["w_mh"].t(), b["w_m"].t()
        for t in range(T):
            torch.mm(b["hs"][t], w_mh_t, out=p_r)  # (B, H) r_t
            k.mlstm_fwd[(t_.n_r(B, H),)](*args, t, t + 1, B, H, **c1)
            torch.mm(b["ms"][t], w_m_t, out=p_g)  # (B, 4H) z_t
            k.mlstm_fwd[(t_.n_g(B, H),)](*args, t, t + 1, B, H, **c2)

    def backward(self, b: dict, B: int, T: int, H: int) -> None:
        k, t_ = _k(), self.tiles
        c1 = self._consts(b["w_mh_t"].dtype, 1, False, False, False)
        c2 = self._consts(b["w_mh_t"].dtype, 2, False, False, False)
        p_h, p_m = b["p_h"], b["p_r"]
        args = _bwd_args(b, p_h, p_m, p_h)
        w_mh, w_m = b["w_mh_t"].t(), b["w_m_t"].t()  # (H, H), (4H, H) views: W_mh, W_m
        b["dc"].zero_()
        for t in range(T - 1, -1, -1):
            if t < T - 1:
                torch.mm(b["dr"][t + 1], w_mh, out=p_h)  # (B, H) d(r_{t+1}) W_mh
            k.mlstm_bwd[(t_.n_r(B, H),)](*args, t, t + 1, T, B, H, **c1)
            torch.mm(b["dp"][t, :, H:], w_m, out=p_m)  # (B, H) dG_t W_m: dG's rows have stride 5H
            k.mlstm_bwd[(t_.n_m(B, H),)](*args, t, t + 1, T, B, H, **c2)


class PersistentLoop(Loop):
    """One cooperative launch per sequence and direction: `programs` programs (at most the SM count) loop
    over the steps and their tiles, a grid barrier between phases. In the interpreter, which runs programs
    one after another (a barrier would wait forever), the same kernel runs phase by phase, `programs`
    programs each looping over several tiles."""

    name = "persistent"

    def __init__(self, tiles: Tiles, programs: int) -> None:
        super().__init__(tiles)
        self.programs = programs
        self.pending: collections.deque = collections.deque()  # (event, host flag) of launches in flight

    def __repr__(self) -> str:
        return f"{self.name}{self.tiles}x{self.programs}"

    def _launch(self, kernel, args: tuple, fwd: bool, dtype: torch.dtype, tail: tuple, T: int) -> None:
        P = self.programs
        if interpreting():
            phases = (1, 2) if fwd else [p for p, _ in self.bwd_phases(1, 1)]
            for t in range(T - 1, -1, -1) if not fwd else range(T):
                for phase in phases:
                    kernel[(P,)](*args, t, t + 1, *tail, **self._consts(dtype, phase, False, True, fwd))
            return
        bar = torch.zeros(2, dtype=torch.int32, device=args[0].device)  # [arrivals, failed]
        args = (*args[:-1], bar)
        kernel[(P,)](
            *args, 0, T, *tail, launch_cooperative_grid=True, **self._consts(dtype, 0, True, True, fwd)
        )
        self._watch(bar)

    def _watch(self, bar: torch.Tensor) -> None:
        """Check the barrier's failure flag without waiting for the GPU: a copy to pinned memory now, read
        once its event has passed (on a later call, or by `check`)."""
        flag = torch.empty(2, dtype=torch.int32, pin_memory=True)
        flag.copy_(bar, non_blocking=True)
        ev = torch.cuda.Event()
        ev.record()
        self.pending.append((ev, flag))
        while self.pending and self.pending[0][0].query():
            self._raise_if_failed(self.pending.popleft()[1])

    def check(self) -> None:
        """Wait for every launch in flight and raise if one's grid barrier gave up."""
        while self.pending:
            ev, flag = self.pending.popleft()
            ev.synchronize()
            self._raise_if_failed(flag)

    @staticmethod
    def _raise_if_failed(flag: torch.Tensor) -> None:
        if int(flag[1]):
            raise RuntimeError(
                "the persistent mLSTM kernel's grid barrier timed out (its programs were not all resident "
                "on the GPU): its results are invalid; rerun with MLSTM_GPU_LOOP=step"
            )

    def forward(self, b: dict, B: int, T: int, H: int) -> None:
        self._launch(_k().mlstm_fwd, _fwd_args(b, b["w_mh"], b["w_m"], b["w_mh"]), True, b["w_mh"].dtype,
                     (B, H), T)  # fmt: skip

    def backward(self, b: dict, B: int, T: int, H: int) -> None:
        b["dc"].zero_()
        self._launch(_k().mlstm_bwd, _bwd_args(b, b["w_mh_t"], b["w_m_t"], b["w_mh_t"]), False,
                     b["w_mh_t"].dtype, (T, B, H), T)  # fmt: skip


class SplitKLoop(PersistentLoop):
    """The persistent loop with its backward's second phase (dm = W_m^T dG_t, K = 4H) split over K: a
    backward-only candidate (its forward is the persistent loop's)."""

    name = "splitk"
    directions = ("bwd",)


# ---- CUDA graphs over a shared arena


class _Arena:
    """Static buffers for one (loop, direction, B, H, dtype, device), sized for `T` steps, and the graphs
    captured over them (one per length, keyed by T)."""

    def __init__(self, bufs: dict, T: int, scratch: dict) -> None:
        self.T = T
        self.bufs = {n: torch.empty_like(v) for n, v in bufs.items()}
        self.bufs.update(scratch)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}

    def view(self, T: int) -> dict:
        out = {}
        for n, v in self.bufs.items():
            out[n] = v[: T + 1] if n in TIME_PLUS_ONE else v[:T] if n in TIMED else v
        return out


_arenas: collections.OrderedDict = collections.OrderedDict()  # key -> _Arena
_seen: set = set()  # (key, T) run once eagerly: its kernels are compiled, the next call captures


def graphs_held() -> int:
    return sum(len(a.graphs) for a in _arenas.values())


def clear_graphs() -> None:
    _arenas.clear()
    _seen.clear()


def _evict_over_cap() -> None:
    # an arena holds a whole sequence's buffers (GBs for a large layer): a few shapes, not one per batch size
    while _arenas and (graphs_held() > GRAPH_CACHE or len(_arenas) > MAX_ARENAS):
        _arenas.popitem(last=False)  # the least recently used arena, its graphs with it


def run(loop: Loop, fwd: bool, bufs: dict, B: int, T: int, H: int) -> None:
    """Run one direction of `loop` over `bufs`: eagerly, or replaying its CUDA graph for this length once
    the kernels are compiled (`MLSTM_CUDA_GRAPHS=0`, the interpreter and the persistent loop: eagerly)."""
    go: Callable[[dict], None] = (
        (lambda b: loop.forward(b, B, T, H)) if fwd else (lambda b: loop.backward(b, B, T, H))
    )
    w = bufs["w_mh" if fwd else "w_mh_t"]
    eager = (
        not loop.graphed or interpreting() or not w.is_cuda or GRAPH_CACHE <= 0
        or os.environ.get("MLSTM_CUDA_GRAPHS", "1") == "0"
    )  # fmt: skip
    if eager:
        return go({**bufs, **loop.scratch(B, H, w.dtype, w.device)})
    key = (repr(loop), fwd, B, H, w.dtype, w.device)
    if (key, T) not in _seen:
        _seen.add((key, T))
        return go({**bufs, **loop.scratch(B, H, w.dtype, w.device)})
    arena = _arenas.get(key)
    if arena is None or arena.T < T:  # a longer sequence: a bigger arena (its graphs re-captured as met)
        _arenas.pop(key, None)  # the old one's memory goes before the new one's is taken
        arena = _arenas[key] = _Arena(bufs, T, loop.scratch(B, H, w.dtype, w.device))
        _evict_over_cap()
    _arenas.move_to_end(key)
    static = arena.view(T)
    if T not in arena.graphs:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            go(static)
        arena.graphs[T] = graph
        _evict_over_cap()
    _copy_in(static, bufs, fwd)
    arena.graphs[T].replay()
    for n in FWD_OUT if fwd else BWD_OUT:
        bufs[n].copy_(static[n])


def _copy_in(static: dict, bufs: dict, fwd: bool) -> None:
    if fwd:
        for n in FWD_IN:
            static[n].copy_(bufs[n])
        static["hs"][0].copy_(bufs["hs"][0])
        static["cs"][0].copy_(bufs["cs"][0])
    else:
        for n in BWD_IN:
            static[n].copy_(bufs[n])
