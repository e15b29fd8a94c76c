"""Wall time spent inside the fused core's ops (its forward and backward time loops), for the benchmarks'
Amdahl bound: the speed a layer or a training step would reach if the time loop took no time at all.

    with timing_fused_loop() as clock:   # None when the fused core did not build
        clock.reset(); step(); loop_s = clock.seconds

Everything else in the step (input projections, weight gradients, weight norm, embedding, output layer,
loss, optimizer) is work the core shares with the Python core, so `python step / (fused step - loop)` is
the most a faster time loop could make `fused / python`, and a target above it is out of any core's reach.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

import app.model.fused_core as fused_core

_TIMED = ("forward", "backward")  # the ops that run a whole time loop


class LoopClock:
    """Seconds inside the fused ops since the last reset."""

    def __init__(self) -> None:
        self.seconds = 0.0

    def reset(self) -> None:
        self.seconds = 0.0


class _TimedOps:
    """The op namespace with forward / backward timed into `clock`; every other op passed through."""

    def __init__(self, ops: object, clock: LoopClock) -> None:
        self._ops, self._clock = ops, clock

    def __getattr__(self, name: str):
        fn = getattr(self._ops, name)
        if name not in _TIMED:
            return fn

        def timed(*args):
            t0 = time.perf_counter()
            try:
                return fn(*args)
            finally:
                self._clock.seconds += time.perf_counter() - t0

        return timed


@contextlib.contextmanager
def timing_fused_loop() -> Iterator[LoopClock | None]:
    """Times the fused ops for the duration of the block; yields None when the core is unavailable."""
    real = fused_core.fused_ops
    ops = real()
    if ops is None:
        yield None
        return
    clock = LoopClock()
    timed = _TimedOps(ops, clock)
    fused_core.fused_ops = lambda: timed
    try:
        yield clock
    finally:
        fused_core.fused_ops = real
