"""die_with_parent: a child that set it before its parent's SIGKILL, or calls it once the parent is already
gone, is killed; a child that never calls it outlives its parent (the control)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

FORK_A_CHILD = """
import os, sys, time
from app.common.lifetime import die_with_parent
mode, parent = sys.argv[1], os.getpid()
if os.fork() == 0:
    ok = die_with_parent(parent) if mode == "before" else True
    print(os.getpid(), ok, flush=True)  # set up: the test may kill the parent now
    if mode == "after":
        while os.getppid() == parent:
            time.sleep(0.01)
        die_with_parent(parent)
    time.sleep(60)
    os._exit(0)
time.sleep(60)
"""


def _alive(pid: int) -> bool:
    """Running or sleeping: not gone, not a zombie waiting for init to reap it."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


@pytest.mark.parametrize("mode", ["before", "after", "never"])
def test_a_child_dies_with_its_parent_only_when_asked(mode):
    proc = subprocess.Popen(
        [sys.executable, "-c", FORK_A_CHILD, mode], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    pid, ok = proc.stdout.readline().split()
    child = int(pid)
    try:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        deadline = time.monotonic() + (
            1 if mode == "never" else 10
        )  # the control only needs to outlive a second
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert ok == "True", "prctl(PR_SET_PDEATHSIG) was refused"
        assert _alive(child) is (mode == "never")
    finally:
        proc.stdout.close()
        if _alive(child):
            os.kill(child, signal.SIGKILL)
