"""What this process may use of the machine, and the one rule every count or size a flag sets follows.

A flag that sets a count or a size (worker processes, rows, tokens, texts) is checked against what the
machine and the input can use: a value larger than useful is capped, and said in one line naming the flag,
the value, the cap and why (`cap`); one that cannot fit (the memory it needs is more than the machine has
free) is refused with a `UserError` that says the same (`check_fits`). Nothing a user types then forks,
allocates or loops without bound. Where several things share the memory, `refuse_over` adds them up and
names the largest.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from app.common.errors import UserError

GIB = 1 << 30


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask: what taskset, Slurm or a container grants it)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not Linux
        return max(1, os.cpu_count() or 1)


def _cgroup_room() -> int | None:
    """Bytes the process's cgroup (v2) may still take: memory.max - memory.current; None without a limit."""
    try:
        rel = Path("/proc/self/cgroup").read_text().strip().splitlines()[0].split(":", 2)[2]
        base = Path("/sys/fs/cgroup") / rel.lstrip("/")
        limit = (base / "memory.max").read_text().strip()
        if limit == "max":
            return None
        return max(0, int(limit) - int((base / "memory.current").read_text()))
    except (OSError, IndexError, ValueError):
        return None


def available_memory(device=None) -> int | None:
    """Bytes that can be allocated without swapping or an OOM kill: the kernel's MemAvailable, lowered to the
    cgroup's room when that is smaller; None where neither can be read (then nothing is refused for it). On a
    CUDA `device` (a torch.device or "cuda:N"): the device's free memory, as the CUDA driver reports it (None
    where it cannot be read). None or "cpu": the host's."""
    if device is not None and str(device).startswith("cuda"):
        import torch

        try:
            return int(torch.cuda.mem_get_info(torch.device(device))[0])
        except (RuntimeError, AssertionError, ValueError):
            return None
    avail = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                avail = int(line.split()[1]) * 1024
                break
    except (OSError, ValueError, IndexError):
        pass
    room = _cgroup_room()
    if avail is None or (room is not None and room < avail):
        return room
    return avail


def cap(flag: str, value: int, limits: list[tuple[int, str]], say: Callable[[str], None] | None) -> int:
    """`value` lowered to the smallest of `limits` ((limit, why) pairs); when it is lowered and `say` is
    given, one line: "--flag 4096 capped at 2: 2 CPUs are available to this process"."""
    limit, why = min(limits, key=lambda x: x[0], default=(value, ""))
    if value <= limit:
        return value
    if say is not None:
        say(f"{flag} {value} capped at {limit}: {why}")
    return limit


def fmt_bytes(n: float) -> str:
    return f"{n / GIB:.1f} GiB" if n >= GIB else f"{n / (1 << 20):.0f} MiB"


Part = tuple[int, str, str]  # (bytes, what needs them, how to need fewer)


def refuse_over(free: int | None, parts: list[Part], where: str = "") -> None:
    """Refuse (UserError, one line) `parts` that need more than `free` bytes together (None: unknown, nothing
    refused), naming the largest part, what the others add, and the largest part's remedy."""
    need = sum(n for n, _, _ in parts)
    if free is None or need <= free:
        return
    n, what, hint = max(parts, key=lambda part: part[0])
    beside = f", beside {fmt_bytes(need - n)} for the rest," if need > n else ""
    raise UserError(
        f"{what} needs about {fmt_bytes(n)} of memory{where}{beside} and {fmt_bytes(free)} is available; {hint}"
    )


def check_fits(what: str, need: int, hint: str, device=None) -> None:
    """Refuse (UserError, one line) `what`, which needs about `need` bytes of `device`'s memory (the host's
    for None or "cpu"), when the device has less free."""
    where = f" on {device}" if device is not None and str(device).startswith("cuda") else ""
    refuse_over(available_memory(device), [(need, what, hint)], where)
