"""Where a run's time to its first step goes: wall-clock marks from the launch to the first optimizer step.

    launch                 the oldest of this process and its DeepSpeed launcher ancestors (the `deepspeed`
                           runner, its per-node launch.py) to start, read from /proc; or MLSTM_LAUNCH_T0
                           (seconds since the epoch) where a caller (bench/train_gpu.py) set it
    imports                app/train.py's main() begins: torch, DeepSpeed and the app imported
    plan                   the data opened, the process group up, the run planned (the engine's build begins)
    deepspeed initialised  the model built and deepspeed.initialize returned
    data ready             the first step's batches in hand (resume, the matmul peak, trackers, the sanity
                           evaluation before it)
    first forward          the first forward returned (a GPU waited for: the Triton core's tuning and compiles
                           happen here)
    first step             the first step's loss read (its backward, the optimizer, the reduction)

One clock per process (`CLOCK`); `mark` records a name once (later marks of it are ignored), and
`first_step(say)` marks the step and says the whole line once, e.g.

    first step 28.8 s after launch: imports 6.1 s, plan 1.2 s, deepspeed initialised 9.0 s, data ready
    2.4 s, first forward 7.9 s, first step 2.2 s

Each figure is the time from the mark before it. bench/train_gpu.py reads this line (`parse`).
"""

from __future__ import annotations

import itertools
import os
import re
import time
from collections.abc import Callable
from pathlib import Path

ORDER = ("launch", "imports", "plan", "deepspeed initialised", "data ready", "first forward", "first step")
_LINE = re.compile(r"first step ([0-9.]+) s after launch: (.*)$")


def _started(pid: int | str) -> float | None:
    """When process `pid` started, in seconds since the epoch (Linux /proc), or None."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        ticks = int(stat.rsplit(")", 1)[1].split()[19])  # field 22, starttime, after the command's name
        btime = next(
            int(ln.split()[1]) for ln in Path("/proc/stat").read_text().splitlines() if ln.startswith("btime")
        )
    except (OSError, ValueError, IndexError, StopIteration):
        return None
    return btime + ticks / os.sysconf("SC_CLK_TCK")


def _parent(pid: int | str) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def launch_time() -> float:
    """MLSTM_LAUNCH_T0, else the start of the oldest of this process and its launcher ancestors (a parent
    whose command line runs DeepSpeed's launcher), else now."""
    given = os.environ.get("MLSTM_LAUNCH_T0")
    if given:
        try:
            return float(given)
        except ValueError:
            pass
    oldest, pid = _started("self"), _parent("self")
    while pid and pid > 1:
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            break
        if b"deepspeed" not in cmd:
            break
        oldest, pid = _started(pid) or oldest, _parent(pid)
    return oldest if oldest is not None else time.time()


class PhaseClock:
    def __init__(self, launch: float | None = None) -> None:
        self.marks: dict[str, float] = {"launch": launch_time() if launch is None else launch}
        self.said = False

    def mark(self, name: str) -> None:
        """Record `name` now, once (a later mark of the same name, a later step's, is ignored)."""
        self.marks.setdefault(name, time.time())

    def line(self) -> str:
        """`first step 28.8 s after launch: imports 6.1 s, ...`: each mark's time from the one before."""
        names = sorted(self.marks, key=lambda n: self.marks[n])
        parts = [f"{b} {self.marks[b] - self.marks[a]:.1f} s" for a, b in itertools.pairwise(names)]
        last = self.marks.get("first step", self.marks[names[-1]])
        return f"first step {last - self.marks['launch']:.1f} s after launch: {', '.join(parts)}"

    def first_step(self, say: Callable[[str], None]) -> None:
        """Mark the first step and say the line, once (call it after every step: one line in the loop)."""
        if self.said:
            return
        self.mark("first step")
        self.said = True
        say(self.line())


def parse(log: str) -> dict | None:
    """The phases of a run log's first-step line -> {"first_step_s": total, "phases": {name: seconds}}."""
    for ln in log.splitlines():
        m = _LINE.search(ln)
        if m:
            phases = {}
            for part in m.group(2).split(", "):
                name, _, secs = part.rpartition(" ")[0].rpartition(" ")
                phases[name] = float(secs)
            return {"first_step_s": float(m.group(1)), "phases": phases}
    return None


CLOCK = PhaseClock()


def mark(name: str) -> None:
    CLOCK.mark(name)


def first(name: str) -> bool:
    """Mark `name` now; whether this was its first mark."""
    new = name not in CLOCK.marks
    CLOCK.mark(name)
    return new
