"""The --time-budget stop rule and its estimates, on a simulated clock (no sleeping, no processes).

The real budgeted run (the clock, the broadcast, the final save and evaluation) is checked in
test_train.py's P=2 crash/resume test.
"""

import random

import pytest

from app.training.schedule import budget_lr_multiplier
from app.training.time_budget import (
    EVAL_VS_STEP,
    MARGIN_S,
    MAX_RESERVE,
    SAFETY,
    TimeBudget,
    should_stop,
    train_fraction,
)


def test_stop_rule_and_fraction_at_their_edges():
    assert not should_stop(elapsed_s=80.0, budget_s=100.0, next_cost_s=5.0, reserve_s=15.0)  # exactly fits
    assert should_stop(elapsed_s=80.001, budget_s=100.0, next_cost_s=5.0, reserve_s=15.0)
    assert train_fraction(0.0, 100.0, 20.0) == 0.0
    assert train_fraction(40.0, 100.0, 20.0) == pytest.approx(0.5)  # the decay spans budget - reserve
    assert train_fraction(95.0, 100.0, 20.0) == 1.0
    assert train_fraction(5.0, 100.0, 150.0) == 1.0  # a reserve beyond the budget: nothing left to decay over


def _budget(warmup=4, eval_every=0, save_every=0, **kw) -> TimeBudget:
    """A budget with its counts given in steps (the defaults that follow the budget: test_training_run_schedule)."""
    args = dict(
        decay_from=None,
        final_eval_tokens=10_000,
        periodic_eval_tokens=3_000,
        params=2_000_000,
        given={"warmup_steps": warmup, "eval_every": eval_every, "save_every": save_every},
        schedule=None,
        decay="cosine",
        min_ratio=0.1,
    )
    return TimeBudget(120.0, **(args | kw))


def test_reserve_before_and_after_measurements():
    b = _budget()
    guess_save = 1.0 + 16 * 2_000_000 / 100e6
    assert b.reserve() == pytest.approx(SAFETY * guess_save + MARGIN_S)  # nothing measured: the save guess
    b.note_step(2.0, tokens=4000)  # no evaluation yet: the training rate stands in (an overestimate)
    from_training = SAFETY * (10_000 * EVAL_VS_STEP * 2.0 / 4000 + guess_save) + MARGIN_S
    assert b.reserve() == pytest.approx(from_training)
    b.note_eval(30.0, tokens=2000, periodic=False)  # the first evaluation (one-off work) is not used
    assert b.reserve() == pytest.approx(from_training)
    b.note_eval(0.5, tokens=2000, periodic=False)
    b.note_save(1.5)
    assert b.reserve() == pytest.approx(SAFETY * (10_000 * 0.5 / 2000 + 1.5) + MARGIN_S)
    b.note_eval(20.0, tokens=2000, periodic=False)  # a final phase longer than the budget allows
    assert b.estimated_reserve() > b.reserve() == pytest.approx(MAX_RESERVE * 120.0)


def test_next_cost_includes_the_periodic_evaluation_and_save_the_step_triggers():
    b = _budget(eval_every=10, save_every=25)
    for s in (1.0, 3.0, 2.0):
        b.note_step(s, tokens=1000)
    b.note_eval(9.0, tokens=1000, periodic=False)  # the sanity evaluation: warm-up, ignored
    b.note_eval(0.4, tokens=1000, periodic=False)
    b.note_save(4.0)
    assert b.next_cost(7) == pytest.approx(2.0)  # median of the recent steps
    assert b.next_cost(10) == pytest.approx(2.0 + 3_000 * 0.4 / 1000)  # no periodic eval timed: its tokens
    b.note_eval(1.2, tokens=3000, periodic=True)
    assert b.next_cost(20) == pytest.approx(2.0 + 1.2)
    assert b.next_cost(50) == pytest.approx(2.0 + 1.2 + 4.0)


@pytest.mark.parametrize("resumed_at", [0.0, 50.0])
def test_simulated_run_stops_at_the_last_step_that_leaves_the_reserve(resumed_at):
    """A run on a simulated clock with noisy step times: the stop comes at the first step that would
    eat into the reserve, the lr follows the budget schedule, and the final phase fits."""
    seed = random.randrange(2**32)
    rng = random.Random(seed)
    b = _budget(eval_every=25, save_every=40)
    clock, step, lrs, at_warmup_end = resumed_at, 0, [], None
    b.note_eval(5.0, tokens=3000, periodic=False)  # the sanity evaluation (ignored: warm-up)
    while True:
        mult, stop = b.decide(step, clock)
        reserve = b.reserve()
        if step == 4:
            at_warmup_end = b.fraction
        if stop:
            assert clock + b.next_cost(step + 1) + reserve > b.budget_s, seed
            break
        assert clock + b.next_cost(step + 1) + reserve <= b.budget_s, seed
        want = budget_lr_multiplier(
            step, b.fraction, b.decay_from or 0.0, warmup=4, decay="cosine", min_ratio=0.1
        )
        assert mult == pytest.approx(want), seed
        lrs.append(mult)
        dt = rng.uniform(0.5, 1.5)
        clock += dt
        b.note_step(dt, tokens=4000)
        step += 1
        if step % 25 == 0:
            clock += 1.0
            b.note_eval(1.0, tokens=2000, periodic=True)
        if step % 40 == 0:
            clock += 2.0
            b.note_save(2.0)
    final_phase = 10_000 * 1.0 / 2000 + 2.0  # what the final evaluation and save would take at these rates
    assert clock + final_phase <= b.budget_s, seed
    assert b.budget_s - (clock + final_phase) < 1.5 + 1.0 + 2.0 + b.reserve(), seed  # and little is left over
    assert lrs[:4] == pytest.approx([0.25, 0.5, 0.75, 1.0]), seed  # warmup by steps
    assert b.decay_from == at_warmup_end and (at_warmup_end > 0.4) == (resumed_at > 0), seed
    assert lrs[-1] == pytest.approx(0.1), seed  # the last step that fits is at the decay's floor


def test_a_resumed_budget_keeps_the_recorded_warmup_end():
    b = _budget(decay_from=0.3)
    mult, stop = b.decide(step=10, elapsed=0.3 * (120.0 - b.reserve()))
    assert not stop and mult == pytest.approx(1.0) and b.decay_from == 0.3
    mult, _ = b.decide(step=11, elapsed=119.0)
    assert mult == pytest.approx(0.1)
