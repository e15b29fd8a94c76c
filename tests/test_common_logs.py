"""app/common/logs.py: the run log's lines reach the stderr the process has when they are written."""

from __future__ import annotations

import io
import sys

from app.common.logs import setup_logging


def test_lines_follow_a_swapped_stderr(monkeypatch):
    """A caller of main() in-process (pytest's capture, a notebook) swaps sys.stderr after logging was set up
    once: the lines go to the new stream, not the one set up first (a warning there was lost)."""
    first, second = io.StringIO(), io.StringIO()
    monkeypatch.setattr(sys, "stderr", first)
    log = setup_logging()
    log.warning("to the first")
    monkeypatch.setattr(sys, "stderr", second)
    setup_logging().warning("to the second")
    assert "to the first" in first.getvalue() and "to the second" not in first.getvalue()
    assert "to the second" in second.getvalue()


def test_long_work_says_how_far_it_is_at_every_heartbeat(monkeypatch):
    """Off a terminal, Progress writes a line at least every heartbeat from its own thread, so one slow unit
    of work is no silence either; closing it stops them."""
    import time

    from app.common.logs import HEARTBEAT_S, Progress, heartbeat, heartbeat_s

    assert HEARTBEAT_S < 30 and heartbeat_s() == HEARTBEAT_S  # no silence over 30 s in a log
    monkeypatch.setenv("MLSTM_HEARTBEAT_S", "0.1")
    assert heartbeat_s() == 0.1
    lines: list[str] = []
    with Progress(10, "scoring", "text", lines.append) as p:
        p.update(3)
        time.sleep(0.45)  # one slow unit of work
        said = len(lines)
    time.sleep(0.3)
    assert 3 <= said <= 5 and len(lines) == said, lines  # a line a heartbeat while open, none after
    assert lines[0] == "scoring: 3/10 texts, 0 s", lines
    beats: list[str] = []
    with heartbeat("checking", beats.append):
        time.sleep(0.25)
    assert beats[0] == "checking ..." and beats[1] == "checking: 0 s so far" and len(beats) >= 3, beats
