"""The memory and CPU limits of the control groups a process lives in, cgroup v1 and v2 alike.

A container, a Slurm job or a systemd slice limits a process through its cgroup or through any cgroup above
it: Slurm puts `--mem` on `job_N` while the task runs in `job_N/step_0/user/task_0`, systemd on the slice
above the scope. So every hierarchy the process belongs to (`/proc/self/cgroup`: one line per v1 hierarchy,
`0::path` for v2) is walked from the process's own folder up to the hierarchy's mount, and the tightest
limit wins:

- memory: v2 `memory.max` and `memory.high`, v1 `memory.limit_in_bytes`. What is left under a limit is the
  limit less the usage of that folder's subtree (`memory.current`, v1 `memory.usage_in_bytes`), plus the
  page cache the kernel would drop before it kills anything (`inactive_file` in v2's `memory.stat`,
  `total_inactive_file` in v1's): a container at its limit full of reclaimable file cache has room;
- CPU: v2 `cpu.max` ("quota period"), v1 `cpu.cfs_quota_us` / `cpu.cfs_period_us`: quota / period CPUs.

A hierarchy is mounted under the root as v2 (`cgroup.controllers` in the root, or in `root/unified` on a
hybrid host) or as v1 folders named after their controllers (`memory`, `cpu,cpuacct`). Inside a container
that sees only its own subtree, `/proc/self/cgroup` may still name the host's path (`/docker/<id>`): the
longest tail of it that exists under the mount is the process's folder. The root and the `/proc/self/cgroup`
file are arguments, so tests point the reader at trees they build.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")
PROC_CGROUP = Path("/proc/self/cgroup")
NO_LIMIT = 1 << 62  # v1 writes "no limit" as a page-rounded LLONG_MAX (9223372036854771712)


@dataclass(frozen=True, slots=True)
class Room:
    """What is left under the tightest limit: `bytes` (or `cpus`), and which file in which folder set it."""

    amount: float
    limit_file: str  # e.g. "memory.max"
    folder: str  # the cgroup's path, e.g. "/system.slice/slurmstepd.scope/job_7"

    def why(self, unit: str) -> str:
        return f"the cgroup {self.folder}'s {self.limit_file} leaves {unit}"


def _memberships(proc_cgroup: Path) -> list[tuple[set[str], str]]:
    """(controllers, path) per hierarchy: v1 lines name their controllers, v2's `0::path` an empty set."""
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) == 3:
            out.append(({c for c in parts[1].split(",") if c}, parts[2]))
    return out


def _mount(root: Path, controllers: set[str], controller: str) -> Path | None:
    """Where the hierarchy holding `controller` is mounted under `root`; None when not there."""
    if not controllers:  # v2: the root itself, or root/unified beside v1 hierarchies (hybrid)
        for m in (root, root / "unified"):
            if (m / "cgroup.controllers").is_file():
                return m
        return None
    if controller not in controllers:
        return None
    for m in (root / ",".join(sorted(controllers)), root / ",".join(controllers), root / controller):
        if m.is_dir():
            return m
    return None


def _own_folder(mount: Path, path: str) -> tuple[Path, str]:
    """The process's folder under `mount` (the longest tail of `path` that exists there: a container's
    namespace mounts only its own subtree) and the cgroup path it stands for."""
    parts = [p for p in path.split("/") if p]
    for skip in range(len(parts) + 1):
        folder = mount.joinpath(*parts[skip:])
        if folder.is_dir():
            return folder, "/" + "/".join(parts)
    return mount, "/"


def folders(
    controller: str, root: Path = ROOT, proc_cgroup: Path = PROC_CGROUP
) -> Iterator[tuple[Path, str]]:
    """(folder, cgroup path) of every cgroup above this process that `controller`'s files may limit, in
    each hierarchy holding it: the process's own first, then each parent up to the mount."""
    for controllers, path in _memberships(proc_cgroup):
        mount = _mount(root, controllers, controller)
        if mount is None:
            continue
        folder, name = _own_folder(mount, path)
        while True:
            yield folder, name
            if folder == mount:
                break
            folder, name = folder.parent, name.rsplit("/", 1)[0] or "/"


def _read_int(path: Path) -> int | None:
    """A number in a cgroup file; None for "max", a missing or unreadable file or v1's no-limit value."""
    try:
        text = path.read_text().split()
        value = int(text[0]) if text and text[0] != "max" else None
    except (OSError, ValueError):
        return None
    return None if value is None or value >= NO_LIMIT else value


def _stat(path: Path, key: str) -> int:
    """A field of memory.stat (0 when absent)."""
    try:
        for line in path.read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == key:
                return int(value)
    except (OSError, ValueError):
        pass
    return 0


def _memory_room_at(folder: Path) -> tuple[int, str] | None:
    """(bytes left, the limit's file) under the tighter limit of one folder; None without a limit."""
    v2 = (folder / "memory.current").is_file()
    names = ("memory.max", "memory.high") if v2 else ("memory.limit_in_bytes",)
    limits = [(value, name) for name in names if (value := _read_int(folder / name)) is not None]
    if not limits:
        return None
    limit, name = min(limits)
    usage = _read_int(folder / ("memory.current" if v2 else "memory.usage_in_bytes")) or 0
    cache = _stat(folder / "memory.stat", "inactive_file" if v2 else "total_inactive_file")
    return max(0, min(limit, limit - usage + cache)), name


def _tightest(controller: str, at, root: Path, proc_cgroup: Path) -> Room | None:
    """The smallest (amount, file) `at(folder)` gives over the controller's folders above this process, with
    the folder's name; None when none of them sets one."""
    best: Room | None = None
    for folder, name in folders(controller, root, proc_cgroup):
        got = at(folder)
        if got is not None and (best is None or got[0] < best.amount):
            best = Room(got[0], got[1], name)
    return best


def memory_room(root: Path = ROOT, proc_cgroup: Path = PROC_CGROUP) -> Room | None:
    """Bytes this process may still take before a cgroup above it stops it (the smallest room over every
    limited folder), or None when no cgroup limits its memory."""
    return _tightest("memory", _memory_room_at, root, proc_cgroup)


def _cpu_quota_at(folder: Path) -> tuple[float, str] | None:
    """(CPUs, the file) the folder's quota grants; None without one."""
    try:
        quota, period = (folder / "cpu.max").read_text().split()[:2]
        if quota != "max" and int(period) > 0:
            return int(quota) / int(period), "cpu.max"
    except (OSError, ValueError):
        pass
    quota_us, period_us = _read_int(folder / "cpu.cfs_quota_us"), _read_int(folder / "cpu.cfs_period_us")
    if quota_us is not None and quota_us > 0 and period_us:
        return quota_us / period_us, "cpu.cfs_quota_us"
    return None


def cpu_quota(root: Path = ROOT, proc_cgroup: Path = PROC_CGROUP) -> Room | None:
    """The CPUs (quota / period, a fraction allowed) the tightest CPU quota above this process grants, or
    None when none is set."""
    return _tightest("cpu", _cpu_quota_at, root, proc_cgroup)


def quota_cpus(room: Room) -> int:
    """Whole CPUs worth of workers for a quota: rounded up (1.5 CPUs keep 2 workers busy at 75% each, which
    uses the whole quota), at least 1."""
    return max(1, math.ceil(room.amount - 1e-9))
