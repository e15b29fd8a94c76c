"""Four ways to run the mLSTM time loop on a GPU, over the same buffers and the same kernels
(app/model/triton_kernels.py); app/model/gpu_tuning.py times them per shape and keeps the fastest.

    step        two Triton launches per step each way, the product in the kernel (its gate / cell math in
                the epilogue); the T-step loop replayed as a CUDA graph
    cublas      per step, cuBLAS products (torch.mm) and the same kernels with the product read back
                (USE_DOT off: only their epilogues run); replayed as a CUDA graph
    persistent  ONE launch per sequence each way: a cooperative grid of at most the SM count loops over
                the steps with a grid barrier between phases; no graph, nothing captured per length; the
                host never waits for it (a barrier that gives up poisons the outputs: gpu_health.py)
    splitk      the persistent loop, its backward's K = 4H phase on whole-batch x 64-unit tiles, split over K
                where that fills the SMs (a third phase sums the slices, in a fixed order): a backward-only
                candidate

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

from app.common import faults
from app.model import gpu_health
from app.model.gpu_tiles import Tiles, epilogue_rows, interpreting

GRAPH_CACHE = int(os.environ.get("MLSTM_GRAPH_CACHE", "64"))
MAX_ARENAS = 4  # (loop, direction, B, H, dtype, device) shapes whose buffers are kept for their graphs
MAX_SPIN = 1 << 22  # grid-barrier polls before a program gives up (seconds of waiting, never forever)
FWD_IN = ("w_mh", "w_m", "pm", "pg")  # and row 0 of hs / cs (the initial state)
FWD_OUT = ("hs", "cs", "rs", "ms", "gates", "tcs")
BWD_IN = ("w_mh_t", "w_m_t", "dy", "gates", "cs", "tcs", "rs", "pm")
BWD_OUT = ("dp", "dr")
TIME_PLUS_ONE = ("hs", "cs")  # (T + 1, B, ...): step 0's state first
TIMED = ("pm", "pg", "rs", "ms", "gates", "tcs", "dy", "dp", "dr")  # (T, B, ...)


class BarrierTimeout(RuntimeError):
    """A persistent launch's grid barrier gave up (its programs were not all resident), seen by the host at once:
    only under MLSTM_BARRIER_HOST_WAIT=1 (gpu_health.host_wait), which reads the flag after every launch."""


def _k():
    from app.model import triton_kernels

    return triton_kernels


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


def fwd_args(b: dict, *, prod_r=None, prod_g=None, bar=None) -> dict:
    """mlstm_fwd's tensors by name (the kernels take them by keyword: a misordered one cannot alias another);
    None for a pointer this launch does not read; `part` (r's K slices) where the loop has it."""
    names = ("hs", "cs", "w_mh", "w_m", "pm", "pg", "rs", "ms", "gates", "tcs")
    return {**{n: b[n] for n in names}, "prod_r": prod_r, "prod_g": prod_g, "part": b.get("part"), "bar": bar}


def bwd_args(b: dict, *, prod_h=None, prod_m=None, bar=None) -> dict:
    """mlstm_bwd's tensors by name; `part` (the K slices of a split phase) where the loop has it."""
    names = ("dr", "w_mh_t", "w_m_t", "dy", "gates", "cs", "tcs", "dc", "dp", "rs", "pm")
    return {**{n: b[n] for n in names}, "prod_h": prod_h, "prod_m": prod_m, "part": b.get("part"), "bar": bar}


def launch_kernel(kernel, grid: int, args: dict, **consts) -> None:
    """kernel[grid] with `args` (every tensor and scalar, by name: none can land in another's place) put in the
    kernel's own parameter order, the constexprs and launch options by keyword; a parameter with no value is
    refused here, not aliased to a neighbour."""
    missing = [n for n in kernel.arg_names if n not in args and n not in consts]
    assert not missing, f"{kernel.__name__}: no value for {missing}"
    kernel[(grid,)](*[args[n] for n in kernel.arg_names if n in args], **consts)


def _carry_in(b: dict) -> None:
    """The backward's dc carry before its last step: zero, or, for a time piece of the overlapped backward
    (app/model/wgrad_overlap.py, `dc_carry` given), what the piece after it left in `dc`."""
    if "dc_carry" not in b:
        b["dc"].zero_()


@dataclass(frozen=True)
class Launch:
    """One kind of kernel launch a loop makes: the kernel (forward or backward), the phases it runs, whether
    its programs synchronise (the persistent loop) and whether it computes its products (off: cuBLAS did)."""

    fwd: bool
    phases: int
    sync: bool = False
    use_dot: bool = True


def phases(t: Tiles, fwd: bool) -> list[int]:
    """The phases (triton_kernels' bits) a direction runs each step with tiles `t`, in their order: a split
    phase's slices and sum only where it is split."""
    k = _k()
    if fwd:
        return [p for p in k.FWD_PHASES if p != k.R_PART_PHASE.value or t.split_r > 1]
    skip = {k.DH_PART_PHASE.value: t.split_h == 1, k.SUM_PHASE.value: t.split == 1}
    return [p for p in k.BWD_PHASES if not skip.get(p)]


class Loop:
    """One way to run the loop: `forward(bufs, B, T, H)` / `backward(bufs, B, T, H)` fill the outputs. `tag`
    names a second tiling of the same loop (its `label`, e.g. persistent-l2, is what the tuner ranks)."""

    name = "loop"
    graphed = False
    barrier = False  # whether its launches synchronise through a barrier word (gpu_health.flag)
    directions = ("fwd", "bwd")  # the directions the tuner times it in
    use_dot = True

    def __init__(self, tiles: Tiles, tag: str = "") -> None:
        self.tiles = tiles
        self.tag = tag

    @property
    def label(self) -> str:
        return f"{self.name}-{self.tag}" if self.tag else self.name

    def __repr__(self) -> str:
        return f"{self.label}{self.tiles}"

    def launches(self) -> list[Launch]:
        """Every kind of launch this loop makes (its forward's and backward's): what it runs, and what the
        compile test and bench/kernel_report.py build."""
        fwd = [Launch(True, p, use_dot=self.use_dot) for p in phases(self.tiles, True)]
        return fwd + [Launch(False, p, use_dot=self.use_dot) for p in phases(self.tiles, False)]

    def consts(self, dtype: torch.dtype, launch: Launch) -> dict:
        """The constexprs and launch options of `launch` in `dtype`. What the launch does not use is given a
        fixed value (the tiles of a phase it does not run; the K step and precision where it computes no
        product), so launches that differ only there share one compiled kernel."""
        t = self.tiles
        tiles = _tile_consts(t, launch)
        cache = ".cg" if launch.sync and not interpreting() else ""
        prec = _precision(dtype)
        bk, stages = (t.bk, t.stages) if launch.use_dot else (16, 1)
        if not launch.use_dot:
            prec["PREC"] = "ieee"
        # fp fusion stated (Triton's default, which 3.9+ warns it will change): the tests and timings hold for it
        opts = {} if interpreting() else dict(num_warps=t.warps, num_stages=stages, enable_fp_fusion=True)
        if opts:
            # Left to itself ptxas held some kernels to 64-96 registers for occupancy and spilled 8-24 bytes
            # (19 configurations of 1122 in the report of run 3: small tiles, fp32's FMA products); allowed the
            # whole register file it takes what it needs (an fp32 gate phase: 96 registers and 24 bytes
            # spilled, then 154 and none; bench/kernel_report.py)
            opts["maxnreg"] = 255
        return dict(PHASES=launch.phases, SYNC=launch.sync, USE_DOT=launch.use_dot, BK=bk, CACHE=cache,
                    MAX_SPIN=MAX_SPIN, **tiles, **prec, **opts)  # fmt: skip

    def kernel_args(self, b: dict, fwd: bool) -> dict:
        """The kernel's tensors by name for this loop (its products' scratch where it computes them)."""
        return fwd_args(b, prod_g=b["z"]) if fwd else bwd_args(b, prod_h=b["dh"])

    def programs(self, launch: Launch, B: int, H: int) -> int:
        """Programs of a one-phase launch: its phase's tiles."""
        k, t = _k(), self.tiles
        if launch.fwd:
            n = {k.R_PART_PHASE.value: t.n_rk, k.R_PHASE.value: t.n_r, k.GATES_PHASE.value: t.n_g}
        else:
            n = {k.DH_PART_PHASE.value: t.n_hk, k.DH_PHASE.value: t.n_h, k.DM_PHASE.value: t.n_m,
                 k.SUM_PHASE.value: t.n_h}  # fmt: skip
        return n[launch.phases](B, H)

    def scratch(self, B: int, H: int, dtype: torch.dtype, device) -> dict:
        """Per-loop work buffers (no time axis), made once per arena or call, in the kernels' accumulator dtype:
        a step's products for their epilogues to read back (z (B, 4H) forward, dh (B, H) backward; each program
        reads only its own tiles of them) and the K slices of a split phase (one split phase at a time)."""
        kw = dict(dtype=torch.float64 if dtype == torch.float64 else torch.float32, device=device)
        out = dict(z=torch.empty(B, 4 * H, **kw), dh=torch.empty(B, H, **kw))
        if self.tiles.split_parts() > 1:
            out["part"] = torch.empty(self.tiles.split_parts(), B, H, **kw)
        return out


def _tile_consts(t: Tiles, launch: Launch) -> dict:
    """The tile constexprs of `launch`: a phase it does not run gets 16s and no split (one compiled kernel for
    launches that differ only there)."""
    k = _k()
    has = {p: bool(launch.phases & p) for p in (k.FWD_PHASES if launch.fwd else k.BWD_PHASES)}
    if launch.fwd:
        rk, r, g = (has[p] for p in k.FWD_PHASES)
        return dict(BB_R=t.bb_r if r else 16, BU_R=t.bu_r if r else 16, BB_G=t.bb_g if g else 16,
                    BU_G=t.bu_g if g else 16, BB_RK=t.bb_rk if rk else 16, BU_RK=t.bu_rk if rk else 16,
                    SPLIT_R=t.split_r if r or rk else 1, EB_G=epilogue_rows(t.bb_g, t.bu_g) if g else 16)  # fmt: skip
    hk, dh, dm, sm = (has[p] for p in k.BWD_PHASES)
    bb_h, bu_h, bb_m, bu_m = t.bwd()
    return dict(BB_H=bb_h if dh or sm else 16, BU_H=bu_h if dh or sm else 16, BB_M=bb_m if dm else 16,
                BU_M=bu_m if dm else 16, SPLIT=t.split if dm or sm else 1, BB_HK=t.bb_hk if hk else 16,
                BU_HK=t.bu_hk if hk else 16, SPLIT_H=t.split_h if dh or hk else 1,
                EB_H=epilogue_rows(bb_h, bu_h) if dh else 16)  # fmt: skip


class StepLoop(Loop):
    """A launch per phase and step, the products in the kernels."""

    name = "step"
    graphed = True

    def forward(self, b: dict, B: int, T: int, H: int) -> None:
        kernel, dtype, args = _k().mlstm_fwd, b["w_mh"].dtype, self.kernel_args(b, True)
        plan = [(self.programs(lc, B, H), self.consts(dtype, lc)) for lc in self.launches() if lc.fwd]
        for t in range(T):
            for n, c in plan:
                launch_kernel(kernel, n, {**args, "t0": t, "t1": t + 1, "B": B, "H": H}, **c)

    def backward(self, b: dict, B: int, T: int, H: int) -> None:
        kernel, dtype, args = _k().mlstm_bwd, b["w_mh_t"].dtype, self.kernel_args(b, False)
        plan = [(self.programs(lc, B, H), self.consts(dtype, lc)) for lc in self.launches() if not lc.fwd]
        _carry_in(b)
        for t in range(T - 1, -1, -1):
            for n, c in plan:
                launch_kernel(kernel, n, {**args, "t0": t, "t1": t + 1, "T": T, "B": B, "H": H}, **c)


class CublasLoop(Loop):
    """cuBLAS products each step; the kernels run only their epilogues (a pointwise pass each)."""

    name = "cublas"
    graphed = True
    use_dot = False

    def scratch(self, B: int, H: int, dtype: torch.dtype, device) -> dict:
        kw = dict(dtype=dtype, device=device)
        return dict(p_r=torch.empty(B, H, **kw), p_g=torch.empty(B, 4 * H, **kw), p_h=torch.empty(B, H, **kw))

    def kernel_args(self, b: dict, fwd: bool) -> dict:
        """cuBLAS's products (the compute dtype) in place of the kernels' own."""
        if fwd:
            return fwd_args(b, prod_r=b["p_r"], prod_g=b["p_g"])
        return bwd_args(b, prod_h=b["p_h"], prod_m=b["p_r"])

    def forward(self, b: dict, B: int, T: int, H: int) -> None:
        kernel, dtype = _k().mlstm_fwd, b["w_mh"].dtype
        (n_r, c_r), (n_g, c_g) = [(self.programs(lc, B, H), self.consts(dtype, lc)) for lc in self.launches()
                                  if lc.fwd]  # fmt: skip
        p_r, p_g = b["p_r"], b["p_g"]
        args = self.kernel_args(b, True)
        w_mh_t, w_m_t = b["w_mh"].t(), b["w_m"].t()
        for t in range(T):
            torch.mm(b["hs"][t], w_mh_t, out=p_r)  # (B, H) r_t
            launch_kernel(kernel, n_r, {**args, "t0": t, "t1": t + 1, "B": B, "H": H}, **c_r)
            torch.mm(b["ms"][t], w_m_t, out=p_g)  # (B, 4H) z_t
            launch_kernel(kernel, n_g, {**args, "t0": t, "t1": t + 1, "B": B, "H": H}, **c_g)

    def backward(self, b: dict, B: int, T: int, H: int) -> None:
        kernel, dtype = _k().mlstm_bwd, b["w_mh_t"].dtype
        (n_h, c_h), (n_m, c_m) = [(self.programs(lc, B, H), self.consts(dtype, lc)) for lc in self.launches()
                                  if not lc.fwd]  # fmt: skip
        p_h, p_m = b["p_h"], b["p_r"]
        args = self.kernel_args(b, False)
        w_mh, w_m = b["w_mh_t"].t(), b["w_m_t"].t()  # (H, H), (4H, H) views: W_mh, W_m
        _carry_in(b)
        for t in range(T - 1, -1, -1):
            if t < T - 1:
                torch.mm(b["dr"][t + 1], w_mh, out=p_h)  # (B, H) d(r_{t+1}) W_mh
            launch_kernel(kernel, n_h, {**args, "t0": t, "t1": t + 1, "T": T, "B": B, "H": H}, **c_h)
            torch.mm(b["dp"][t, :, H:], w_m, out=p_m)  # (B, H) dG_t W_m: dG's rows have stride 5H
            launch_kernel(kernel, n_m, {**args, "t0": t, "t1": t + 1, "T": T, "B": B, "H": H}, **c_m)


class PersistentLoop(Loop):
    """One cooperative launch per sequence and direction: `programs` programs (at most the SM count) loop
    over the steps and their tiles, a grid barrier between phases. The launch never waits: its barrier word is
    `b["bar"]` (a row of the device's health flags, gpu_health.flag; a fresh one where none is given), and a
    barrier that gives up leaves NaN in every output and the flag set, for the host to read where it already
    waits. Under MLSTM_BARRIER_HOST_WAIT=1 the flag is read after the launch (the old wait): BarrierTimeout, and
    the caller redoes the work with another loop (gpu_tuning.run). In the interpreter, which runs programs one
    after another (a barrier would wait forever), the same kernel runs phase by phase, `programs` programs each
    looping over several tiles; a launch whose flag is already set runs whole, as on a GPU: every barrier
    returns at once and the outputs are poisoned."""

    name = "persistent"
    barrier = True
    cooperative = (
        True  # launched with the co-residency guarantee (a test turns it off to see a barrier give up)
    )

    def __init__(self, tiles: Tiles, programs: int, tag: str = "") -> None:
        super().__init__(tiles, tag)
        self.n_programs = programs

    def __repr__(self) -> str:
        return f"{self.label}{self.tiles}x{self.n_programs}"

    def launches(self) -> list[Launch]:
        t = self.tiles
        return [
            Launch(True, sum(phases(t, True)), sync=True),
            Launch(False, sum(phases(t, False)), sync=True),
        ]

    def programs(self, launch: Launch, B: int, H: int) -> int:
        return self.n_programs

    def _launch(self, args: dict, fwd: bool, dtype: torch.dtype, scalars: dict, T: int, bar) -> None:
        kernel = _k().mlstm_fwd if fwd else _k().mlstm_bwd
        launch = next(lc for lc in self.launches() if lc.fwd == fwd)
        P = self.n_programs
        if bar is None:  # a launch outside a ranking (the tuner's checks and timings): a word of its own
            bar = torch.zeros(2, dtype=torch.int32, device=args["w_m" if fwd else "w_m_t"].device)
        bar[0].zero_()  # arrivals: the epoch counter starts at 0; `failed` stays as the last launch left it
        if faults.barrier_times_out():
            bar[1].fill_(1)  # as a barrier that gave up: the kernel's own poison path runs
        if interpreting() and not int(bar[1]):  # (the host's own memory here: no device to wait for)
            run = [p for p in (_k().FWD_PHASES if fwd else _k().BWD_PHASES) if p & launch.phases]
            for t in range(T) if fwd else range(T - 1, -1, -1):
                for p in run:
                    c = self.consts(dtype, Launch(fwd, p, use_dot=launch.use_dot))
                    launch_kernel(kernel, P, {**args, "t0": t, "t1": t + 1, **scalars}, **c)
        else:
            coop = {} if interpreting() else {"launch_cooperative_grid": self.cooperative}
            launch_kernel(kernel, P, {**args, "bar": bar, "t0": 0, "t1": T, **scalars}, **coop,
                          **self.consts(dtype, launch))  # fmt: skip
        if gpu_health.host_wait() and int(
            bar[1]
        ):  # the old wait (an A/B switch): the host reads the flag now
            bar[1].zero_()
            raise BarrierTimeout(
                f"the {self.name} loop's grid barrier timed out ({P} programs were not all resident on the "
                "GPU): its results are invalid"
            )

    def forward(self, b: dict, B: int, T: int, H: int) -> None:
        self._launch(self.kernel_args(b, True), True, b["w_mh"].dtype, dict(B=B, H=H), T, b.get("bar"))

    def backward(self, b: dict, B: int, T: int, H: int) -> None:
        _carry_in(b)
        self._launch(
            self.kernel_args(b, False), False, b["w_mh_t"].dtype, dict(T=T, B=B, H=H), T, b.get("bar")
        )


class SplitKLoop(PersistentLoop):
    """The persistent loop with its backward's second phase (dm = W_m^T dG_t, K = 4H) on whole-batch x 64-unit
    tiles (a warpgroup MMA's M), split over K where that fills the SMs (1 slice where the tiles already do): a
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


def replayed(loop: Loop, w: torch.Tensor) -> bool:
    """Whether `run` replays a CUDA graph of `loop` for weights `w` (from its second call of a length on):
    graphed loops on CUDA, unless MLSTM_CUDA_GRAPHS=0 or MLSTM_GRAPH_CACHE=0."""
    return loop.graphed and not interpreting() and w.is_cuda and not graphs_off()


def graphs_off() -> bool:
    """MLSTM_CUDA_GRAPHS=0 or MLSTM_GRAPH_CACHE=0: no CUDA graph runs, the loops' nor the op's (op_graph.py)."""
    return GRAPH_CACHE <= 0 or os.environ.get("MLSTM_CUDA_GRAPHS", "1") == "0"


def forget(loop: Loop, fwd: bool, B: int, H: int, w: torch.Tensor) -> None:
    """Drop what `run` keeps for (loop, direction, B, H) in w's dtype and device: its arena, its graphs, the
    record of its eager first calls (a check's shape is not training's: its arena would only hold memory)."""
    key = (repr(loop), fwd, B, H, w.dtype, w.device)
    _arenas.pop(key, None)
    _seen.difference_update({k for k in _seen if k[0] == key})


def run(loop: Loop, fwd: bool, bufs: dict, B: int, T: int, H: int) -> None:
    """Run one direction of `loop` over `bufs`: eagerly, or replaying its CUDA graph for this length once
    the kernels are compiled (`MLSTM_CUDA_GRAPHS=0`, the interpreter and the persistent loop: eagerly)."""
    if faults.gpu_launch_fails():
        raise RuntimeError(f"the {loop.name} loop could not launch (injected: MLSTM_DS_FAULTS)")
    go: Callable[[dict], None] = (
        (lambda b: loop.forward(b, B, T, H)) if fwd else (lambda b: loop.backward(b, B, T, H))
    )
    w = bufs["w_mh" if fwd else "w_mh_t"]
    # eagerly: a piece of the overlapped backward (a graph zeroes dc), or inside the capture of the whole op's
    # graph (app/model/op_graph.py: a graph is not captured inside another)
    if not replayed(loop, w) or "dc_carry" in bufs or torch.cuda.is_current_stream_capturing():
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
