"""--carry-state on a rank: hand its recurrent layers each step's carry masks, and keep their carried
states in the checkpoint so a resumed run continues every stream from where the saved one stood.

Resume: the carried states are saved, one file per rank (`carry_rank{r}.pt`: per recurrent layer this
rank holds, in module order, its state per slot). A resume point mid-document is the common case (a
document of 100 chunks spans 100 steps of its slot), so restarting at document boundaries would either
waste the steps since the last one or need a save schedule tied to the data; the states are small
(slots x rows x hidden x 2 per layer). A resume in another layout (other stages or data-parallel ranks:
other slots) starts every stream from a zero state, and says so.
"""

from __future__ import annotations

from pathlib import Path

import torch

from app.batching.buckets import MicroBatch
from app.model.carry import CarriedState
from app.model.layers import RecurrentLayer


def attach(module: torch.nn.Module) -> list[RecurrentLayer]:
    """Give every recurrent layer of `module` (this rank's stage) a carried state; returns them in order."""
    layers = [m for m in module.modules() if isinstance(m, RecurrentLayer)]
    for layer in layers:
        layer.carry = CarriedState()
    return layers


def begin_step(layers: list[RecurrentLayer], mine: list[MicroBatch], device: torch.device) -> None:
    """This rank's micro-batches of the step, in order: each layer learns which rows carry their state."""
    masks = [None if mb.carry is None else torch.as_tensor(mb.carry, device=device) for mb in mine]
    for layer in layers:
        layer.carry.begin_step(masks)


def _file(ckpt_dir: Path, rank: int) -> Path:
    return ckpt_dir / f"carry_rank{rank}.pt"


def save(layers: list[RecurrentLayer], ckpt_dir: Path, rank: int) -> None:
    torch.save([dict(layer.carry.states) for layer in layers], _file(ckpt_dir, rank))


def load(layers: list[RecurrentLayer], ckpt_dir: Path, rank: int, device: torch.device) -> bool:
    """The states saved by this rank in the same layout; False (zero states) when there are none."""
    path = _file(ckpt_dir, rank)
    if not path.is_file():
        return False
    saved = torch.load(path, map_location=device, weights_only=True)
    if len(saved) != len(layers):
        return False
    for layer, states in zip(layers, saved, strict=True):
        layer.carry.states = {int(k): (v[0], v[1]) for k, v in states.items()}
    return True
