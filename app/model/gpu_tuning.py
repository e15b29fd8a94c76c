"""Which loop runs the mLSTM core on a GPU, per shape, chosen by measurement (as `cudnn.benchmark` does), and
the run of a choice that never hands on a wrong result.

On first use of a (device, B, H, dtype) (B: `batch_bucket`, the next power of two) the candidates of
app/model/gpu_loops.py (cublas, step, persistent; splitk for the backward; persistent-l2, the persistent loop on
the tiles the traffic model picks, where it predicts they pay: app/model/gpu_tiles.py) are each checked against
the float64 reference on a fresh input with a partial batch tile, on the path training runs
(app/model/gpu_verify.py), then timed as the layer runs them: the whole op, forward and backward back to back
(app/model/gpu_ranking.py); those that pass are ranked by that time for the process. `prefers_reference` then
times the whole op against the Python reference core (the dispatcher runs the reference where it wins, so the
GPU path is never slower than it). For training the tuner then measures how the op runs best
(gpu_ranking.rank_paths): plain, as CUDA graphs each way (app/model/op_graph.py) or with its weight gradients
overlapped with the loop (app/model/wgrad_overlap.py), each checked against float64 on its own path first. The
ranking is logged once with each loop's whole-op time, its time alone
and the traffic model's. A candidate that fails (a cooperative grid too large for the device, a kernel this
Triton cannot build, a result off the reference) is left out with its reason. Rankings are also written to disk
(app/model/gpu_choice_cache.py), so a later run starts without timing; a ranking read from disk has every loop
in it checked once per process, on a small input, before it is trusted: a fallback that fails is dropped (one
line), a first loop that fails has the shape timed afresh.

`run` runs a direction with the ranking's first loop and, where that loop raises at launch, (not yet checked
in this process) fails its check, or its grid barrier gave up under the old per-launch wait
(MLSTM_BARRIER_HOST_WAIT=1: gpu_loops.BarrierTimeout), redoes the work with the next one, with one warning line;
the failed loop is dropped from the ranking for the process. A barrier that gives up without that wait poisons
the loop's outputs (NaN) and sets its health flag, which the host reads where it already waits
(app/model/gpu_health.py), dropping the loop there. So no loop runs unchecked: a forced loop
(`MLSTM_GPU_LOOP=step|cublas|persistent|splitk|persistent-l2|python`, untimed) and each fallback behind it are
checked before their first run. `MLSTM_GPU_TILES=old|new` leaves out the l2 candidate, or today's persistent
and split tiles where an l2 one exists (an A/B of the tilings). In Triton's interpreter (the CPU tests) the loop
is MLSTM_GPU_LOOP's, default persistent, run phase by phase.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from pathlib import Path

import torch

from app.common.errors import UserError
from app.model import (
    gpu_choice_cache,
    gpu_health,
    gpu_loops,
    gpu_ranking,
    gpu_verify,
    op_graph,
    wgrad_overlap,
)
from app.model.gpu_loops import CublasLoop, Loop, PersistentLoop, SplitKLoop, StepLoop
from app.model.gpu_ranking import Choice, NoLoop, why
from app.model.gpu_tiles import interpreting, next_pow2, tile_sets

log = logging.getLogger(__name__)

__all__ = ["Choice", "NoLoop"]  # gpu_ranking's, used through this module by the op and the benchmarks
LOOPS = ("step", "cublas", "persistent", "splitk")
LABELS = (*LOOPS, "persistent-l2")  # what MLSTM_GPU_LOOP can name
FALLBACK_ORDER = ("cublas", "step", "persistent", "splitk")  # after a forced loop: cuBLAS's products first
_choices: dict = {}
_logged: set = set()
_override: list[str] = []  # forcing(): the loop to run, untimed (benchmarks, tests)


def candidates_for(B: int, H: int, dtype: torch.dtype, sms: int, l2_bytes: int, cc: int = 90) -> list[Loop]:
    """The loops the tuner times for a shape on a device of compute capability `cc` (90: sm_90) with `sms` SMs
    and `l2_bytes` of L2, in the fallback order (cuBLAS first): gpu_tiles.tile_sets' tilings, each as its loop."""
    kinds = {"cublas": CublasLoop, "step": StepLoop, "persistent": PersistentLoop, "splitk": SplitKLoop}
    loops: list[Loop] = []
    for c in tile_sets(B, H, dtype, sms, l2_bytes, cc):
        if c.programs:
            loops.append(kinds[c.kind](c.tiles, c.programs, tag=c.tag))
        else:
            loops.append(kinds[c.kind](c.tiles, tag=c.tag))
    return loops


def candidates(B: int, H: int, dtype: torch.dtype, device) -> list[Loop]:
    return candidates_for(B, H, dtype, *gpu_ranking.device_size(device))


def _tune(B: int, D: int, H: int, dtype: torch.dtype, device, backward: bool, op: gpu_ranking.Op) -> Choice:
    loops = candidates(B, H, dtype, device)
    log.info(
        "timing the mLSTM core's GPU loops for B%d H%d %s (%s): once per shape, seconds (kernels compile)",
        B, H, str(dtype).removeprefix("torch."), ", ".join(lp.label for lp in loops),
    )  # fmt: skip
    try:
        choice = gpu_ranking.rank(loops, B, D, H, dtype, device, backward, op, {})
        if backward:  # training: the op as CUDA graphs or its weight gradients overlapped, where they pay
            gpu_ranking.rank_paths(choice, B, D, H, dtype, device, op)
    finally:
        gpu_loops.clear_graphs()  # the tuning lengths' graphs and arenas: not needed again
    log.info("%s", ranking_line(choice, B, H, dtype))
    return choice


def ranking_line(choice: Choice, B: int, H: int, dtype: torch.dtype) -> str:
    """The ranking in one line: per direction, each loop (fastest first) with its tiles and ms for T_TUNE steps:
    the whole op as the layer runs it / the loop alone / the traffic model's prediction for the loop."""
    t = choice.times
    parts = []
    for d, order in (("fwd", choice.fwd_order), ("bwd", choice.bwd_order or [])):
        for lp in order:
            k = f"{d}/{lp.label}"
            ms = "/".join(str(t.get(p + k, "-")) for p in ("", "loop/", "model/"))
            parts.append(f"{k} [{lp.tiles.short(d == 'fwd')}] {ms}")
    dt = str(dtype).removeprefix("torch.")
    return (f"ranked the mLSTM core's GPU loops for B{B} H{H} {dt} (ms for T={gpu_ranking.T_TUNE}: whole op / loop "
            f"alone / traffic model): " + "; ".join(parts) + gpu_ranking.path_words(choice))  # fmt: skip


def _checked(choice: Choice, loop: Loop, fwd: bool, B: int, H: int, bufs: dict) -> str | None:
    """Why `loop` may not run (its float64 check fails, or raises), or None; checked once per process."""
    if (loop.label, fwd) in choice.checked:
        return None
    w = bufs["w_mh" if fwd else "w_mh_t"]
    wrong = gpu_ranking.why_not(loop, fwd, batch_bucket(B), H, w.dtype, w.device)
    if wrong is None:
        choice.checked.add((loop.label, fwd))
        return None
    return f"its float64 check: {wrong}"


def run(choice: Choice, fwd: bool, bufs: dict, B: int, T: int, H: int) -> None:
    """Run one direction of the shape's loops over `bufs`: the ranking's first loop, or, where it raises at
    launch, (its first run in this process) it fails its float64 check, or (under MLSTM_BARRIER_HOST_WAIT=1) its
    grid barrier gave up, the next (one warning line; the work redone from the same inputs, which no loop
    writes). The failed loop leaves the ranking for the process. Raises NoLoop when none is left. Inside the
    capture of the op's CUDA graph nothing falls back: what fails is raised (the capture failed, not the loop). A barrier loop
    runs on its row of the device's health flags (gpu_health): a barrier that gives up poisons the outputs and
    is found where the host already waits."""
    order = choice.fwd_order if fwd else choice.bwd_order
    d = "forward" if fwd else "backward"
    failures = []
    capturing = bufs["pm"].is_cuda and torch.cuda.is_current_stream_capturing()
    while order:
        loop = order[0]
        if (
            capturing and (loop.label, fwd) not in choice.checked
        ):  # a check waits on the host: not in a capture
            raise RuntimeError(
                f"the {d} loop {loop.label} is not checked yet: it is not run inside a capture"
            )
        try:
            wrong = _checked(choice, loop, fwd, B, H, bufs)
            if wrong is None:
                if loop.barrier:
                    what = f"{d} loop {loop.label} at B{B} H{H}"
                    gpu_loops.run(loop, fwd, {**bufs, "bar": gpu_health.flag(bufs["pm"].device, order, loop, what)},
                                  B, T, H)  # fmt: skip
                else:
                    gpu_loops.run(loop, fwd, bufs, B, T, H)
                return
        except torch.cuda.OutOfMemoryError:
            raise  # the memory, not the loop: another loop would not fit either
        except Exception as e:
            if capturing:  # the capture failed, not the loop: the op runs without its graph (op_graph.py)
                raise
            wrong = why(e)
        order.pop(0)
        failures.append(f"{loop.label}: {wrong}")
        nxt = f"redoing it with the {order[0].label} loop" if order else "no other loop is left"
        log.warning("mLSTM GPU %s loop %s failed at B%d H%d T%d (%s): %s", d, loop.label, B, H, T, wrong, nxt)
    raise NoLoop(f"no GPU {d} loop of the mLSTM core ran at B{B} H{H}: {'; '.join(failures)}")


@contextlib.contextmanager
def forcing(loop: str) -> Iterator[None]:
    """Within: every Triton core call runs `loop` (one of LABELS), untimed; its backward too."""
    if loop not in LABELS:
        raise ValueError(f"loop must be one of {LABELS}, got {loop!r}")
    _override.append(loop)
    try:
        yield
    finally:
        _override.pop()


def forced_loop() -> str:
    """The loop MLSTM_GPU_LOOP (or `forcing`) asks for, "" for none; a name that is none is one line."""
    default = "persistent" if interpreting() else ""
    want = _override[-1] if _override else os.environ.get("MLSTM_GPU_LOOP", default)
    if want and want not in (*LABELS, "python"):
        raise UserError(
            f"MLSTM_GPU_LOOP must be one of {', '.join((*LABELS, 'python'))} or unset, got {want!r}"
        )
    return want


def pick(want: str, loops: list[Loop]) -> Loop:
    """The loop labelled `want` among `loops` ("python": the step loop, for the Triton core's own calls);
    splitk where its tiles are the persistent loop's (it is then not a candidate): the persistent loop; a
    persistent loop on the tiling that is not a candidate here (MLSTM_GPU_TILES, a shape with no l2 tiles):
    the persistent loop that is, said once."""
    by_label = {loop.label: loop for loop in loops}
    name = "step" if want == "python" else want
    if name == "splitk" and name not in by_label:
        name = _instead(name, "persistent", "this shape's split tiles are the persistent loop's")
    if name in ("persistent", "persistent-l2") and name not in by_label:
        other = "persistent-l2" if name == "persistent" else "persistent"
        name = _instead(name, other, "this shape has no such tiles here (MLSTM_GPU_TILES, the traffic model)")
    return by_label[name]


def _instead(want: str, runs: str, why: str) -> str:
    if want not in _logged:
        _logged.add(want)
        log.info("MLSTM_GPU_LOOP=%s: %s: %s runs", want, why, runs)
    return runs


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
    # unchecked: each loop is checked by `run` before its first run (the forced one and any it falls back to)
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


def loops_for(
    x: torch.Tensor, w: torch.Tensor, backward: bool = True, op: gpu_ranking.Op | None = None
) -> Choice:
    """The loops for x (B, T, D) and a recurrent weight w (H, H) in the compute dtype: timed on first use, as
    the whole op `op` (triton_core.run_op) runs them."""
    key = (*_key(x, w), _override[-1] if _override else None)
    choice = _choices.get(key)
    if choice is not None and (choice.bwd is not None or not backward or choice.fwd is None):
        return choice
    choice = _reuse(key, backward)
    if choice is not None:
        _choices[key] = choice
        return choice
    B, H = batch_bucket(x.shape[0]), w.shape[0]
    choice = _forced(B, H, w.dtype, x.device) or _cached(B, H, w.dtype, x.device, backward, op)
    if choice is None:
        if op is None:
            raise ValueError("the loops of a new shape are timed in the op: loops_for needs op=")
        try:
            choice = _tune(B, x.shape[2], H, w.dtype, x.device, backward, op)
        except NoLoop as e:  # the reference core runs (core "auto"); core "fused" says why (triton_core)
            choice = Choice([], [], python=True, times={"failed": str(e)})
        _store(B, H, w.dtype, x.device, choice)
    elif backward and choice.op_graph is None and op is not None and "forced" not in choice.times:
        # a cached ranking without the shape's own path (another run's settings chose it): measured now
        gpu_ranking.rank_paths(choice, B, x.shape[2], H, w.dtype, x.device, op)
        log.info("mLSTM core's GPU op for B%d H%d %s, cached loops%s", B, H, str(w.dtype).removeprefix("torch."),
                 gpu_ranking.path_words(choice))  # fmt: skip
        _store(B, H, w.dtype, x.device, choice)
    _choices[key] = choice
    return choice


def prefers_reference(x: torch.Tensor, w: torch.Tensor, backward: bool, triton_fn, python_fn,
                      op: gpu_ranking.Op) -> str | None:  # fmt: skip
    """Why the Python reference core runs at this shape instead of the Triton core (its tuned loops), or None:
    both whole ops timed on T_TUNE steps (forward and backward, or forward alone), once per shape; or no
    Triton loop ran here. Logs the choice."""
    if _override:
        return None
    choice = loops_for(x, w, backward, op)
    if choice.python is None and choice.fwd is not None:
        B, D, H = batch_bucket(x.shape[0]), x.shape[2], w.shape[0]
        ms = {name: _time_op(fn, B, D, H, w.dtype, x.device, backward) for name, fn in
              (("triton", triton_fn), ("python", python_fn))}  # fmt: skip
        gpu_loops.clear_graphs()
        op_graph.forget(id(choice))  # the timed length's graphs: not training's
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
    leaves, dy = gpu_ranking.op_inputs(B, D, H, dtype, device, backward=True)
    leaves = [t.requires_grad_(backward) for t in leaves]

    def step() -> None:
        with torch.enable_grad():
            y = fn.apply(*leaves)
            if backward:
                y.backward(dy)

    reps, warmup = max(1, gpu_ranking.REPS - 2), min(2, gpu_ranking.WARMUP)
    return gpu_ranking.time_ms(step, reps=reps, warmup=warmup)


def _log(x: torch.Tensor, w: torch.Tensor, choice: Choice) -> None:
    if choice.fwd is None:
        what = f"python (the reference core): {choice.times['failed']}"
    else:
        what = "python (the reference core)" if choice.python else f"triton {choice.fwd.label} forward"
    if not choice.python and choice.bwd is not None:
        what += f", {choice.bwd.label} backward"
    dt = str(w.dtype).removeprefix("torch.")
    log.info("mLSTM core on %s %s B%d H%d: %s (ms at T=%d: %s)", x.device, dt, batch_bucket(x.shape[0]), w.shape[0], what,
             gpu_ranking.T_TUNE, choice.times)  # fmt: skip


# ---- the choice on disk (app/model/gpu_choice_cache.py)


def _code_files() -> tuple[str, ...]:
    # what runs each side of the choices stored (the reference's speed decides `python`); read by
    # path: triton_core imports this module, and the key needs its code, not the module
    here = Path(__file__).parent
    names = (
        "gpu_loops.py",
        "gpu_tiles.py",
        "gpu_traffic.py",
        "gpu_ranking.py",
        "gpu_verify.py",
        "triton_kernels.py",
        "triton_parts.py",
        "gpu_tuning.py",
        "op_graph.py",
        "wgrad_overlap.py",
        "triton_core.py",
        "mlstm_core.py",
    )
    return tuple(str(here / name) for name in names)


def _cached(
    B: int, H: int, dtype: torch.dtype, device, backward: bool, op: gpu_ranking.Op | None
) -> Choice | None:
    """The ranking stored for the shape, every loop in it checked on a small input (once per process: the choice
    is then kept in _choices), or None: nothing stored, an entry this code does not know (another format, a
    loop label that is not a candidate here), or one whose first loop fails its check now (said in one line).
    A fallback that fails its check is dropped from the ranking (said in one line); the op's path, where the
    entry has one (its CUDA graphs, its weight gradients overlapped), is checked too (`_cached_path`)."""
    entry = gpu_choice_cache.load(B, H, dtype, device, _code_files(), _variant(dtype))
    if entry is None:
        return None
    try:
        loops = {loop.label: loop for loop in candidates(B, H, dtype, device)}
        fwd = [loops[n] for n in entry["fwd"]]
        bwd = [loops[n] for n in entry["bwd"]] if entry["bwd"] is not None else None
        choice = Choice(fwd, bwd, entry["python"], {"cached": True})
    except (KeyError, TypeError):
        return None  # a foreign or older entry: time it
    flags = (entry["python"], entry.get("op_graph", "absent"))
    chunks = entry.get("wgrad_chunks", "absent")
    if not fwd or (backward and not bwd) or not all(isinstance(f, (bool, type(None))) for f in flags):
        return None
    if not (chunks is None or (type(chunks) is int and 0 <= chunks <= 64)):
        return None
    for order, d in ((choice.fwd_order, True), (choice.bwd_order or [], False)):
        for loop in list(order):
            wrong = gpu_ranking.why_not(loop, d, B, H, dtype, device)
            if wrong is None:
                choice.checked.add((loop.label, d))
                continue
            first = loop is order[0]
            log.warning("the cached mLSTM GPU loop %s (B%d H%d) fails its check here (%s): %s", loop.label, B, H,
                        wrong, "timing afresh" if first else "dropped from the ranking")  # fmt: skip
            if first:
                return None
            order.remove(loop)
    choice.op_graph, choice.wgrad_chunks = entry["op_graph"], chunks
    if choice.op_graph and op_graph.why_not(device) is not None:  # this run's settings leave the graphs out
        choice.op_graph = False
    if choice.wgrad_chunks and wgrad_overlap.chunks() is not None:  # MLSTM_WGRAD_OVERLAP decides here
        choice.wgrad_chunks = 0
    if choice.op_graph or choice.wgrad_chunks:
        _cached_path(choice, B, H, dtype, device, op)
    return choice


def _cached_path(
    choice: Choice, B: int, H: int, dtype: torch.dtype, device, op: gpu_ranking.Op | None
) -> None:
    """The op's path a cached ranking chose (its CUDA graphs, or its weight gradients overlapped), checked in
    this process (gpu_verify.check_op, at input width H: the path's code is the same at any); where it fails,
    one line, and the op runs plain."""
    trial = gpu_verify.trial(choice)
    try:
        wrong = (
            "no op to check it with" if op is None else gpu_verify.check_op(op, trial, B, H, H, dtype, device)
        )
    except torch.cuda.OutOfMemoryError:
        raise
    except Exception as e:
        wrong = why(e)
    finally:
        op_graph.forget(id(trial))  # the check's graphs: not training's
    if wrong is not None:
        path = gpu_ranking.PATHS["graph" if choice.op_graph else "overlap"]
        log.warning("the cached mLSTM GPU op's path (%s, B%d H%d) fails its check here (%s): the op runs plain",
                    path, B, H, wrong)  # fmt: skip
        choice.op_graph, choice.wgrad_chunks = False, 0


def _store(B: int, H: int, dtype: torch.dtype, device, choice: Choice) -> None:
    if "forced" in choice.times or choice.fwd is None:  # a failure may not last: the next run tries again
        return
    bwd = [lp.label for lp in choice.bwd_order] if choice.bwd_order is not None else None
    entry = {"fwd": [lp.label for lp in choice.fwd_order], "bwd": bwd, "python": choice.python,
             "op_graph": choice.op_graph, "wgrad_chunks": choice.wgrad_chunks}  # fmt: skip
    if gpu_ranking.paths_set():  # the environment's path, not the shape's: "not compared"
        entry.update(op_graph=None, wgrad_chunks=None)
    gpu_choice_cache.store(B, H, dtype, device, _code_files(), entry, _variant(dtype))


def _variant(dtype: torch.dtype) -> str:
    """What else decides a shape's products: tf32 for fp32 operands where torch allows it."""
    return "tf32" if dtype == torch.float32 and torch.backends.cuda.matmul.allow_tf32 else ""
