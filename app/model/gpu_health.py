"""The GPU core's health flags: a persistent loop whose grid barrier gave up is found where the host already
waits, never by a wait of its own.

A persistent launch (app/model/gpu_loops.py) never blocks the host. Its barrier word is a row of a per-device
int32 tensor of FLAGS (one row per shape's ranking, direction and loop: [arrivals, failed]); a barrier that
gives up sets `failed`, and the kernel then writes NaN into every output tile its programs own
(app/model/triton_kernels.py), so nothing it computed leaves as a finite number. `failed` stays set (every
later launch of that loop poisons at once) until `check()` reads the flags, which it does where the host
already waits:

    training      after the step's loss is read (app/parallel/engine.py): the step's loss or gradients are
                  NaN, so the trainer's non-finite rule skips it (DeepSpeed's optimizers skip a non-finite
                  update, docs/gpu.md); the loop leaves its shape's ranking, in one warning line
    evaluation    a batch whose summed loss (the same on every rank) is not finite is run once more
                  (`redo`), every rank together, after each has read its flags
    inference     generation, stream and cache readers, featurizing and classify run each batch through
                  `checked`: a batch in which a loop failed is run again with the next loop

`MLSTM_BARRIER_HOST_WAIT=1` brings back the old per-launch wait (the flag read after every launch, the work
redone at once by the next loop: gpu_tuning.run), for an A/B of its cost on a GPU.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import TypeVar

import torch

log = logging.getLogger(__name__)
R = TypeVar("R")
SLOTS = 16  # rows of a device's flag tensor at first (it grows): shapes x directions x barrier loops
_flags: dict[torch.device, torch.Tensor] = {}  # device -> (slots, 2) int32 [arrivals, failed]
_slots: dict[tuple, int] = {}  # (device, id(ranking), loop label) -> row
_generation = [0]  # flag tensors made so far: a graph captured over an older one is captured again
_owners: dict[
    tuple[torch.device, int], tuple[list, object, str]
] = {}  # (device, row) -> (ranking, loop, what)


def host_wait() -> bool:
    """MLSTM_BARRIER_HOST_WAIT=1: the old wait after every persistent launch (an A/B switch, off by default)."""
    return os.environ.get("MLSTM_BARRIER_HOST_WAIT", "0") == "1"


def flag(device: torch.device, ranking: list, loop, what: str) -> torch.Tensor:
    """The barrier word (2,) int32 [arrivals, failed] of `loop` when it runs from `ranking` (a shape's ordered
    loops for one direction, which `check` drops it from), on `device`; `what` names it in the warning
    ("forward loop persistent at B128 H4096")."""
    device = torch.device(device)
    key = (device, id(ranking), _label(loop))
    row = _slots.get(key)
    if row is None:
        row = _slots[key] = sum(1 for k in _slots if k[0] == device)
        _owners[(device, row)] = (ranking, loop, what)  # holds the ranking: its id stays its own
    flags = _flags.get(device)
    if flags is None or flags.shape[0] <= row:
        if (
            device.type == "cuda" and torch.cuda.is_current_stream_capturing()
        ):  # it would live in the graph's pool
            raise RuntimeError(
                "a GPU loop's health flag is new inside a CUDA graph capture: run it eagerly first"
            )
        grown = torch.zeros(max(SLOTS, 2 * (row + 1)), 2, dtype=torch.int32, device=device)
        if flags is not None:
            grown[: flags.shape[0]].copy_(flags)  # on the device, in stream order: no host wait
        flags = _flags[device] = grown
        _generation[0] += 1
    return flags[row]


def generation() -> int:
    """How many flag tensors have been made: part of a captured graph's key (app/model/op_graph.py), since a
    graph writes the flag tensor it was captured over."""
    return _generation[0]


def _label(loop) -> str:
    """What the tuner calls a loop: its label (persistent-l2 told from persistent), else its name."""
    return getattr(loop, "label", loop.name)


def active() -> bool:
    """Whether a barrier loop has run in this process (else `check` has nothing to read)."""
    return bool(_flags)


def check() -> list[str]:
    """Read every device's flags (one small copy each; call it where the host already waits). Each loop whose
    barrier gave up leaves its ranking for the process, with one warning line; its flag is cleared. -> the
    lines said."""
    said = []
    for device, flags in _flags.items():
        failed = flags[:, 1].tolist()
        if not any(failed):
            continue
        for row in (r for r, f in enumerate(failed) if f):
            ranking, loop, what = _owners[(device, row)]
            if loop in ranking:
                ranking.remove(loop)
            nxt = f"the {_label(ranking[0])} loop runs it from now on" if ranking else "no other loop is left"
            said.append(
                f"mLSTM GPU {what} on {device}: its grid barrier gave up (its programs were not all resident), "
                f"its outputs were NaN; dropped from the shape's ranking, {nxt}"
            )
            log.warning(said[-1])
        flags[:, 1].zero_()
    return said


TRIES = 4  # runs of one batch at most: the loops a shape can fall back through


def checked(fn: Callable[..., R], *args, **kwargs) -> R:
    """`fn(*args, **kwargs)` (one batch's work that reads nothing it writes: it can run twice), run again where a
    GPU loop's barrier gave up in it (the loop dropped, one line each; TRIES runs at most). Without a barrier
    loop in the process it reads nothing."""
    out = fn(*args, **kwargs)
    for _ in range(TRIES - 1):
        if not active() or not check():
            break
        out = fn(*args, **kwargs)
    return out


def redo(batch_loss: float, device: torch.device) -> bool:
    """Whether an evaluation batch whose summed loss `batch_loss` (the same on every rank: summed across them)
    is not finite is run once more: where it ran on a GPU (or Triton's interpreter), a failed loop on any rank
    poisons the sum, so every rank reads its own flags (dropping a failed loop, one line) and every rank runs
    the batch again, together. A model whose loss is NaN for another reason gives NaN again."""
    from app.model.gpu_tiles import interpreting

    if batch_loss == batch_loss and abs(batch_loss) != float("inf"):
        return False
    if torch.device(device).type != "cuda" and not interpreting():
        return False
    if active():
        check()
    return True
