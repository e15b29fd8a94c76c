"""A child process that must not outlive its parent: Linux's parent-death signal."""

from __future__ import annotations

import ctypes
import os
import signal

PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>


def die_with_parent(parent: int) -> None:
    """Have the kernel SIGKILL this process when `parent` dies (strictly: when the thread that forked it
    ends, so fork from a thread that lives as long as the process). A parent gone before the call is
    caught by the check after it. Where there is no prctl (not Linux) nothing is set."""
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except AttributeError:
        return
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:
        os.kill(os.getpid(), signal.SIGKILL)
