"""Which loop runs the mLSTM core on a GPU, per shape, chosen by measurement (as `cudnn.benchmark` does), and
the run of a choice that never hands on a wrong result.

On first use of a (device, B, H, dtype) (B: `batch_bucket`, the next power of two) the candidates of
app/model/gpu_loops.py (cublas, step, persistent; splitk for the backward) are each checked against the float64
reference on a fresh input with a partial batch tile (app/model/gpu_verify.py), then timed on T_TUNE steps,
forward and backward apart; those that pass are ranked by time for the process. `prefers_reference` then
times the whole op against the Python reference core (the dispatcher runs the reference where it wins, so the
GPU path is never slower than it). The choice is logged once, with the times. A candidate that fails (a
cooperative grid too large for the device, a kernel this Triton cannot build, a result off the reference) is
left out with its reason. Rankings are also written to disk (app/model/gpu_choice_cache.py), so a later run
starts without timing; a ranking read from disk is checked once per process, on a small input, before it is
trusted, and timed afresh where it fails.

`run` runs a direction with the ranking's first loop and, where that loop raises at launch (or its grid
barrier gave up under the old per-launch wait, MLSTM_BARRIER_HOST_WAIT=1: gpu_loops.BarrierTimeout), redoes the
work with the next one, with one warning line; the failed loop is dropped from the ranking for the process. A
barrier that gives up without that wait poisons the loop's outputs (NaN) and sets its health flag, which the
host reads where it already waits (app/model/gpu_health.py), dropping the loop there. A forced loop (`MLSTM_GPU_LOOP=step|cublas|persistent|splitk|python`,
untimed) or a cached one that cannot launch falls back the same way. In Triton's interpreter (the CPU tests)
nothing is timed: the loop is MLSTM_GPU_LOOP's, default persistent, run phase by phase.
"""

from __future__ import annotations

import contextlib
import logging
import os
import statistics
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch

from app.common.errors import UserError
from app.model import gpu_choice_cache, gpu_health, gpu_loops, gpu_verify
from app.model.gpu_loops import CublasLoop, Loop, PersistentLoop, SplitKLoop, StepLoop
from app.model.gpu_tiles import (
    interpreting,
    next_pow2,
    persistent_tiles,
    split_tiles,
    tiles_for,
    weights_in_l2,
)

log = logging.getLogger(__name__)


class NoLoop(RuntimeError):
    """No GPU loop ran on this device for the shape (every candidate failed or disagreed)."""


LOOPS = ("step", "cublas", "persistent", "splitk")
FALLBACK_ORDER = ("cublas", "step", "persistent", "splitk")  # after a forced loop: cuBLAS's products first
T_TUNE = 64  # steps per timed run: per-step costs dominate; the fixed ones (a launch, a replay) count too
REPS, WARMUP = 5, 3  # timed runs (median) after warm-up runs: compile, graph capture, first replay
_choices: dict = {}
_logged: set = set()
_override: list[str] = []  # forcing(): the loop to run, untimed (benchmarks, tests)


@dataclass
class Choice:
    """The loops of a shape, fastest first (each direction's ranking: the first runs, the others are its
    fallbacks). fwd_order empty: no loop runs on this device (times["failed"] says why): the reference core
    does. bwd_order None: only the forward was needed (inference) so far."""

    fwd_order: list[Loop]
    bwd_order: list[Loop] | None
    python: bool | None = None  # whether the reference core wins; None: not compared yet
    times: dict = field(default_factory=dict)

    @property
    def fwd(self) -> Loop | None:
        return self.fwd_order[0] if self.fwd_order else None

    @property
    def bwd(self) -> Loop | None:
        return self.bwd_order[0] if self.bwd_order else None


def candidates_for(B: int, H: int, dtype: torch.dtype, sms: int, l2_bytes: int, cc: int = 90) -> list[Loop]:
    """The loops the tuner times for a shape on a device of compute capability `cc` (90: sm_90) with `sms` SMs
    and `l2_bytes` of L2, in the fallback order (cuBLAS first). The split backward's tiles are a candidate of
    their own where they differ from the persistent loop's."""
    tiles = tiles_for(B, H, dtype, sms, interpreting() or weights_in_l2(H, dtype, l2_bytes), cc)
    persistent = persistent_tiles(tiles, dtype, cc)
    split = persistent_tiles(split_tiles(tiles, B, H, sms, dtype), dtype, cc)

    def programs(t) -> int:
        return min(sms, max(t.n_r(B, H), t.n_g(B, H), t.n_h(B, H), t.n_m(B, H)))

    loops: list[Loop] = [CublasLoop(tiles), StepLoop(tiles), PersistentLoop(persistent, programs(persistent))]
    if split.bwd() != persistent.bwd() or split.split > 1:
        loops.append(SplitKLoop(split, programs(split)))
    return loops


def device_size(device) -> tuple[int, int, int]:
    """(SMs, L2 bytes, compute capability as 90 for sm_90) of a CUDA device; in the interpreter, a 3-SM Hopper
    whose L2 holds any layer."""
    if interpreting():
        return 3, 1 << 40, 90
    props = torch.cuda.get_device_properties(device)
    return props.multi_processor_count, getattr(props, "L2_cache_size", 0), 10 * props.major + props.minor


def candidates(B: int, H: int, dtype: torch.dtype, device) -> list[Loop]:
    return candidates_for(B, H, dtype, *device_size(device))


def _time_ms(fn, reps: int | None = None, warmup: int | None = None) -> float:
    """Median of `reps` runs timed with CUDA events, after `warmup` (compile, graph capture, first replay).
    Off CUDA (Triton's interpreter, the CPU tests of this module) a wall clock stands in."""
    reps, warmup = reps or REPS, WARMUP if warmup is None else warmup
    for _ in range(warmup):
        fn()
    cuda = torch.cuda.is_available() and not interpreting()
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
    """Forward buffers of T_TUNE steps for timing, drawn at the scale training sees (weights ~ H^-1/2)."""
    return gpu_verify.forward_case(B, T_TUNE, H, dtype, device, seed=0)


def _backward_buffers(f: dict) -> dict:
    """Backward buffers of T_TUNE steps: the forward's outputs from the float64 reference (no candidate's)."""
    return gpu_verify.backward_case(f, gpu_verify.reference_forward(f), seed=0)


def _rank(
    loops: list[Loop], fwd: bool, B: int, H: int, dtype: torch.dtype, device, times: dict
) -> list[Loop]:
    """`loops` that run one direction correctly, fastest first. Each is first checked against the float64
    reference (gpu_verify: a partial batch tile, element-wise, a tolerance from the dtype), then timed; one
    that raises or is off the reference is left out with the reason: a kernel racing on some GPU is caught
    here, before it trains anything."""
    d = "fwd" if fwd else "bwd"
    bufs = _tuning_buffers(B, H, dtype, device)
    bufs = bufs if fwd else _backward_buffers(bufs)
    ms: dict[Loop, float] = {}
    for loop in [lp for lp in loops if d in lp.directions]:
        try:
            why = gpu_verify.check(loop, fwd, gpu_verify.check_rows(B), H, dtype, device)
            if why is not None:
                raise ArithmeticError(why)
            ms[loop] = _time_ms(lambda loop=loop: gpu_loops.run(loop, fwd, bufs, B, T_TUNE, H))
        except (
            Exception
        ) as e:  # a candidate this device or Triton cannot run, or gets wrong: left out, with why
            times[f"{d}/{loop.name}"] = _why(e)
            continue
        times[f"{d}/{loop.name}"] = round(ms[loop], 3)
    if not ms:
        raise NoLoop(f"no GPU loop of the mLSTM core runs here: {times}")
    return sorted(ms, key=ms.__getitem__)


def _tune(B: int, H: int, dtype: torch.dtype, device, backward: bool) -> Choice:
    loops = candidates(B, H, dtype, device)
    log.info(
        "timing the mLSTM core's GPU loops for B%d H%d %s (%s): once per shape, seconds (kernels compile)",
        B, H, str(dtype).removeprefix("torch."), ", ".join(lp.name for lp in loops),
    )  # fmt: skip
    times: dict = {}
    fwd = _rank(loops, True, B, H, dtype, device, times)
    bwd = _rank(loops, False, B, H, dtype, device, times) if backward else None
    gpu_loops.clear_graphs()  # the tuning lengths' graphs and arenas: not needed again
    return Choice(fwd, bwd, times=times)


def run(choice: Choice, fwd: bool, bufs: dict, B: int, T: int, H: int) -> None:
    """Run one direction of the shape's loops over `bufs`: the ranking's first loop, or, where it raises at
    launch (or, under MLSTM_BARRIER_HOST_WAIT=1, its grid barrier gave up), the next (one warning line; the
    work redone from the same inputs, which no loop writes). The failed loop leaves the ranking for the
    process. Raises NoLoop when none is left. A barrier loop runs on its row of the device's health flags
    (gpu_health): a barrier that gives up poisons the outputs and is found where the host already waits."""
    order = choice.fwd_order if fwd else choice.bwd_order
    d = "forward" if fwd else "backward"
    failures = []
    while order:
        loop = order[0]
        try:
            if loop.barrier:
                bar = gpu_health.flag(bufs["pm"].device, order, loop, f"{d} loop {loop.name} at B{B} H{H}")
                gpu_loops.run(loop, fwd, {**bufs, "bar": bar}, B, T, H)
            else:
                gpu_loops.run(loop, fwd, bufs, B, T, H)
            return
        except torch.cuda.OutOfMemoryError:
            raise  # the memory, not the loop: another loop would not fit either
        except Exception as e:
            order.pop(0)
            failures.append(f"{loop.name}: {_why(e)}")
            nxt = f"redoing it with the {order[0].name} loop" if order else "no other loop is left"
            log.warning(
                "mLSTM GPU %s loop %s failed at B%d H%d T%d (%s): %s", d, loop.name, B, H, T, _why(e), nxt
            )
    raise NoLoop(f"no GPU {d} loop of the mLSTM core ran at B{B} H{H}: {'; '.join(failures)}")


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
    default = "persistent" if interpreting() else ""
    want = _override[-1] if _override else os.environ.get("MLSTM_GPU_LOOP", default)
    if want and want not in (*LOOPS, "python"):
        raise UserError(
            f"MLSTM_GPU_LOOP must be one of {', '.join((*LOOPS, 'python'))} or unset, got {want!r}"
        )
    return want


def pick(want: str, loops: list[Loop]) -> Loop:
    """The loop named `want` among `loops` ("python": the step loop, for the Triton core's own calls);
    splitk where its tiles are the persistent loop's (it is then not a candidate): the persistent loop."""
    by_name = {loop.name: loop for loop in loops}
    name = "step" if want == "python" else want
    if name == "splitk" and name not in by_name:
        if "splitk" not in _logged:
            _logged.add("splitk")
            log.info("MLSTM_GPU_LOOP=splitk: this shape's split tiles are the persistent loop's: it runs")
        name = "persistent"
    return by_name[name]


def _fallbacks(first: Loop, loops: list[Loop], direction: str) -> list[Loop]:
    """`first`, then the other loops that run `direction` in FALLBACK_ORDER."""
    rest = sorted((lp for lp in loops if lp is not first and direction in lp.directions),
                  key=lambda lp: FALLBACK_ORDER.index(lp.name))  # fmt: skip
    return [first, *rest]


def _forced(B: int, H: int, dtype: torch.dtype, device) -> Choice | None:
    """MLSTM_GPU_LOOP's loop, untimed, both directions; the others behind it as fallbacks."""
    want = forced_loop()
    if not want:
        return None
    loops = candidates(B, H, dtype, device)
    loop = pick(want, loops)
    fwd = loop if "fwd" in loop.directions else pick("persistent", loops)  # splitk's forward is persistent's
    return Choice(_fallbacks(fwd, loops, "fwd"), _fallbacks(loop, loops, "bwd"), python=want == "python",
                  times={"forced": want})  # fmt: skip


def batch_bucket(B: int) -> int:
    """The batch size a choice is made for: the next power of two, at least 16. A micro-batch with fewer
    rows (a bucket's last, an evaluation's) reuses its bucket's loops and compiled kernels (the kernels mask
    the rows past B) instead of a fresh timing mid-run."""
    return max(16, next_pow2(B))


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
            choice = Choice([], [], python=True, times={"failed": str(e)})
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
    names = (
        "gpu_loops.py",
        "gpu_tiles.py",
        "gpu_verify.py",
        "triton_kernels.py",
        "gpu_tuning.py",
        "triton_core.py",
        "mlstm_core.py",
    )
    return tuple(str(here / name) for name in names)


def _cached(B: int, H: int, dtype: torch.dtype, device, backward: bool) -> Choice | None:
    """The ranking stored for the shape, checked on a small input (once per process: the choice is then kept
    in _choices), or None: nothing stored, an entry this code does not know (another format, a loop name
    that is not a candidate here), or one whose first loop fails its check now (said in one line)."""
    entry = gpu_choice_cache.load(B, H, dtype, device, _code_files(), _variant(dtype))
    if entry is None:
        return None
    try:
        loops = {loop.name: loop for loop in candidates(B, H, dtype, device)}
        fwd = [loops[n] for n in entry["fwd"]]
        bwd = [loops[n] for n in entry["bwd"]] if entry["bwd"] is not None else None
        choice = Choice(fwd, bwd, entry["python"], {"cached": True})
    except (KeyError, TypeError):
        return None  # a foreign or older entry: time it
    if not fwd or (backward and not bwd) or not isinstance(entry["python"], (bool, type(None))):
        return None
    for loop, d in ((choice.fwd, True), (choice.bwd, False)):
        try:
            why = (
                None
                if loop is None
                else gpu_verify.check(loop, d, gpu_verify.check_rows(B), H, dtype, device)
            )
        except Exception as e:
            why = _why(e)
        if why is not None:
            log.warning("the cached mLSTM GPU loop %s (B%d H%d) fails its check here (%s): timing afresh",
                        loop.name, B, H, why)  # fmt: skip
            return None
    return choice


def _store(B: int, H: int, dtype: torch.dtype, device, choice: Choice) -> None:
    if "forced" in choice.times or choice.fwd is None:  # a failure may not last: the next run tries again
        return
    bwd = [lp.name for lp in choice.bwd_order] if choice.bwd_order is not None else None
    entry = {"fwd": [lp.name for lp in choice.fwd_order], "bwd": bwd, "python": choice.python}
    gpu_choice_cache.store(B, H, dtype, device, _code_files(), entry, _variant(dtype))


def _variant(dtype: torch.dtype) -> str:
    """What else decides a shape's products: tf32 for fp32 operands where torch allows it."""
    return "tf32" if dtype == torch.float32 and torch.backends.cuda.matmul.allow_tf32 else ""
