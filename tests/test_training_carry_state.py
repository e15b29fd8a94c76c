"""--carry-state in a real run (app/training/carry_state.py): 2 processes, 2 pipeline stages, ZeRO-1, gradient
accumulation 4, on data_prep output with long documents. The run saves at step 3 with each rank's carried
states; resumed from that checkpoint it repeats the uninterrupted run's losses of steps 4-6, which it can
only do if every stream continues from the state it had (a resume from zero states gives other losses).
"""

from __future__ import annotations

import pytest
from launcher import train_losses


def test_carry_state_run_resumes_onto_the_uninterrupted_losses(runs):
    """tests/runs.py's "carry" (6 steps, saved at 3) and "carry_resumed" (a copy resumed from 3)."""
    out = runs.get("carry").dir
    whole = train_losses(out)
    assert sorted(whole) == [1, 2, 3, 4, 5, 6]
    saved = out / "checkpoints" / "step_00000003"
    assert sorted(p.name for p in saved.glob("carry_rank*.pt")) == ["carry_rank0.pt", "carry_rank1.pt"]
    again = runs.get("carry_resumed")
    assert "every stream restarts from zero" not in again.proc.stdout + again.proc.stderr
    resumed = train_losses(again.dir)
    for s in (4, 5, 6):
        assert resumed[s] == pytest.approx(whole[s], rel=1e-6, abs=1e-7), s
