"""How the tuner (app/model/gpu_tuning.py) ranks the GPU loops of a shape: each candidate checked against the float64
reference on the path training runs (app/model/gpu_verify.py), then timed as the layer runs it.

The ranking's time is the whole op (`op`: triton_core.run_op, the op's own forward and backward code with the
candidate pinned), forward and backward back to back: the input projection, the loop, the weight-gradient
products, every launch and host wait, the CUDA-graph replays of the graphed loops (after their capture in the
warm-up runs). So a loop that is fast alone but holds the host (a launch that waits for its result, the work
behind it queued late) ranks by what it costs the layer. The forwards are timed behind one backward (the first
that passed its check, in the fallback order), then the backwards behind the fastest forward: each candidate
once, not every pair. Beside it each loop is timed alone (`loop/...`) and the traffic model's time for its tiles
(`model/...`, app/model/gpu_traffic.py) is recorded: the tuner's log prints all three.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from app.model import gpu_loops, gpu_traffic, gpu_verify, op_graph, wgrad_overlap
from app.model.gpu_loops import Loop
from app.model.gpu_tiles import interpreting, predicted_us, weights_in_l2

T_TUNE = 64  # steps per timed run: per-step costs dominate; the fixed ones (a launch, a replay) count too
REPS, WARMUP = 5, 3  # timed runs (median) after warm-up runs: compile, graph capture, first replay


class NoLoop(RuntimeError):
    """No GPU loop ran on this device for the shape (every candidate failed or disagreed)."""


@dataclass
class Choice:
    """The loops of a shape, fastest first (each direction's ranking: the first runs, the others are its
    fallbacks). fwd_order empty: no loop runs on this device (times["failed"] says why): the reference core
    does. bwd_order None: only the forward was needed (inference) so far. `checked`: the (label, forward?) that
    passed the float64 check in this process (a loop runs only once it has)."""

    fwd_order: list[Loop]
    bwd_order: list[Loop] | None
    python: bool | None = None  # whether the reference core wins; None: not compared yet
    times: dict = field(default_factory=dict)
    checked: set = field(default_factory=set)
    op_graph: bool | None = None  # the op runs as CUDA graphs (app/model/op_graph.py); None: not compared yet
    # time chunks of the overlapped weight gradients (app/model/wgrad_overlap.py; 0: none); None: not compared
    wgrad_chunks: int | None = None

    @property
    def fwd(self) -> Loop | None:
        return self.fwd_order[0] if self.fwd_order else None

    @property
    def bwd(self) -> Loop | None:
        return self.bwd_order[0] if self.bwd_order else None


# the whole op with a pinned choice: (choice, leaves (x, w_in, bias, w_mh, w_m), dy or None for a forward only)
Op = Callable[[Choice, list, "torch.Tensor | None"], None]


def time_ms(
    fn, reps: int | None = None, warmup: int | None = None, stat: Callable = statistics.median
) -> float:
    """`stat` (the median; `min` for a peak rate) of `reps` runs timed with CUDA events, after `warmup` (compile,
    graph capture, first replay). Off CUDA (Triton's interpreter, the CPU tests of this module) a wall clock
    stands in."""
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
    return stat(times)


def why(e: BaseException) -> str:
    lines = str(e).strip().splitlines()
    return f"{type(e).__name__}: {lines[0][:160]}" if lines else type(e).__name__


def why_not(loop: Loop, fwd: bool, B: int, H: int, dtype: torch.dtype, device) -> str | None:
    """Why `loop` may not run one direction of a B-row bucket (gpu_verify: off the float64 reference on a
    partial batch tile, on the path training runs; or it raised: a kernel this device or Triton cannot run),
    or None."""
    try:
        return gpu_verify.check(loop, fwd, gpu_verify.check_rows(B), H, dtype, device)
    except torch.cuda.OutOfMemoryError:
        raise  # the memory, not the loop
    except Exception as e:
        return why(e)


def passes(loop: Loop, fwd: bool, B: int, H: int, dtype: torch.dtype, device, times: dict) -> bool:
    """Whether `loop` runs one direction right; if not, why goes into `times` under its direction and label."""
    wrong = why_not(loop, fwd, B, H, dtype, device)
    if wrong is not None:
        times[f"{'fwd' if fwd else 'bwd'}/{loop.label}"] = wrong
    return wrong is None


def op_inputs(
    B: int, D: int, H: int, dtype: torch.dtype, device, backward: bool
) -> tuple[list, torch.Tensor | None]:
    """The op's leaves (x, w_in, bias, w_mh, w_m) at B rows and T_TUNE steps, at the scale training sees, and a
    dy (None for a forward alone)."""
    return gpu_verify.op_case(B, T_TUNE, D, H, dtype, device, backward, seed=1)


def _op_ms(op: Op, choice: Choice, inputs: tuple, key: str, times: dict) -> float | None:
    """The whole op's time with `choice` pinned, or None (why in `times[key]`) where it raised."""
    try:
        ms = time_ms(lambda: op(choice, *inputs))
    except Exception as e:
        times[key] = why(e)
        return None
    times[key] = round(ms, 3)
    return ms


def rank(loops: list[Loop], B: int, D: int, H: int, dtype: torch.dtype, device, backward: bool, op: Op,
         times: dict) -> Choice:  # fmt: skip
    """The candidates that pass their check, ranked by the whole op's time (forwards behind the first backward
    that passed, backwards behind the fastest forward); each loop's own time and its model time beside."""
    fwd = [lp for lp in loops if "fwd" in lp.directions and passes(lp, True, B, H, dtype, device, times)]
    bwd = [
        lp
        for lp in loops
        if backward and "bwd" in lp.directions and passes(lp, False, B, H, dtype, device, times)
    ]
    if not fwd or (backward and not bwd):
        raise NoLoop(f"no GPU loop of the mLSTM core runs here: {times}")
    checked = {(lp.label, True) for lp in fwd} | {(lp.label, False) for lp in bwd}
    inputs = op_inputs(B, D, H, dtype, device, backward)
    base = [bwd[0]] if backward else None
    ms = {f: _op_ms(op, Choice([f], base, checked=checked), inputs, f"fwd/{f.label}", times) for f in fwd}
    fwd = sorted((f for f in fwd if ms[f] is not None), key=ms.__getitem__)
    if not fwd:
        raise NoLoop(f"no GPU loop of the mLSTM core runs here: {times}")
    if backward:  # behind the fastest forward, the first backward's time is the fastest forward's own
        again = {b: _op_ms(op, Choice(fwd[:1], [b], checked=checked), inputs, f"bwd/{b.label}", times)
                 for b in bwd[1:]}  # fmt: skip
        ms = {bwd[0]: ms[fwd[0]], **again}
        times[f"bwd/{bwd[0].label}"] = times[f"fwd/{fwd[0].label}"]
        bwd = sorted((b for b in bwd if ms[b] is not None), key=ms.__getitem__)
        if not bwd:
            raise NoLoop(f"no GPU loop of the mLSTM core runs here: {times}")
    _alone(fwd, bwd if backward else [], B, H, dtype, device, times)
    return Choice(fwd, bwd if backward else None, times=times, checked=checked)


PATHS = {"graph": "as CUDA graphs", "overlap": "weight gradients overlapped", "plain": "plain"}


def rank_paths(choice: Choice, B: int, D: int, H: int, dtype: torch.dtype, device, op: Op) -> None:
    """How the shape's op runs in training, measured: plain (the loops' own graphs where they have them), as
    CUDA graphs each way (app/model/op_graph.py), or with the weight gradients overlapped with the loop
    (app/model/wgrad_overlap.py, AUTO_CHUNKS pieces; not tried where MLSTM_WGRAD_OVERLAP decides for every
    shape). Each path but plain is first checked against the float64 reference on the path it runs
    (gpu_verify.check_op); those that pass are timed as the whole op beside plain (`path/<name>`, ms for T_TUNE
    steps) and the fastest runs (MLSTM_OP_GRAPH=1: the graphs wherever they pass). Where a path cannot run or
    fails its check, why is under its key. Sets choice.op_graph and choice.wgrad_chunks."""
    plain = gpu_verify.trial(choice, op_graph=False, wgrad_chunks=0)
    trials = {"graph": gpu_verify.trial(choice, op_graph=True, wgrad_chunks=0)}
    if wgrad_overlap.chunks() is None:
        trials["overlap"] = gpu_verify.trial(choice, op_graph=False, wgrad_chunks=wgrad_overlap.AUTO_CHUNKS)
    inputs: tuple = ()
    ms: dict[str, float] = {}
    for name, trial in trials.items():
        try:
            wrong = _path_why_not(name, trial, B, D, H, dtype, device, op)
            if wrong is None:
                inputs = inputs or op_inputs(B, D, H, dtype, device, backward=True)
                ms[name] = time_ms(lambda t=trial, i=inputs: op(t, *i))
        except torch.cuda.OutOfMemoryError:
            raise
        except Exception as e:
            wrong = why(e)
        finally:
            op_graph.forget(id(trial))  # the check's and the timing's graphs (and their pool): not training's
        if wrong is not None:
            choice.times[f"path/{name}"] = wrong
    if ms:
        ms["plain"] = time_ms(lambda: op(plain, *inputs))
    choice.times.update({f"path/{k}": round(v, 3) for k, v in ms.items()})
    best = min(ms, key=ms.__getitem__) if ms else "plain"
    if op_graph.mode() == "1" and "graph" in ms:
        best = "graph"
    chosen = trials.get(best, plain)
    choice.op_graph, choice.wgrad_chunks = chosen.op_graph, chosen.wgrad_chunks


def paths_set() -> bool:
    """Whether the environment decides the op's path for every shape (MLSTM_OP_GRAPH=0|1, MLSTM_CUDA_GRAPHS=0,
    MLSTM_WGRAD_OVERLAP=N): the ranking's path is then not the shape's own, and is not cached."""
    return op_graph.mode() != "auto" or gpu_loops.graphs_off() or wgrad_overlap.chunks() is not None


def _path_why_not(
    name: str, trial: Choice, B: int, D: int, H: int, dtype: torch.dtype, device, op: Op
) -> str | None:
    """Why the op's path `name` may not run the shape (too large for a graph, or off the float64 reference), or
    None; what the op raises propagates."""
    if name == "graph" and (big := op_graph.too_large(op_graph.call_bytes(B * T_TUNE, D, H, dtype.itemsize))):
        return big  # not run at all
    return gpu_verify.check_op(op, trial, B, D, H, dtype, device)


def path_words(choice: Choice) -> str:
    """The op's paths as the ranking line ends: each one's ms beside plain's, or why it did not run, and which
    runs ("" where they were not compared)."""
    t = choice.times
    parts = [f"{words} {t[f'path/{n}']}" if isinstance(t[f"path/{n}"], float) else f"{words}: not run ({t[f'path/{n}']})"
             for n, words in PATHS.items() if f"path/{n}" in t]  # fmt: skip
    if not parts:
        return ""
    runs = "graph" if choice.op_graph else "overlap" if choice.wgrad_chunks else "plain"
    return f"; the whole op {', '.join(parts)}: {PATHS[runs]} runs"


def _alone(fwd: list[Loop], bwd: list[Loop], B: int, H: int, dtype: torch.dtype, device, times: dict) -> None:
    """Each ranked loop timed alone on T_TUNE steps (`loop/<direction>/<label>`), beside the traffic model's
    time for its tiles (`model/...`; none for the cuBLAS loop)."""
    f = gpu_verify.forward_case(B, T_TUNE, H, dtype, device, seed=0)
    bufs = {
        True: f,
        False: gpu_verify.backward_case(f, gpu_verify.reference_forward(f), seed=0) if bwd else None,
    }
    _, l2, cc = device_size(device)
    rates, streamed = device_rates(device), not weights_in_l2(H, dtype, l2)
    for loop, d in [(lp, True) for lp in fwd] + [(lp, False) for lp in bwd]:
        key = f"{'fwd' if d else 'bwd'}/{loop.label}"
        try:
            times[f"loop/{key}"] = round(
                time_ms(lambda lp=loop, d=d: gpu_loops.run(lp, d, bufs[d], B, T_TUNE, H)), 3
            )
        except Exception as e:  # it ran in the op: a failure here is said, not fatal
            times[f"loop/{key}"] = why(e)
        us = predicted_us(loop.tiles, d, B, H, dtype, rates, streamed, loop.name, cc)
        if us is not None:
            times[f"model/{key}"] = round(us * T_TUNE / 1e3, 3)


def device_size(device) -> tuple[int, int, int]:
    """(SMs, L2 bytes, compute capability as 90 for sm_90) of a CUDA device; in the interpreter, a 3-SM Hopper
    whose L2 holds any layer."""
    if interpreting():
        return 3, 1 << 40, 90
    props = torch.cuda.get_device_properties(device)
    return props.multi_processor_count, getattr(props, "L2_cache_size", 0), 10 * props.major + props.minor


def device_rates(device) -> gpu_traffic.Rates:
    """The traffic model's rates for `device` (in the interpreter: the H100's scaled to its 3 SMs)."""
    if interpreting():
        return gpu_traffic.rates_for("triton interpreter", 3)
    props = torch.cuda.get_device_properties(device)
    return gpu_traffic.rates_for(props.name, props.multi_processor_count)
