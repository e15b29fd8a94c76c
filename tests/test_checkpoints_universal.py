"""Resume under another layout (app/checkpoints/universal.py): the optimizer state comes along.

The reference run (P = 2 stages, ZeRO-1, tests/conftest.py) resumed from its step-6 checkpoint as one
plain process (P = 1): step 7's loss shows the weights came back, step 8's loss and step 7's gradient norm
(after an Adam update that uses the moments and the lr schedule of the P = 2 run) that the optimizer state
did; both equal the uninterrupted P = 2 run's within fp32 rounding (the stages sum in another order).
"""

from __future__ import annotations

import pytest
from launcher import metrics


@pytest.mark.slow
def test_a_pp2_run_resumes_as_p1_with_its_optimizer_state(reference_run, runs):
    """tests/runs.py's "ref_as_p1": a copy of "ref" resumed from step 6 as one plain process."""
    run = runs.get("ref_as_p1")
    out, p = run.dir, run.proc
    assert "step_00000006 at step 6" in p.stderr and "re-sliced for this one" in p.stderr, p.stderr[-3000:]
    ref = {m["step"]: m for m in metrics(reference_run[0]) if "train/loss" in m}
    got = {m["step"]: m for m in metrics(out) if "train/loss" in m}
    for step in (7, 8):
        for key in ("train/loss", "train/grad_norm", "train/lr"):
            assert got[step][key] == pytest.approx(ref[step][key], rel=1e-6, abs=1e-7), (step, key)
    assert not (out / "checkpoints" / "universal").exists(), "the converted copy outlived the resume"


# `long`: a second launch of the case the test above runs as one process (a P = 2 checkpoint re-sliced for
# another layout, the optimizer state with it); what only it runs is the universal checkpoint into ZeRO-2 on
# two data-parallel ranks with half the accumulation
@pytest.mark.long
@pytest.mark.slow
def test_a_pp2_run_resumes_on_two_ranks_with_half_the_accumulation(reference_run, runs):
    """The cluster case: a P = 2 x DP = 1 run (accumulation 4) resumed as P = 1 x DP = 2 with accumulation 2, the
    same 4 micro-batches a step, needs no --allow-data-change and repeats the uninterrupted run's steps
    (tests/runs.py's "ref_as_dp2")."""
    run = runs.get("ref_as_dp2")
    out, p = run.dir, run.proc
    assert "step_00000006 at step 6" in p.stderr and "re-sliced for this one" in p.stderr, p.stderr[-3000:]
    ref = {m["step"]: m for m in metrics(reference_run[0]) if "train/loss" in m}
    got = {m["step"]: m for m in metrics(out) if "train/loss" in m}
    for step in (7, 8):
        for key in ("train/loss", "train/grad_norm"):
            assert got[step][key] == pytest.approx(ref[step][key], rel=2e-5, abs=2e-5), (step, key)
