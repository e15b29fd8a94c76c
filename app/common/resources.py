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

from app.common import cgroups
from app.common.errors import UserError

GIB = 1 << 30


def usable_cpus(root: Path = cgroups.ROOT, proc_cgroup: Path = cgroups.PROC_CGROUP) -> int:
    """CPUs this process may keep busy: its affinity mask (what taskset, Slurm or a container grants it),
    lowered to its cgroups' CPU quota (docker --cpus, a systemd CPUQuota=, Kubernetes' limits)."""
    return cpu_limit(root, proc_cgroup)[0]


def cpu_limit(root: Path = cgroups.ROOT, proc_cgroup: Path = cgroups.PROC_CGROUP) -> tuple[int, str]:
    """(usable_cpus, why: "2 CPU(s) are available to this process", naming the cgroup quota when it is
    what decides)."""
    try:
        mask = max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not Linux
        mask = max(1, os.cpu_count() or 1)
    quota = cgroups.cpu_quota(root, proc_cgroup)
    if quota is not None and cgroups.quota_cpus(quota) < mask:
        n = cgroups.quota_cpus(quota)
        return n, f"{n} CPU(s) are available to this process ({quota.why(f'{quota.amount:g} CPU(s)')})"
    return mask, f"{mask} CPU(s) are available to this process"


MEMINFO = Path("/proc/meminfo")


def host_memory(
    root: Path = cgroups.ROOT, proc_cgroup: Path = cgroups.PROC_CGROUP, meminfo: Path = MEMINFO
) -> int | None:
    """Bytes the host's processes can allocate without swapping or an OOM kill: the kernel's MemAvailable,
    lowered to the room its cgroups leave (app.common.cgroups: every limit from the process's cgroup up,
    v1 and v2, reclaimable page cache counted as free); None where neither can be read."""
    avail = None
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                avail = int(line.split()[1]) * 1024
                break
    except (OSError, ValueError, IndexError):
        pass
    room = cgroups.memory_room(root, proc_cgroup)
    if room is not None and (avail is None or room.amount < avail):
        return int(room.amount)
    return avail


def available_memory(device=None) -> int | None:
    """Bytes that can be allocated without swapping or an OOM kill: the host's (`host_memory`) for None or
    "cpu"; on a CUDA `device` (a torch.device or "cuda:N"), the device's free memory as the CUDA driver
    reports it. None where it cannot be read (then nothing is refused for it)."""
    if device is not None and str(device).startswith("cuda"):
        import torch

        try:
            return int(torch.cuda.mem_get_info(torch.device(device))[0])
        except (RuntimeError, AssertionError, ValueError):
            return None
    return host_memory()


HEAP_MMAP_THRESHOLD = 1 << 20


def steady_heap() -> bool:
    """Blocks of 1 MiB and more mapped and unmapped directly, whatever was freed before (glibc's mallopt
    M_MMAP_THRESHOLD, which also stops it raising that threshold to the largest block freed so far). By
    default, once a process has freed a large tensor, glibc serves later ones up to that size from its heap
    and keeps them there when they are freed: work whose tensors change shape (texts of every length,
    evaluation's buckets) then held ~1.6x the memory of its largest batch (bench/memory.py), which no
    estimate made from that batch can bound. Called by the entry points that estimate their memory; a
    MALLOC_MMAP_THRESHOLD_ in the environment is left to win. -> whether it was set (glibc only)."""
    if "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return False
    try:
        import ctypes

        return bool(ctypes.CDLL(None).mallopt(-3, HEAP_MMAP_THRESHOLD))  # M_MMAP_THRESHOLD
    except (OSError, AttributeError):  # not glibc
        return False


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
