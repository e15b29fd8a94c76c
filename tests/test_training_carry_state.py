"""--carry-state in a real run (app/training/carry_state.py): 2 processes, 2 pipeline stages, ZeRO-1, gradient
accumulation 4, on data_prep output with long documents. The run saves at step 3 with each rank's carried
states; resumed from that checkpoint it repeats the uninterrupted run's losses of steps 4-6, which it can
only do if every stream continues from the state it had (a resume from zero states gives other losses).
"""

from __future__ import annotations

import pytest
from launcher import train, train_losses


def test_carry_state_run_resumes_onto_the_uninterrupted_losses(prepared_dir, tmp_path):
    out = tmp_path / "carry"
    args = ("--carry-state", "true", "--max-steps", "6", "--save-every", "3", "--keep-last", "2",
            "--eval-every", "0", "--test-eval", "false", "--wandb-mode", "disabled", "--deterministic", "true", "--partition-method", "cost",
            "--sanity-eval-batches", "0", "--samples", "0")  # fmt: skip
    train(2, prepared_dir, out, *args)
    whole = train_losses(out)
    assert sorted(whole) == [1, 2, 3, 4, 5, 6]
    saved = out / "checkpoints" / "step_00000003"
    assert sorted(p.name for p in saved.glob("carry_rank*.pt")) == ["carry_rank0.pt", "carry_rank1.pt"]
    p = train(2, prepared_dir, out, *args, "--resume", "step_00000003")
    assert "every stream restarts from zero" not in p.stdout + p.stderr
    resumed = train_losses(out)
    for s in (4, 5, 6):
        assert resumed[s] == pytest.approx(whole[s], rel=1e-6, abs=1e-7), s
