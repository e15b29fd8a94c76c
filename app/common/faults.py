"""Fault injection for tests of the failure paths (set by tests, never by users).

MLSTM_DS_FAULTS is a comma-separated list of:
    nan_step=N         the loss of optimizer step N (1-based) is made non-finite on every rank
    crash_in_save=N    the process dies (exit 17) after writing checkpoint N's files but before committing it
    hang_after=N       every rank stops after finishing step N (logged, saved if due) and waits to be killed,
                       so a test's SIGKILL lands mid-training however fast the steps are
    hang_rank=R        hang_after applies to rank R only (repeatable): the other ranks go on into the
                       next collective and wait there, as behind a stalled or dead peer
    await_signal_after=N  after step N every rank (or the hang_rank ones) waits for a preemption signal
    enospc_after_bytes=N  data prep's shard writes fail with ENOSPC (disk full) once the process has
                       appended N bytes to shards (for tests where no small file system can be mounted)
    kill_worker_at_block=N  the data prep worker that encodes block N (0-based) kills itself with SIGKILL,
                       as a worker the kernel's OOM killer picks
    enospc_in_save=N   writing checkpoint N fails with ENOSPC (disk full) on every rank (or the hang_rank ones),
                       where a test cannot mount a small filesystem to fill
    user_error_after=N after step N every rank (or the hang_rank ones) raises a UserError, as a rank that
                       meets bad input alone would
    hang_after_part=N  app/classify.py: a rank (or the hang_rank ones) stops after writing its Nth part file
                       and waits to be killed, so a test's SIGKILL lands mid-run however fast the parts are
    peak_divide=N      the matmul peak each rank times at start is divided by N, as a peak timed while other
                       work held the core reads low (the MFU guard's test)
    barrier_timeout=N  the N-th launch (1-based, repeatable) of a persistent GPU loop in this process finds its
                       grid barrier's failure flag set, as when its programs were not all resident: the kernel's
                       own poison path runs (NaN outputs, the loop's health flag set: app/model/gpu_health.py)
    gpu_launch_error=N the N-th run (1-based, repeatable) of a GPU loop in this process raises at launch, as a
                       kernel the device refuses (too many resources, a cooperative grid too large)
"""

from __future__ import annotations

import errno
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

from app.common.errors import UserError


def _parse() -> dict[str, set[int]]:
    out: dict[str, set[int]] = {}
    for item in filter(None, os.environ.get("MLSTM_DS_FAULTS", "").split(",")):
        key, _, val = item.partition("=")
        out.setdefault(key.strip(), set()).add(int(val))
    return out


_FAULTS = _parse()


def nan_at(step: int) -> bool:
    return step in _FAULTS.get("nan_step", set())


def crash_in_save(step: int) -> None:
    if step in _FAULTS.get("crash_in_save", set()):
        os._exit(17)


def _here(fault: str, step: int) -> bool:
    """`fault` is set for `step` and this rank is one it applies to (hang_rank, when given, filters)."""
    ranks = _FAULTS.get("hang_rank")
    return step in _FAULTS.get(fault, set()) and (not ranks or int(os.environ.get("RANK", "0")) in ranks)


def enospc_in_save(step: int, path: Path) -> None:
    if _here("enospc_in_save", step):
        raise OSError(errno.ENOSPC, f"{os.strerror(errno.ENOSPC)} (injected)", str(path))


def hang_after(step: int) -> None:
    if _here("hang_after", step):
        while True:
            time.sleep(60)


def hang_after_part(parts: int) -> None:
    if _here("hang_after_part", parts):
        while True:
            time.sleep(60)


def user_error_after(step: int) -> None:
    if _here("user_error_after", step):
        raise UserError(f"injected user error after step {step} (MLSTM_DS_FAULTS)")


def await_signal_after(step: int, received: Callable[[], bool]) -> None:
    """await_signal_after=N: after step N the rank (hang_rank filters, as for hang_after) waits until
    `received()` (a preemption signal came), so a test's signal lands at a known step however fast steps are."""
    if _here("await_signal_after", step):
        while not received():
            time.sleep(0.05)


_written = 0


def shard_write(nbytes: int) -> None:
    """enospc_after_bytes=N: the write that would take this process past N bytes fails as on a full disk."""
    global _written
    limit = _FAULTS.get("enospc_after_bytes")
    if limit:
        _written += nbytes
        if _written > min(limit):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def kill_worker(block: int) -> None:
    if block in _FAULTS.get("kill_worker_at_block", set()):
        os.kill(os.getpid(), signal.SIGKILL)


_seen: dict[str, int] = {}


def _nth(fault: str) -> bool:
    """Counts this call towards `fault`; whether it is one of the calls the fault names."""
    if fault not in _FAULTS:
        return False
    _seen[fault] = _seen.get(fault, 0) + 1
    return _seen[fault] in _FAULTS[fault]


def barrier_times_out() -> bool:
    return _nth("barrier_timeout")


def gpu_launch_fails() -> bool:
    return _nth("gpu_launch_error")


def peak_divisor() -> int:
    """peak_divide=N: N (1 when unset)."""
    return max(_FAULTS.get("peak_divide", {1}))
