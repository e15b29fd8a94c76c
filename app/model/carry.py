"""Truncated BPTT across training steps: the recurrent state one layer carries from a micro-batch into the
same slot's next one (--carry-state).

The trainer hands every layer the step's carry masks before the step (`begin_step`), one per micro-batch
this rank runs, in order: None for a micro-batch whose rows all start from a zero state (the state is
neither read nor kept), else (B,) bool, True where row b continues row b of the previous masked
micro-batch of the same slot. Training forwards run in micro-batch order (DeepSpeed's 1F1B schedule runs
them so on every stage; gradient accumulation likewise), so the k-th training forward of a step is slot k.
The state enters a forward as a constant (detached): gradients stop at the chunk boundary.
"""

from __future__ import annotations

import torch

State = tuple[torch.Tensor, torch.Tensor]  # (h, c), each (B, H)


class CarriedState:
    """One layer's carried state per slot, and the masks of the step in progress."""

    def __init__(self) -> None:
        self.states: dict[int, State] = {}
        self._masks: list[torch.Tensor | None] = []
        self._k = 0

    def begin_step(self, masks: list[torch.Tensor | None]) -> None:
        self._masks, self._k = list(masks), 0

    def next_slot(self) -> tuple[int, torch.Tensor | None]:
        """(slot, mask) of the next training forward."""
        k = self._k
        if k >= len(self._masks):
            raise RuntimeError(f"training forward {k + 1} of a step that has {len(self._masks)} carry masks")
        self._k += 1
        return k, self._masks[k]

    def initial(self, slot: int, mask: torch.Tensor, zero: State) -> State:
        """Row b's kept state where mask[b], else zero; `zero` (h, c) each (B, H)."""
        kept = self.states.get(slot)
        if kept is None:
            return zero
        rows = min(len(mask), kept[0].shape[0])
        m = mask[:rows].to(zero[0].device).unsqueeze(1)  # (rows, 1)
        out = []
        for z, s in zip(zero, kept, strict=True):
            z = z.clone()
            z[:rows] = torch.where(m, s[:rows].to(z.dtype), z[:rows])
            out.append(z)
        return out[0], out[1]

    def keep(self, slot: int, state: State) -> None:
        self.states[slot] = (state[0].detach(), state[1].detach())
