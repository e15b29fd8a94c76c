"""app/common/phase_clock.py: the first step's line (launch -> imports -> plan -> DeepSpeed initialised -> data
ready -> first forward -> first step), its marks, its launch time, and the line a real training run logs."""

from __future__ import annotations

import os
import re
import time

import pytest

from app.common import phase_clock
from app.common.phase_clock import ORDER, PhaseClock


def test_each_mark_is_kept_once_and_the_line_gives_each_phase_from_the_one_before(monkeypatch):
    now = iter([100.5, 101.0, 103.0, 104.0, 999.0, 110.0])
    monkeypatch.setattr(time, "time", lambda: next(now))
    clock = PhaseClock(launch=100.0)
    for name in ("imports", "plan", "deepspeed initialised", "data ready", "data ready"):  # the 2nd: ignored
        clock.mark(name)
    said = []
    clock.first_step(said.append)
    clock.first_step(said.append)  # once
    assert said == [
        "first step 10.0 s after launch: imports 0.5 s, plan 0.5 s, deepspeed initialised 2.0 s, "
        "data ready 1.0 s, first step 6.0 s"
    ]
    assert phase_clock.parse(f"2026-11-28 [rank 0] INFO {said[0]}") == {
        "first_step_s": 10.0,
        "phases": {
            "imports": 0.5,
            "plan": 0.5,
            "deepspeed initialised": 2.0,
            "data ready": 1.0,
            "first step": 6.0,
        },
    }
    assert phase_clock.parse("no such line") is None


def test_the_launch_is_a_callers_time_or_this_process_start(monkeypatch):
    monkeypatch.setenv("MLSTM_LAUNCH_T0", "1234.5")
    assert phase_clock.launch_time() == 1234.5
    monkeypatch.delenv("MLSTM_LAUNCH_T0")
    started = phase_clock.launch_time()  # pytest's own start (no launcher above it)
    assert time.time() - 24 * 3600 < started <= time.time()
    assert started == pytest.approx(phase_clock._started(os.getpid()), abs=0.05)


def test_a_training_run_logs_its_first_step_line_with_every_phase_in_order(reference_run):
    """The session's reference run (2 processes under the `deepspeed` runner, rank 0 logs): one line, every
    phase from imports to the first step in the order they happen, summing to the total; the launch is the
    runner's start, before the rank's own imports."""
    _, p = reference_run
    lines = [ln for ln in p.stderr.splitlines() if re.search(r"first step [0-9.]+ s after launch", ln)]
    assert len(lines) == 1, lines
    got = phase_clock.parse(lines[0])
    assert list(got["phases"]) == list(ORDER[1:]), got
    assert sum(got["phases"].values()) == pytest.approx(got["first_step_s"], abs=0.1 * len(ORDER))
    assert all(v >= 0 for v in got["phases"].values()) and got["phases"]["imports"] > 0.5, got
