"""Preemption: SIGTERM, SIGINT or SIGUSR1 to any rank ends the run after the step in flight, with a save.

A handler only notes the signal (a step, a collective or a save is never cut short). Once per step every
rank all-reduces its note, at the same point of the linear train loop, so all ranks stop after the same
step even when one alone was signalled (Slurm's `--signal=USR1@...` to the tasks, `kill` to one rank, a
launcher that signals its children, or the launcher watch of app/parallel/runtime.py when the `deepspeed`
runner itself was stopped); the trainer then saves that step and exits with EXIT_PREEMPTED.
"""

from __future__ import annotations

import signal

import torch
import torch.distributed as dist

SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)
# EX_TEMPFAIL (sysexits.h): "try again later". Distinct from our errors (1, 2), a non-finite stop (3) and a
# lost peer (4); launch/slurm_train.sbatch requeues the job on it.
EXIT_PREEMPTED = 75


class Preemption:
    """Notes the first preemption signal this process gets; `agreed` makes it every rank's decision."""

    def __init__(self) -> None:
        self.signum = 0

    def install(self) -> None:
        """Handle SIGNALS from now on (main thread only). Ctrl-C no longer raises KeyboardInterrupt."""
        for s in SIGNALS:
            signal.signal(s, self._note)

    def _note(self, signum: int, frame) -> None:
        self.signum = self.signum or signum

    def received(self) -> bool:
        """This process was signalled (no collective)."""
        return self.signum != 0

    def agreed(self, device: torch.device | str) -> str | None:
        """Collective, once per step on every rank: the signal's name when any rank got one, else None."""
        flag = torch.tensor([float(self.signum)], device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        signum = int(flag.item())
        return signal.Signals(signum).name if signum else None
