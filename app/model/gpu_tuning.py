"""Which loop runs the mLSTM core on a GPU, per shape, chosen by measurement (as `cudnn.benchmark` does).

On first use of a (device, B, H, dtype) (B: `batch_bucket`, the next power of two) the candidates of
app/model/gpu_loops.py (step, cublas, persistent; splitk for the backward) are each timed on T_TUNE steps,
forward and backward apart, and the fastest of each direction kept for the process; `prefers_reference` then times the whole op against the Python reference core (the dispatcher runs
the reference where it wins, so the GPU path is never slower than it). The choice is logged once, with the
times. A candidate that fails (a cooperative grid too large for the device, a kernel this Triton cannot
build) is left out with its reason. Winners are also written to disk (app/model/gpu_choice_cache.py), so a
later run starts without timing.

`MLSTM_GPU_LOOP=step|cublas|persistent|splitk|python` forces one (no timing). In Triton's interpreter (the CPU
tests) nothing is timed: the loop is MLSTM_GPU_LOOP's, default persistent, run phase by phase.
"""

from __future__ import annotations

import contextlib
import logging
import os
import statistics
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from app.common.errors import UserError
from app.model import gpu_choice_cache, gpu_loops
from app.model.gpu_loops import CublasLoop, Loop, PersistentLoop, SplitKLoop, StepLoop, Tiles

log = logging.getLogger(__name__)


class NoLoop(RuntimeError):
    """No GPU loop ran on this device for the shape (every candidate failed or disagreed)."""


LOOPS = ("step", "cublas", "persistent", "splitk")
T_TUNE = 64  # steps per timed run: per-step costs dominate; the fixed ones (a launch, a replay) count too
REPS, WARMUP = 5, 3  # timed runs (median) after warm-up runs: compile, graph capture, first replay
# relative difference allowed between two loops' outputs over T_TUNE steps, by operand dtype (bf16 products
# rounded differently, fp32 with or without tf32)
SELF_CHECK = {torch.bfloat16: 5e-2, torch.float16: 2e-2, torch.float32: 2e-2, torch.float64: 1e-9}
_choices: dict = {}
_logged: set = set()
_override: list[str] = []  # forcing(): the loop to run, untimed (benchmarks, tests)


@dataclass
class Choice:
    fwd: Loop | None  # None: no loop runs on this device (times["failed"] says why): the reference core does
    bwd: Loop | None  # None: only the forward was needed (inference) so far
    python: bool | None = None  # whether the reference core wins; None: not compared yet
    times: dict = field(default_factory=dict)


def _next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def tiles_for(B: int, H: int, dtype: torch.dtype, sms: int, weights_in_l2: bool) -> Tiles:
    """Tiles that give every SM work: units per tile shrink first (down to 16, and 4 x 16 gate rows: the
    M of a warpgroup MMA); then, where the weights stay in L2, batch rows (re-reading a weight tile from
    L2 is cheap; from HBM it is not, so large layers keep the whole batch in one tile)."""
    if gpu_loops.interpreting():
        return Tiles(bb_r=16, bu_r=16, bb_g=16, bu_g=4, bk=16)
    bk = 32 if dtype in (torch.float32, torch.float64) else 64
    bb = min(64 if weights_in_l2 else 128, max(16, _next_pow2(B)))

    def fit(bu: int, bb: int, bu_min: int) -> tuple[int, int]:
        # halve a side while twice the tiles still fit in one wave over the SMs
        while 2 * -(-B // bb) * -(-H // bu) <= sms and bu > bu_min:
            bu //= 2
        while weights_in_l2 and 2 * -(-B // bb) * -(-H // bu) <= sms and bb > 16:
            bb //= 2
        return bu, bb

    bu_r, bb_r = fit(64, bb, 16)
    bu_g, bb_g = fit(16, bb, 16)
    if 2 * -(-B // bb_g) * -(-H // bu_g) <= sms:  # still few tiles: give up the warpgroup MMA's M = 64
        bu_g, bb_g = fit(bu_g, bb_g, 4)
    return Tiles(bb_r, bu_r, bb_g, bu_g, bk, warps=8 if max(bb_r, bb_g) >= 128 else 4)


def split_tiles(base: Tiles, B: int, H: int, sms: int) -> Tiles:
    """The backward's K = 4H phase split over K: the whole batch (up to 128 rows: the weights read once) by 64
    units (a warpgroup MMA's M) per output tile, as many K slices as fill the SMs, each at least 2 K steps."""
    if gpu_loops.interpreting():
        return replace(base, bb_m=16, bu_m=16, split=3)  # 3 slices of 4H = 80: the last one short
    bb_m, bu_m = min(128, max(16, _next_pow2(B))), 64
    outputs = -(-B // bb_m) * -(-H // bu_m)
    split = max(1, min(sms // outputs, 4 * H // (2 * base.bk)))
    return replace(base, bb_m=bb_m, bu_m=bu_m, split=split, warps=8 if bb_m >= 128 else base.warps)


def candidates(B: int, H: int, dtype: torch.dtype, device: torch.device) -> list[Loop]:
    if gpu_loops.interpreting():
        sms, in_l2 = 3, True
    else:
        props = torch.cuda.get_device_properties(device)
        sms = props.multi_processor_count
        in_l2 = 5 * H * H * torch.finfo(dtype).bits // 8 <= getattr(props, "L2_cache_size", 0) // 2
    tiles = tiles_for(B, H, dtype, sms, in_l2)
    split = split_tiles(tiles, B, H, sms)

    def programs(t: Tiles) -> int:
        return min(sms, max(t.n_r(B, H), t.n_g(B, H), t.n_m(B, H)))

    loops = [
        CublasLoop(tiles),
        StepLoop(tiles),
        PersistentLoop(tiles, programs(tiles)),
    ]  # cuBLAS first: the check
    return loops + ([SplitKLoop(split, programs(split))] if split.split > 1 else [])


def _time_ms(fn, reps: int | None = None, warmup: int | None = None) -> float:
    """Median of `reps` runs timed with CUDA events, after `warmup` (compile, graph capture, first replay).
    Off CUDA (Triton's interpreter, the CPU tests of this module) a wall clock stands in."""
    reps, warmup = reps or REPS, WARMUP if warmup is None else warmup
    for _ in range(warmup):
        fn()
    cuda = torch.cuda.is_available() and not gpu_loops.interpreting()
    if cuda:
        torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        if not cuda:
            t0 = time.perf_counter()
            fn()
            times.append(1e3 * (time.perf_counter() - t0))
            continue
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def _why(e: BaseException) -> str:
    lines = str(e).strip().splitlines()
    return f"{type(e).__name__}: {lines[0][:160]}" if lines else type(e).__name__


def _tuning_buffers(B: int, H: int, dtype: torch.dtype, device) -> dict:
    """Forward inputs of T_TUNE steps, drawn at the scale training sees (weights ~ H^-1/2)."""
    sdt = torch.float32 if dtype in (torch.bfloat16, torch.float16) else dtype
    g = torch.Generator(device=device).manual_seed(0)
    T = T_TUNE

    def rnd(*shape, scale=1.0, dt=sdt):
        return (torch.randn(*shape, generator=g, device=device) * scale).to(dt)

    hs, cs = (
        torch.zeros(T + 1, B, H, dtype=dtype, device=device),
        torch.zeros(T + 1, B, H, dtype=sdt, device=device),
    )
    fwd = dict(w_mh=rnd(H, H, scale=H**-0.5, dt=dtype), w_m=rnd(4 * H, H, scale=H**-0.5, dt=dtype),
               pm=rnd(T, B, H), pg=rnd(T, B, 4 * H), hs=hs, cs=cs, rs=torch.empty_like(cs[1:]),
               ms=torch.empty_like(hs[1:]), gates=rnd(T, B, 4 * H), tcs=torch.empty_like(cs[1:]))  # fmt: skip
    return fwd


def _backward_buffers(f: dict, B: int, H: int) -> dict:
    T, sdt, cdt = T_TUNE, f["cs"].dtype, f["w_mh"].dtype
    kw = dict(device=f["cs"].device)
    return dict(w_mh_t=f["w_mh"].t().contiguous(), w_m_t=f["w_m"].t().contiguous(), dy=torch.randn_like(f["rs"]),
                gates=f["gates"], cs=f["cs"], tcs=f["tcs"], rs=f["rs"], pm=f["pm"],
                dp=torch.empty(T, B, 5 * H, dtype=cdt, **kw), dr=torch.empty(T, B, H, dtype=cdt, **kw),
                dc=torch.zeros(B, H, dtype=sdt, **kw))  # fmt: skip


def _fastest(loops: list[Loop], fwd: bool, bufs: dict, B: int, H: int, times: dict) -> Loop:
    """The fastest of `loops` in one direction. A candidate that fails, or whose outputs disagree with the
    first that ran (the cuBLAS loop: its products owe nothing to Triton's tiles, pipelining or barriers), is
    left out with the reason: a kernel racing on some GPU is caught here, before it trains anything."""
    best, best_ms, ref = None, float("inf"), None
    outputs = gpu_loops.FWD_OUT if fwd else gpu_loops.BWD_OUT
    for loop in [lp for lp in loops if ("fwd" if fwd else "bwd") in lp.directions]:
        name = f"{'fwd' if fwd else 'bwd'}/{loop.name}"
        # a loop that leaves some output unwritten shows NaN there, not an earlier loop's values
        for n in outputs:
            (bufs[n][1:] if n in gpu_loops.TIME_PLUS_ONE else bufs[n]).fill_(float("nan"))
        try:
            ms = _time_ms(lambda loop=loop: gpu_loops.run(loop, fwd, bufs, B, T_TUNE, H))
            if isinstance(loop, PersistentLoop):
                loop.check()
            out = torch.cat([bufs[n].float().flatten() for n in outputs])
            ref = out if ref is None else ref
            err = ((out - ref).norm() / ref.norm().clamp_min(1e-30)).item()
            if not err < SELF_CHECK[bufs["w_mh" if fwd else "w_mh_t"].dtype]:
                raise ArithmeticError(
                    f"outputs differ from the {loops[0].name} loop's by {err:.1e} (relative)"
                )
        except Exception as e:  # a candidate this device or Triton cannot run: left out, with why
            times[name] = _why(e)
            continue
        times[name] = round(ms, 3)
        if ms < best_ms:
            best, best_ms = loop, ms
    if best is None:
        raise NoLoop(f"no GPU loop of the mLSTM core runs here: {times}")
    return best


def _tune(B: int, H: int, dtype: torch.dtype, device, backward: bool) -> Choice:
    loops = candidates(B, H, dtype, device)
    log.info(
        "timing the mLSTM core's GPU loops for B%d H%d %s (%s): once per shape, seconds (kernels compile)",
        B, H, str(dtype).removeprefix("torch."), ", ".join(lp.name for lp in loops),
    )  # fmt: skip
    times: dict = {}
    f = _tuning_buffers(B, H, dtype, device)
    fwd = _fastest(loops, True, f, B, H, times)
    bwd = None
    if backward:
        gpu_loops.run(fwd, True, f, B, T_TUNE, H)  # real forward outputs for the backward to read
        bwd = _fastest(loops, False, _backward_buffers(f, B, H), B, H, times)
    gpu_loops.clear_graphs()  # the tuning lengths' graphs and arenas: not needed again
    return Choice(fwd, bwd, times=times)


@contextlib.contextmanager
def forcing(loop: str) -> Iterator[None]:
    """Within: every Triton core call runs `loop` (one of LOOPS), untimed; its backward too."""
    if loop not in LOOPS:
        raise ValueError(f"loop must be one of {LOOPS}, got {loop!r}")
    _override.append(loop)
    try:
        yield
    finally:
        _override.pop()


def forced_loop() -> str:
    """The loop MLSTM_GPU_LOOP (or `forcing`) asks for, "" for none; a name that is none is one line."""
    default = "persistent" if gpu_loops.interpreting() else ""
    want = _override[-1] if _override else os.environ.get("MLSTM_GPU_LOOP", default)
    if want and want not in (*LOOPS, "python"):
        raise UserError(
            f"MLSTM_GPU_LOOP must be one of {', '.join((*LOOPS, 'python'))} or unset, got {want!r}"
        )
    return want


def pick(want: str, loops: list[Loop]) -> Loop:
    """The loop named `want` among `loops` ("python": the step loop, for the Triton core's own calls);
    splitk where this shape splits nothing (it is then not a candidate): the persistent loop, said once."""
    by_name = {loop.name: loop for loop in loops}
    name = "step" if want == "python" else want
    if name == "splitk" and name not in by_name:
        if "splitk" not in _logged:
            _logged.add("splitk")
            log.info("MLSTM_GPU_LOOP=splitk: this shape's K splits into 1 slice: the persistent loop runs")
        name = "persistent"
    return by_name[name]


def _forced(B: int, H: int, dtype: torch.dtype, device) -> Choice | None:
    want = forced_loop()
    if not want:
        return None
    loop = pick(want, candidates(B, H, dtype, device))
    return Choice(loop, loop, python=want == "python", times={"forced": want})  # no timing: both directions


def batch_bucket(B: int) -> int:
    """The batch size a choice is made for: the next power of two, at least 16. A micro-batch with fewer
    rows (a bucket's last, an evaluation's) reuses its bucket's loops and compiled kernels (the kernels mask
    the rows past B) instead of a fresh timing mid-run."""
    return max(16, _next_pow2(B))


def _key(x: torch.Tensor, w: torch.Tensor) -> tuple:
    tf32 = w.dtype == torch.float32 and torch.backends.cuda.matmul.allow_tf32  # another product in fp32
    return (x.device, batch_bucket(x.shape[0]), w.shape[0], w.dtype, tf32)


def _reuse(key: tuple, backward: bool) -> Choice | None:
    """The choice of the smallest larger bucket already timed for the same device, H and dtype (and forced
    loop): a micro-batch smaller than its run's (a length bucket's last, a per-bucket batch size) runs the
    loops, tiles and compiled kernels its run already has, masked, instead of a fresh timing mid-run."""
    dev, bucket, *rest = key
    found = sorted(
        (k[1], c) for k, c in _choices.items()
        if k[0] == dev and k[2:] == tuple(rest) and k[1] > bucket and (c.bwd is not None or not backward)
    )  # fmt: skip
    return found[0][1] if found else None


def loops_for(x: torch.Tensor, w: torch.Tensor, backward: bool = True) -> Choice:
    """The loops for x (B, T, D) and a recurrent weight w (H, H) in the compute dtype: timed on first use."""
    key = (*_key(x, w), _override[-1] if _override else None)
    choice = _choices.get(key)
    if choice is not None and (choice.bwd is not None or not backward or choice.fwd is None):
        return choice
    choice = _reuse(key, backward)
    if choice is not None:
        _choices[key] = choice
        return choice
    B, H = batch_bucket(x.shape[0]), w.shape[0]
    choice = _forced(B, H, w.dtype, x.device) or _cached(B, H, w.dtype, x.device, backward)
    if choice is None:
        try:
            choice = _tune(B, H, w.dtype, x.device, backward)
        except NoLoop as e:  # the reference core runs (core "auto"); core "fused" says why (triton_core)
            choice = Choice(None, None, python=True, times={"failed": str(e)})
        _store(B, H, w.dtype, x.device, choice)
    _choices[key] = choice
    return choice


def prefers_reference(x: torch.Tensor, w: torch.Tensor, backward: bool, triton_fn, python_fn) -> str | None:
    """Why the Python reference core runs at this shape instead of the Triton core (its tuned loops), or None:
    both whole ops timed on T_TUNE steps (forward and backward, or forward alone), once per shape; or no
    Triton loop ran here. Logs the choice."""
    if _override:
        return None
    choice = loops_for(x, w, backward)
    if choice.python is None and choice.fwd is not None:
        B, D, H = batch_bucket(x.shape[0]), x.shape[2], w.shape[0]
        ms = {name: _time_op(fn, B, D, H, w.dtype, x.device, backward) for name, fn in
              (("triton", triton_fn), ("python", python_fn))}  # fmt: skip
        gpu_loops.clear_graphs()
        choice.python = ms["python"] < ms["triton"]
        choice.times.update({f"op/{k}": round(v, 3) for k, v in ms.items()})
        _store(B, H, w.dtype, x.device, choice)
    if id(choice) not in _logged:  # once per choice (smaller batches reusing it say nothing new)
        _logged.add(id(choice))
        _log(x, w, choice)
    if choice.fwd is None:
        return f"no Triton loop runs here: {choice.times['failed']}"
    return "measured faster than the Triton core at this shape" if choice.python else None


def _time_op(fn, B: int, D: int, H: int, dtype: torch.dtype, device, backward: bool) -> float:
    g = torch.Generator(device=device).manual_seed(1)
    sdt = torch.float32 if dtype in (torch.bfloat16, torch.float16) else dtype
    shapes = [((B, T_TUNE, D), 1.0, dtype), ((5 * H, D), D**-0.5, dtype), ((4 * H,), 0.1, sdt),
              ((H, H), H**-0.5, dtype), ((4 * H, H), H**-0.5, dtype)]  # fmt: skip
    leaves = [
        (torch.randn(s, generator=g, device=device) * a).to(dt).requires_grad_(backward)
        for s, a, dt in shapes
    ]
    dy = torch.randn(B, T_TUNE, H, generator=g, device=device).to(dtype)

    def step() -> None:
        with torch.enable_grad():
            y = fn.apply(*leaves)
            if backward:
                y.backward(dy)

    return _time_ms(step, reps=max(1, REPS - 2), warmup=min(2, WARMUP))


def _log(x: torch.Tensor, w: torch.Tensor, choice: Choice) -> None:
    if choice.fwd is None:
        what = f"python (the reference core): {choice.times['failed']}"
    else:
        what = "python (the reference core)" if choice.python else f"triton {choice.fwd.name} forward"
    if not choice.python and choice.bwd is not None:
        what += f", {choice.bwd.name} backward"
    dt = str(w.dtype).removeprefix("torch.")
    log.info("mLSTM core on %s %s B%d H%d: %s (ms at T=%d: %s)", x.device, dt, batch_bucket(x.shape[0]), w.shape[0], what,
             T_TUNE, choice.times)  # fmt: skip


# ---- the choice on disk (app/model/gpu_choice_cache.py)


def _code_files() -> tuple[str, ...]:
    # what runs each side of the choices stored (the reference's speed decides `python`); read by
    # path: triton_core imports this module, and the key needs its code, not the module
    here = Path(__file__).parent
    names = ("gpu_loops.py", "triton_kernels.py", "gpu_tuning.py", "triton_core.py", "mlstm_core.py")
    return tuple(str(here / name) for name in names)


def _cached(B: int, H: int, dtype: torch.dtype, device, backward: bool) -> Choice | None:
    entry = gpu_choice_cache.load(B, H, dtype, device, _code_files(), _variant(dtype))
    if entry is None:
        return None
    try:
        loops = {loop.name: loop for loop in candidates(B, H, dtype, device)}
        bwd = loops[entry["bwd"]] if entry["bwd"] is not None else None
        choice = Choice(loops[entry["fwd"]], bwd, entry["python"], {"cached": True})
    except (KeyError, TypeError):
        return None  # an entry of another shape of the file: time it
    return None if backward and bwd is None else choice


def _store(B: int, H: int, dtype: torch.dtype, device, choice: Choice) -> None:
    if "forced" in choice.times or choice.fwd is None:  # a failure may not last: the next run tries again
        return
    bwd = choice.bwd.name if choice.bwd is not None else None
    entry = {"fwd": choice.fwd.name, "bwd": bwd, "python": choice.python}
    gpu_choice_cache.store(B, H, dtype, device, _code_files(), entry, _variant(dtype))


def _variant(dtype: torch.dtype) -> str:
    """What else decides a shape's products: tf32 for fp32 operands where torch allows it."""
    return "tf32" if dtype == torch.float32 and torch.backends.cuda.matmul.allow_tf32 else ""
