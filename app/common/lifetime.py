"""A child process that must not outlive its parent: Linux's parent-death signal."""

from __future__ import annotations

import ctypes
import os
import signal

PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>
try:  # looked up once, at import: after a fork of a threaded process a dlsym is best avoided
    _PRCTL = ctypes.CDLL(None, use_errno=True).prctl
except AttributeError:  # not Linux
    _PRCTL = None


def die_with_parent(parent: int) -> bool:
    """Have the kernel SIGKILL this process when `parent` dies (strictly: when the thread that forked it
    ends, so fork from a thread that lives as long as the process). A parent gone before the call is
    caught by the check after it. False where it cannot be set (no prctl, or prctl refused)."""
    if _PRCTL is None or _PRCTL(PR_SET_PDEATHSIG, signal.SIGKILL) != 0:
        return False
    if os.getppid() != parent:
        os.kill(os.getpid(), signal.SIGKILL)
    return True
