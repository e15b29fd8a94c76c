"""A function of tensors replayed as one CUDA graph: the GPU core's whole op (app/model/triton_core.py) each
way, where the tuner measured that it pays (app/model/gpu_tuning.py), so the op's launches outside its time
loop (the input projection, the bias, the copies, the weight-gradient products, dx) cost one replay instead of
a launch each.

`call(owner, tag, fn, inputs)` runs `fn(*inputs)` (a tuple of tensors out, reading nothing it writes) and hands
on its outputs. Per (owner: the choice the graph runs, tag: what `fn` computes, the inputs' shapes, strides,
dtypes and device):
    the first call copies its inputs into static tensors of its own and runs `fn` over them eagerly (its kernels
    compiled for the layout the capture will see, its loops checked, its products' choices made: nothing inside
    a capture may wait on the host);
    the second captures `fn` over the static tensors into a graph, on a stream of its own;
    every call from then on copies its inputs in, replays, and hands on copies of the outputs (the next call
    of the same shape, another layer's or micro-batch's, replays over the same memory before this call's
    outputs are done with: a training step keeps several alive until their backward).
Each owner's graphs share one memory pool, freed with them (`forget`): a graph's outputs are copied out before
the next replay of any graph, so nothing in the pool outlives the replay that wrote it. The static inputs and
outputs the kept graphs hold are at most MAX_BYTES (the least recently used graph goes first, captured again
when met again; one captured MAX_CAPTURES times runs eagerly from then on, said once); a call whose own tensors
would take more than half of MAX_BYTES runs eagerly (launches are a small share of its time there).

`MLSTM_OP_GRAPH`: auto (default: where the tuner measured it faster, after its replay passed the float64
check), 0 (never), 1 (wherever its replay passes the check, faster or not: an A/B on a GPU). Off with
`MLSTM_CUDA_GRAPHS=0` (or `MLSTM_GRAPH_CACHE=0`), in Triton's interpreter and off CUDA.
"""

from __future__ import annotations

import collections
import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from app.common.errors import UserError
from app.model import gpu_loops
from app.model.gpu_tiles import interpreting

log = logging.getLogger(__name__)
MAX_BYTES = 256 << 20  # static inputs and outputs of every kept graph
MODES = ("auto", "0", "1")


class Unavailable(RuntimeError):
    """The whole op cannot run as a graph here (why: one line)."""


class GraphFailed(RuntimeError):
    """A capture or a replay raised (the graph is dropped; the work was not handed on)."""


def mode() -> str:
    """MLSTM_OP_GRAPH: auto, 0 or 1; another value is one line."""
    want = os.environ.get("MLSTM_OP_GRAPH", "auto")
    if want not in MODES:
        raise UserError(f"MLSTM_OP_GRAPH must be one of {', '.join(MODES)} or unset, got {want!r}")
    return want


def why_not(device) -> str | None:
    """Why no graph runs on `device` in this process (one line), or None."""
    if interpreting():
        return "Triton's interpreter has no CUDA graphs"
    if torch.device(device).type != "cuda":
        return f"CUDA graphs run on CUDA devices, not {torch.device(device).type}"
    if mode() == "0":
        return "MLSTM_OP_GRAPH=0"
    if gpu_loops.graphs_off():
        return "CUDA graphs are off (MLSTM_CUDA_GRAPHS=0 or MLSTM_GRAPH_CACHE=0)"
    return None


def call_bytes(tokens: int, D: int, H: int, s: int) -> int:
    """The static inputs and outputs of one graph of the GPU core's op (app/model/triton_core.py) over `tokens`
    padded tokens of input width D and width H, operands of `s` bytes: its backward's (the larger way): dy, xt,
    the kept buffers (pm, gates, cs, tcs, rs in the state dtype; ms, hs) and the weights in, dx and the weights'
    gradients out (the forward: x and the weights in, h, xt and the same buffers out)."""
    S = 8 if s == 8 else 4
    weights = (5 * H * D + 5 * H * H) * s + 4 * H * S
    return tokens * (2 * D * s + 3 * H * s + 8 * H * S) + 2 * weights


def too_large(nbytes: int) -> str | None:
    """Why a call whose static tensors take `nbytes` runs eagerly (one line), or None."""
    if 2 * nbytes <= MAX_BYTES:
        return None
    return (f"a call's tensors ({nbytes / 2**20:.2f} MiB) exceed half of the graphs' {MAX_BYTES / 2**20:.0f} MiB: "
            "launches are a small share of its time")  # fmt: skip


def nbytes(tensors: Sequence[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


@dataclass
class _Entry:
    """One (owner, tag, input layout): its static inputs, its graph and the graph's outputs once captured."""

    inputs: list  # static inputs ([] once evicted: made afresh at the next capture)
    nbytes: int  # static inputs and outputs
    eager: bool = False  # runs eagerly: too large, or captured MAX_CAPTURES times already
    captures: int = 0
    graph: torch.cuda.CUDAGraph | None = None
    outputs: list | None = None


MAX_CAPTURES = 3  # captures of one key (each after an eviction) before it runs eagerly for good
_entries: collections.OrderedDict = collections.OrderedDict()  # key -> _Entry, least recently used first
_pools: dict = {}  # owner -> its graphs' memory pool (freed with them: `forget`)
_streams: dict = {}  # device -> the stream captures run on


def _key(owner: int, tag: tuple, inputs: Sequence[torch.Tensor]) -> tuple:
    return (owner, tag, tuple((tuple(t.shape), t.stride(), t.dtype, t.device) for t in inputs))


def held_bytes() -> int:
    """The static inputs and outputs the kept graphs hold."""
    return sum(e.nbytes for e in _entries.values() if e.graph is not None)


def graphs_held() -> int:
    return sum(e.graph is not None for e in _entries.values())


def clear() -> None:
    """Drop every graph, what they hold and their pools."""
    _entries.clear()
    _pools.clear()


def forget(owner: int) -> None:
    """Drop the graphs made for `owner` (the id of the choice they run: a tuner's trial, a check's, a shape whose
    graphs failed), their pool and the record of their first calls."""
    for key in [k for k in _entries if k[0] == owner]:
        del _entries[key]
    _pools.pop(owner, None)


def call(
    owner: int, tag: tuple, fn: Callable[..., Sequence[torch.Tensor]], inputs: Sequence[torch.Tensor]
) -> list:
    """fn(*inputs)'s outputs: eagerly on a shape's first call (over static copies of the inputs: the capture's
    own layout, so it compiles the kernels the capture runs), from a replay of its graph on every later one
    (module docstring); graphs are kept per `owner` (`forget`), `tag` (what `fn` computes) and the inputs'
    layout. A call too large for a graph, or captured MAX_CAPTURES times already, runs eagerly. What the eager
    call raises propagates; a capture or a replay that raises drops the graph and raises GraphFailed (the caller
    runs `fn` eagerly instead: it reads nothing it writes)."""
    key = _key(owner, tag, inputs)
    entry = _entries.get(key)
    if entry is None:
        return _first(key, fn, inputs)
    if entry.eager:
        return list(fn(*inputs))
    _entries.move_to_end(key)
    try:
        if entry.graph is None and not _capture(key, entry, fn, inputs):
            return list(fn(*inputs))
        for static, t in zip(entry.inputs, inputs):
            static.copy_(t)
        entry.graph.replay()
    except torch.cuda.OutOfMemoryError:
        entry.graph = entry.outputs = None
        raise  # the memory, not the graph
    except Exception as e:
        entry.graph = entry.outputs = None
        lines = str(e).strip().splitlines()
        raise GraphFailed(f"{type(e).__name__}: {lines[0][:160] if lines else ''}") from e
    return [t.clone() for t in entry.outputs]


def _first(key: tuple, fn: Callable, inputs: Sequence[torch.Tensor]) -> list:
    if too_large(nbytes(inputs)):
        _entries[key] = _Entry([], nbytes(inputs), eager=True)
        return list(fn(*inputs))
    static = [torch.empty_like(t).copy_(t) for t in inputs]
    out = list(fn(*static))
    entry = _entries[key] = _Entry(static, nbytes(static) + nbytes(out))
    if too_large(entry.nbytes):
        entry.eager, entry.inputs = True, []
    # an output that is a view of an input (a reshape that needed no copy) would change with the next call's
    storages = {t.untyped_storage().data_ptr() for t in static}
    return [t.clone() if t.untyped_storage().data_ptr() in storages else t for t in out]


def _capture(key: tuple, entry: _Entry, fn: Callable, inputs: Sequence[torch.Tensor]) -> bool:
    """Capture `fn` over the entry's static inputs into a graph (False: captured MAX_CAPTURES times already, it
    runs eagerly from now on). On a side stream of its own, without the device-wide synchronize and cache
    release of torch.cuda.graph: the current stream is restored even where the capture fails."""
    if entry.captures >= MAX_CAPTURES:
        entry.eager, entry.inputs = True, []
        log.warning("the mLSTM GPU op's CUDA graph %s was dropped and captured again %d times (more shapes than "
                    "%d MiB of graphs hold): it runs without a graph from now on", key[1][0], MAX_CAPTURES,
                    MAX_BYTES >> 20)  # fmt: skip
        return False
    device = inputs[0].device
    if not entry.inputs:
        entry.inputs = [torch.empty_like(t).copy_(t) for t in inputs]
    pool = _pools.get(key[0])
    if pool is None:
        pool = _pools[key[0]] = torch.cuda.graph_pool_handle()
    stream = _streams.get(device)
    if stream is None:
        stream = _streams[device] = torch.cuda.Stream(device)
    main = torch.cuda.current_stream(device)
    stream.wait_stream(main)  # the static inputs are written
    graph = torch.cuda.CUDAGraph()
    entry.captures += 1
    # thread_local: another thread's CUDA calls (a data loader's, a logger's) do not break this capture
    with torch.cuda.device(device), torch.cuda.stream(stream):
        graph.capture_begin(pool=pool, capture_error_mode="thread_local")
        try:
            outputs = list(fn(*entry.inputs))
        finally:
            graph.capture_end()
    main.wait_stream(stream)
    entry.graph, entry.outputs = graph, outputs
    _evict(key)
    return True


def _evict(keep: tuple) -> None:
    """Drop the least recently used graphs (their outputs and static inputs) while the kept ones hold more than
    MAX_BYTES; never `keep`."""
    for key, entry in list(_entries.items()):
        if held_bytes() <= MAX_BYTES:
            return
        if key != keep and entry.graph is not None:
            entry.graph = entry.outputs = None
            entry.inputs = []
