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
