"""app.training.run_schedule: the warmup, validation and save steps a run follows; under --time-budget shares
of the steps the budget is expected to hold, decided once the first steps are timed (with TimeBudget's
estimates), and a real one-minute CPU run that validates often and warms up briefly."""

from __future__ import annotations

import json
import re

import pytest
from launcher import CPU_CONFIG, metrics, train_process

from app.training import run_schedule
from app.training.run_schedule import MEASURE_STEPS, STEP_DEFAULTS, WARMUP_CAP, Schedule
from app.training.time_budget import TimeBudget


def test_budget_defaults_are_shares_of_the_expected_steps_and_given_counts_win():
    s = run_schedule.for_budget({}, 134.4, decided_at=MEASURE_STEPS)
    assert (s.warmup_steps, s.eval_every, s.save_every, s.expected_steps) == (7, 13, 13, 134)
    assert run_schedule.for_budget({}, 50_000, MEASURE_STEPS).warmup_steps == WARMUP_CAP
    assert run_schedule.for_budget({}, 3, MEASURE_STEPS).warmup_steps == 1
    given = run_schedule.for_budget({"warmup_steps": 10, "eval_every": 0}, 134, MEASURE_STEPS)
    assert (given.warmup_steps, given.eval_every, given.save_every, given.decided_at) == (10, 0, 0, 0)
    assert run_schedule.for_budget({"save_every": 50}, 134, 3).save_every == 50
    assert run_schedule.for_steps({}).as_dict() == STEP_DEFAULTS | {"expected_steps": None, "decided_at": 0}
    assert run_schedule.for_steps({"eval_every": 7}).eval_every == 7


def test_the_warmup_ramps_on_while_the_schedule_is_decided():
    """Undecided: the ramp of a WARMUP_CAP-step warmup; decided before step 3 as 7 steps: a straight line from
    where the ramp stood to 1 at step 6, over from step 7; a warmup shorter than the steps run ends at once."""
    undecided = [run_schedule.warmup_multiplier(s, None) for s in range(MEASURE_STEPS)]
    assert undecided == pytest.approx([(s + 1) / WARMUP_CAP for s in range(MEASURE_STEPS)])
    decided = Schedule(warmup_steps=7, eval_every=13, save_every=13, decided_at=3)
    ramp = [run_schedule.warmup_multiplier(s, decided) for s in range(3, 8)]
    assert ramp[:4] == pytest.approx([0.03 + 0.97 * k / 4 for k in range(1, 5)]) and ramp[4] is None
    assert run_schedule.warmup_multiplier(3, Schedule(2, 13, 13, decided_at=3)) is None
    given = Schedule(4, 0, 0)  # given in steps: the plain ramp from step 0
    assert [run_schedule.warmup_multiplier(s, given) for s in range(5)] == [0.25, 0.5, 0.75, 1.0, None]


def simulate(budget: TimeBudget, step_s: float, eval_s: float, save_s: float, start: float = 0.0):
    """A budgeted run on a simulated clock, as Trainer drives it: (lr multipliers, validation steps, the
    schedule line)."""
    clock, step, lrs, validations, lines = start, 0, [], [], []
    budget.note_eval(2.0, tokens=3000, periodic=False)  # the sanity evaluation (one-off: set aside)
    while True:
        mult, stop = budget.decide(step, clock)
        lines.append(budget.schedule_line(3e-3))
        if stop:
            return lrs, validations, [x for x in lines if x]
        lrs.append(mult)
        clock += step_s * (3.0 if step == 0 else 1.0)  # the first step pays one-off costs
        budget.note_step(step_s, tokens=4000)
        step += 1
        eval_every, save_every = budget.points()
        if eval_every and step % eval_every == 0:
            clock += eval_s
            budget.note_eval(eval_s, tokens=3000, periodic=True)
            validations.append(step)
        if save_every and step % save_every == 0:
            clock += save_s
            budget.note_save(save_s)


def one_minute(**kw) -> TimeBudget:
    args = dict(decay_from=None, final_eval_tokens=6000, periodic_eval_tokens=3000, params=500_000, given={},
                schedule=None, decay="cosine", min_ratio=0.1)  # fmt: skip
    return TimeBudget(60.0, **(args | kw))


def test_a_simulated_minute_decides_its_schedule_after_the_first_steps():
    budget = one_minute()
    lrs, validations, lines = simulate(budget, step_s=0.25, eval_s=0.4, save_s=0.3)
    s = budget.schedule
    assert s is not None and s.decided_at == MEASURE_STEPS and len(lines) == 1
    steps = len(lrs)
    assert len(validations) + 1 >= 5 and s.warmup_steps <= 0.1 * steps, (steps, s, validations)
    assert validations == list(range(s.eval_every, steps + 1, s.eval_every))
    assert 0.8 * steps <= s.expected_steps <= 1.2 * steps, (steps, s)  # the estimate was about right
    assert lrs[s.warmup_steps - 1] == pytest.approx(1.0) and max(lrs) == pytest.approx(1.0)
    assert lrs[-1] == pytest.approx(0.1)  # the decay's floor on the last step
    assert re.fullmatch(r"schedule: time budget 1 min, ~\d+ steps of 0\.25 s: warmup \d+ steps \(\d+ s\), then "
                        r"cosine decay to 0\.1 x lr 0\.003 by the last step; validation and a save every \d+ steps "
                        r"\(\d+ s\)", lines[0]), lines[0]  # fmt: skip


def test_a_resumed_budget_keeps_its_schedule_and_given_counts_are_kept():
    recorded = Schedule(warmup_steps=5, eval_every=11, save_every=11, expected_steps=120, decided_at=3)
    budget = one_minute(schedule=Schedule.recorded(recorded.as_dict()), decay_from=0.1)
    assert budget.points() == (11, 11)  # before any step of this process: every rank validates at 11, 22...
    lrs, validations, _ = simulate(budget, step_s=0.25, eval_s=0.4, save_s=0.3, start=20.0)
    assert budget.schedule == recorded and validations[:2] == [11, 22]
    given = one_minute(given={"warmup_steps": 2, "eval_every": 0})  # honoured from the first step
    assert given.points() == (0, 0)
    lrs, validations, _ = simulate(given, step_s=0.25, eval_s=0.4, save_s=0.3)
    assert lrs[:2] == [0.5, 1.0] and validations == [] and given.schedule.eval_every == 0


@pytest.mark.cluster  # a minute of the wall clock (the simulated minutes above run in no time)
@pytest.mark.slow
def test_a_one_minute_cpu_run_validates_often_and_warms_up_briefly(prepared_byte_dir, tmp_path):
    """The defaults a user gets: --time-budget 1 and no step flags, on the CPU. At least 5 validation points, a
    warmup of at most 10% of the steps, the decay at its floor on the last step, the schedule said once in
    steps and minutes and recorded in the checkpoint (a resume continues it). One process (`python
    app/train.py`, the documented plain run): the budget is wall-clock, and a second rank would spend another
    core-minute on the same schedule (two ranks following one decided schedule: the ZeRO-3 run of
    tests/test_evaluate.py)."""
    out = tmp_path / "run"
    args = ["--deepspeed_config", str(CPU_CONFIG), "--data", str(prepared_byte_dir), "--out", str(out),
            "--pipeline-stages", "1", "--model-config", "debug", "--time-budget", "1", "--wandb-mode", "disabled",
            "--no-progress", "--no-plots", "--samples", "0"]  # fmt: skip
    p = train_process(args)
    assert p.returncode == 0, p.stderr[-4000:]
    final = json.loads((out / "final_metrics.json").read_text())
    latest = (out / "checkpoints" / "latest").read_text()
    schedule = json.loads((out / "checkpoints" / latest / "app_state.json").read_text())["schedule"]
    steps = final["step"]
    records = metrics(out)
    validations = [r["step"] for r in records if "val/loss" in r]
    lrs = [r["train/lr"] for r in records if "train/lr" in r]
    assert len(validations) >= 5, (validations, steps, schedule)
    assert schedule["warmup_steps"] <= 0.1 * steps, (schedule, steps)
    peak = json.loads(CPU_CONFIG.read_text())["optimizer"]["params"]["lr"]
    assert lrs[-1] == pytest.approx(0.1 * peak) and max(lrs) == pytest.approx(peak), lrs
    said = [ln for ln in p.stderr.splitlines() if "schedule: time budget 1 min" in ln]
    assert len(said) == 1 and re.search(r"warmup \d+ steps \(\d+ s\)", said[0]), said
    note = "an untrained byte model reads about log2(259) = 8.02 bits/byte"  # the first 8.0 explained, once
    assert p.stderr.count(note) == 1 and note in next(ln for ln in p.stderr.splitlines() if "sanity @" in ln)
