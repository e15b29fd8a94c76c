"""A child that calls die_with_parent is gone once its parent is SIGKILLed; one that does not outlives it."""

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
parent = os.getpid()
pid = os.fork()
if pid == 0:
    if sys.argv[1] == "1":
        die_with_parent(parent)
    time.sleep(60)
    os._exit(0)
print(pid, flush=True)
time.sleep(60)
"""


def _alive(pid: int) -> bool:
    """Running or sleeping: not gone, not a zombie waiting for init to reap it."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


@pytest.mark.parametrize("set_it", [True, False])
def test_the_child_dies_with_its_parent_only_when_asked(set_it):
    proc = subprocess.Popen(
        [sys.executable, "-c", FORK_A_CHILD, "1" if set_it else "0"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    child = int(proc.stdout.readline())
    try:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        deadline = time.monotonic() + (10 if set_it else 1)  # the control only needs to outlive a second
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert _alive(child) is not set_it
    finally:
        if _alive(child):
            os.kill(child, signal.SIGKILL)
