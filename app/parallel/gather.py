"""The whole model's weights on one rank, from any training layout (for samples during training).

Pipeline stages hold disjoint layers (replicas of a stage hold the same ones), ZeRO-1/2 keep every
parameter whole on every replica, ZeRO-3 partitions them. `gather_full_state` returns, on `dst`, the
float32 CPU state dict with `app.model.lm.LanguageModel` keys ("{i}.{name}"), the same keys a consolidated
checkpoint has; other ranks get None. Every rank must call it (it is a collective).
"""

from __future__ import annotations

import re

import deepspeed
import torch
import torch.distributed as dist

from app.parallel.engine import Engine

StateDict = dict[str, torch.Tensor]

_TIED = re.compile(r"^tied_modules\.[^.]+\.")


def _cpu_float(t: torch.Tensor) -> torch.Tensor:
    t = t.detach()
    return (t.float() if t.is_floating_point() else t).to("cpu", copy=True)


def local_state(module: torch.nn.Module) -> StateDict:
    """`module`'s weights (one stage's layers, or all) under LanguageModel keys, float32 on the CPU.

    A tied embedding lives under "tied_modules.<key>." in every stage that uses it; it is layer 0's weight.
    """
    return {_TIED.sub("0.", k): _cpu_float(v) for k, v in module.state_dict().items()}


def gather_full_state(engine: Engine, dst: int = 0) -> StateDict | None:
    """The full float32 CPU state dict on rank `dst` (None elsewhere). Collective: every rank calls it."""
    rank, module = dist.get_rank(), engine.module
    if engine.layout.stages == 1:
        if engine.layout.zero_stage == 3:  # partitioned: every rank takes part in assembling the weights
            with deepspeed.zero.GatheredParameters(list(module.parameters()), modifier_rank=None):
                return local_state(module) if rank == dst else None
        return local_state(module) if rank == dst else None  # ZeRO 0-2: every replica holds it all
    # P > 1 (ZeRO 0/1): one replica of each stage sends its layers (the replicas of a stage are identical)
    send = local_state(module) if engine.dp_rank == 0 else None
    parts: list | None = [None] * dist.get_world_size() if rank == dst else None
    dist.gather_object(send, parts, dst=dst)
    if parts is None:
        return None
    full: StateDict = {}
    for part in parts:
        full.update(part or {})
    return full
