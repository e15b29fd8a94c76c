"""app/common/cgroups.py: every memory and CPU limit a process lives under, read from cgroup trees these tests
build as the kernel lays them out (a Slurm job, docker on cgroup v1 and v2, a systemd slice, a container at
its limit full of page cache), and from this machine's own."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from app.common import cgroups, resources

MIB, GIB = 1 << 20, 1 << 30
V1_NO_LIMIT = "9223372036854771712"


def write(folder: Path, **files: object) -> None:
    """Files of one cgroup folder: memory_max="1073741824" writes memory.max (underscores become dots)."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (folder / name.replace("_", ".", 1)).write_text(f"{text}\n")


def v2_tree(tmp_path: Path, path: str) -> tuple[Path, Path]:
    """A cgroup v2 mount (root/cgroup.controllers) and a /proc/self/cgroup naming `path`."""
    root = tmp_path / "cgroup"
    write(root, cgroup_controllers="cpuset cpu io memory pids")
    proc = tmp_path / "proc_self_cgroup"
    proc.write_text(f"0::{path}\n")
    return root, proc


def meminfo(tmp_path: Path, available: int) -> Path:
    p = tmp_path / "meminfo"
    p.write_text(f"MemTotal:       {2 * available // 1024} kB\nMemAvailable:   {available // 1024} kB\n")
    return p


def test_a_slurm_job_limit_two_levels_above_the_task_is_read(tmp_path):
    """Slurm (cgroup v2) puts --mem on job_N while the task runs in job_N/step_0/user/task_0; base 2652e8d
    read the task's own folder only, so a 1 GiB job on a 64 GiB node looked like 64 GiB."""
    job = "/system.slice/slurmstepd.scope/job_7"
    root, proc = v2_tree(tmp_path, f"{job}/step_0/user/task_0")
    write(root / job.lstrip("/"), memory_max=GIB, memory_current=100 * MIB, memory_stat="inactive_file 0")
    for sub in ("step_0", "step_0/user", "step_0/user/task_0"):
        write(root / job.lstrip("/") / sub, memory_max="max", memory_high="max", memory_current=90 * MIB)
    room = cgroups.memory_room(root, proc)
    assert room == cgroups.Room(GIB - 100 * MIB, "memory.max", job)
    free = resources.host_memory(root, proc, meminfo(tmp_path, 64 * GIB))
    assert free == GIB - 100 * MIB
    # the ~2.4 GiB run of the issue (model.hidden_dim=3000) is then refused, not planned and OOM-killed
    with pytest.raises(resources.UserError, match=r"needs about 2\.4 GiB of memory and 924 MiB is available"):
        resources.refuse_over(free, [(int(2.4 * GIB), "training", "use a smaller model")])


def test_a_slurm_job_limit_on_cgroup_v1_is_read(tmp_path):
    root, proc = tmp_path / "cgroup", tmp_path / "proc_self_cgroup"
    job = "slurm/uid_1000/job_5"
    proc.write_text(f"4:memory:/{job}/step_0/task_0\n3:cpu,cpuacct:/{job}/step_0/task_0\n")
    write(root / "memory", memory_limit_in_bytes=V1_NO_LIMIT, memory_usage_in_bytes=3 * GIB)
    write(root / "memory" / job, memory_limit_in_bytes=2 * GIB, memory_usage_in_bytes=GIB,
          memory_stat="inactive_file 1\ntotal_inactive_file 256000000")  # fmt: skip
    for sub in ("step_0", "step_0/task_0"):
        write(root / "memory" / job / sub, memory_limit_in_bytes=V1_NO_LIMIT, memory_usage_in_bytes=GIB)
    assert cgroups.memory_room(root, proc) == cgroups.Room(
        GIB + 256000000, "memory.limit_in_bytes", f"/{job}"
    )


def test_docker_memory_and_cpus_on_cgroup_v1(tmp_path):
    """docker --memory 512m --cpus 1.5 on a v1 host: /proc/self/cgroup names the host's path (/docker/<id>)
    while the container's mounts hold only its own folder."""
    root, proc = tmp_path / "cgroup", tmp_path / "proc_self_cgroup"
    cid = "4f1c9e0a7b"
    proc.write_text(f"12:memory:/docker/{cid}\n11:cpu,cpuacct:/docker/{cid}\n1:name=systemd:/docker/{cid}\n")
    write(root / "memory", memory_limit_in_bytes=512 * MIB, memory_usage_in_bytes=500 * MIB,
          memory_stat=f"cache 300\ntotal_inactive_file {200 * MIB}")  # fmt: skip
    write(root / "cpu,cpuacct", cpu_cfs_quota_us=150000, cpu_cfs_period_us=100000)
    assert cgroups.memory_room(root, proc) == cgroups.Room(
        212 * MIB, "memory.limit_in_bytes", f"/docker/{cid}"
    )
    quota = cgroups.cpu_quota(root, proc)
    assert quota == cgroups.Room(1.5, "cpu.cfs_quota_us", f"/docker/{cid}") and cgroups.quota_cpus(quota) == 2


def test_docker_memory_and_cpus_on_cgroup_v2(tmp_path):
    """docker --memory 2g --cpus 1 on a v2 host (a private cgroup namespace: the container is "/")."""
    root, proc = v2_tree(tmp_path, "/")
    write(root, memory_max=2 * GIB, memory_high="max", memory_current=GIB + 512 * MIB,
          memory_stat=f"anon {GIB}\ninactive_file {128 * MIB}\nactive_file {256 * MIB}", cpu_max="100000 100000")  # fmt: skip
    assert cgroups.memory_room(root, proc) == cgroups.Room(640 * MIB, "memory.max", "/")
    n, why = resources.cpu_limit(root, proc)
    assert n == resources.usable_cpus(root, proc) == 1
    if len(os.sched_getaffinity(0)) > 1:  # the quota decides, and the line says so
        assert why == "1 CPU(s) are available to this process (the cgroup /'s cpu.max leaves 1 CPU(s))"


def test_a_systemd_slice_limits_the_session_below_it(tmp_path):
    """systemd: MemoryMax= on the user's slice, MemoryHigh= on user.slice above it; the scope has neither.
    The tightest room wins, whichever level it is on."""
    root, proc = v2_tree(tmp_path, "/user.slice/user-1000.slice/session-3.scope")
    write(root / "user.slice", memory_max="max", memory_high=6 * GIB, memory_current=5 * GIB)
    write(root / "user.slice/user-1000.slice", memory_max=4 * GIB, memory_high="max", memory_current=2 * GIB)
    write(root / "user.slice/user-1000.slice/session-3.scope", memory_max="max", memory_current=GIB)
    assert cgroups.memory_room(root, proc) == cgroups.Room(GIB, "memory.high", "/user.slice")
    write(root / "user.slice", memory_current=GIB)
    assert cgroups.memory_room(root, proc) == cgroups.Room(
        2 * GIB, "memory.max", "/user.slice/user-1000.slice"
    )
    write(root / "user.slice/user-1000.slice", cpu_max="250000 100000")
    write(root / "user.slice", cpu_max="max 100000")
    assert cgroups.cpu_quota(root, proc) == cgroups.Room(2.5, "cpu.max", "/user.slice/user-1000.slice")


def test_a_container_at_its_limit_full_of_page_cache_has_room(tmp_path):
    """memory.max - memory.current leaves 1 MiB, but 7 GiB of it is inactive file cache the kernel reclaims
    before it kills anything: base 2652e8d said "1 MiB is available" and refused an 11 MiB debug run."""
    root, proc = v2_tree(tmp_path, "/")
    write(root, memory_max=8 * GIB, memory_current=8 * GIB - MIB,
          memory_stat=f"anon {GIB - MIB}\nfile {7 * GIB}\ninactive_file {7 * GIB}")  # fmt: skip
    free = resources.host_memory(root, proc, meminfo(tmp_path, 60 * GIB))
    assert free == 7 * GIB + MIB
    resources.refuse_over(free, [(11 * MIB, "a debug run", "")])  # not refused


def test_no_limit_anywhere_leaves_the_kernels_figure(tmp_path):
    """A hybrid host (v1 memory hierarchy without a limit, v2 unified holding no memory controller), as this
    machine's may be: MemAvailable is the figure."""
    root, proc = tmp_path / "cgroup", tmp_path / "proc_self_cgroup"
    proc.write_text("4:memory:/process_api/abc\n1:cpu:/\n0::/\n")
    write(root / "memory", memory_limit_in_bytes=V1_NO_LIMIT, memory_usage_in_bytes=GIB)
    write(root / "memory/process_api", memory_limit_in_bytes=V1_NO_LIMIT, memory_usage_in_bytes=GIB)
    write(root / "memory/process_api/abc", memory_limit_in_bytes=V1_NO_LIMIT, memory_usage_in_bytes=GIB)
    write(root / "cpu", cpu_cfs_quota_us=-1, cpu_cfs_period_us=100000)
    write(root / "unified", cgroup_controllers="hugetlb")
    assert cgroups.memory_room(root, proc) is None and cgroups.cpu_quota(root, proc) is None
    assert resources.host_memory(root, proc, meminfo(tmp_path, 5 * GIB)) == 5 * GIB
    assert resources.usable_cpus(root, proc) == len(os.sched_getaffinity(0))
    assert resources.host_memory(root, tmp_path / "absent", tmp_path / "absent") is None  # nothing to read


def test_this_machines_own_cgroups_are_read():
    """The real /sys/fs/cgroup and /proc/self/cgroup: the walk visits existing folders, the first the
    process's own (its cgroup path, or the tail of it its mount holds); the room is never negative."""
    if not cgroups.ROOT.is_dir() or not cgroups.PROC_CGROUP.is_file():
        pytest.skip("no cgroup file system here")
    seen = list(cgroups.folders("memory"))
    assert seen and all(folder.is_dir() for folder, _ in seen)
    first, path = seen[0]
    tail = [p for p in path.split("/") if p][-len(first.parts) :]
    assert not tail or first.name in tail  # "/" or a folder its path names
    room = cgroups.memory_room()
    assert room is None or room.amount >= 0
    free = resources.available_memory()
    assert free is None or free > 0
