"""A function of tensors replayed as one CUDA graph: the GPU core's whole op (app/model/triton_core.py) each
way, where the tuner measured that it pays (app/model/gpu_tuning.py), so the op's launches outside its time
loop (the input projection, the bias, the copies, the weight-gradient products, dx) cost one replay instead of
a launch each.

`call(tag, fn, inputs)` runs `fn(*inputs)` (a tuple of tensors out, reading nothing it writes) and hands on its
outputs. Per (tag, the inputs' shapes, strides, dtypes and device):
    the first call runs `fn` eagerly (its kernels compiled, its loops checked, its products' choices made:
    nothing inside a capture may wait on the host);
    the second copies its inputs into static tensors of its own and captures `fn` over them into a graph;
    every call from then on copies its inputs in, replays, and hands on copies of the outputs (the next call
    of the same shape, another layer's or micro-batch's, replays over the same memory before this call's
    outputs are done with: a training step keeps several alive until their backward).
Every graph's temporaries live in one memory pool per device: a graph's outputs are copied out before the next
replay of any graph, so nothing in the pool outlives the replay that wrote it. The static inputs and outputs
the kept graphs hold are at most MAX_BYTES (the least recently used graph goes first); a call whose own
tensors would take more than half of that runs eagerly (launches are a small share of its time there).

`MLSTM_OP_GRAPH`: auto (default: where the tuner measured it faster, after its replay passed the float64
check), 0 (never), 1 (wherever its replay passes the check, faster or not: an A/B on a GPU). Off with
`MLSTM_CUDA_GRAPHS=0`, in Triton's interpreter and off CUDA.
"""

from __future__ import annotations

import collections
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from app.common.errors import UserError
from app.model.gpu_tiles import interpreting

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
    if os.environ.get("MLSTM_CUDA_GRAPHS", "1") == "0":
        return "MLSTM_CUDA_GRAPHS=0"
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
class _Graph:
    graph: torch.cuda.CUDAGraph
    inputs: list[torch.Tensor]
    outputs: list[torch.Tensor]
    nbytes: int


_graphs: collections.OrderedDict = collections.OrderedDict()  # key -> _Graph, least recently used first
_seen: dict = {}  # key -> bytes of the eager first call's inputs and outputs
_pools: dict = {}  # device -> the graphs' shared memory pool


def _key(owner: int, tag: tuple, inputs: Sequence[torch.Tensor]) -> tuple:
    return (owner, tag, tuple((tuple(t.shape), t.stride(), t.dtype, t.device) for t in inputs))


def held_bytes() -> int:
    """The static inputs and outputs the kept graphs hold."""
    return sum(g.nbytes for g in _graphs.values())


def graphs_held() -> int:
    return len(_graphs)


def clear() -> None:
    """Drop every graph and what they hold."""
    _graphs.clear()
    _seen.clear()


def forget(owner: int) -> None:
    """Drop the graphs made for `owner` (the id of the choice they run: a tuner's trial, a check's, a shape whose
    graphs failed) and the record of their eager first calls."""
    for store in (_graphs, _seen):
        for key in [k for k in store if k[0] == owner]:
            del store[key]


def call(
    owner: int, tag: tuple, fn: Callable[..., Sequence[torch.Tensor]], inputs: Sequence[torch.Tensor]
) -> list:
    """fn(*inputs)'s outputs: eagerly on a shape's first call (and where its tensors take more than half of
    MAX_BYTES), from a replay of its graph on every later one (module docstring); graphs are kept per `owner`
    (`forget`), `tag` (what `fn` computes) and the inputs' layout. What the eager call raises propagates; a
    capture or a replay that raises drops the graph and raises GraphFailed (the caller runs `fn` eagerly
    instead: it reads nothing it writes)."""
    key = _key(owner, tag, inputs)
    entry = _graphs.get(key)
    if entry is None:
        size = _seen.get(key)
        if size is None or too_large(size):
            out = list(fn(*inputs))
            _seen[key] = nbytes(inputs) + nbytes(out)
            return out
    try:
        if entry is None:
            entry = _capture(key, fn, inputs)
        _graphs.move_to_end(key)
        for static, t in zip(entry.inputs, inputs):
            static.copy_(t)
        entry.graph.replay()
    except torch.cuda.OutOfMemoryError:
        _graphs.pop(key, None)
        raise  # the memory, not the graph
    except Exception as e:
        _graphs.pop(key, None)
        lines = str(e).strip().splitlines()
        raise GraphFailed(f"{type(e).__name__}: {lines[0][:160] if lines else ''}") from e
    return [t.clone() for t in entry.outputs]


def _capture(key: tuple, fn: Callable, inputs: Sequence[torch.Tensor]) -> _Graph:
    device = inputs[0].device
    static = [torch.empty_like(t).copy_(t) for t in inputs]
    pool = _pools.get(device)
    if pool is None:
        pool = _pools[device] = torch.cuda.graph_pool_handle()
    graph = torch.cuda.CUDAGraph()
    # thread_local: another thread's CUDA calls (a data loader's, a logger's) do not break this capture
    with torch.cuda.device(device), torch.cuda.graph(graph, pool=pool, capture_error_mode="thread_local"):
        outputs = list(fn(*static))
    entry = _graphs[key] = _Graph(graph, static, outputs, nbytes(static) + nbytes(outputs))
    while held_bytes() > MAX_BYTES and len(_graphs) > 1:
        _graphs.popitem(last=False)
    return entry
