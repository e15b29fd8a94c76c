"""app.training.run_length: the one object the train loop asks for the step's lr, whether to stop, and where
to validate and save; both lengths in-process, each fresh and resumed.

StepLength is checked against what set a step-count run's lr before it was the one source: a torch LambdaLR
over `schedule.lr_multiplier`, stepped only on an applied update (as DeepSpeed steps its scheduler), and
resumed from its state_dict (what a checkpoint of an older tree holds). TimeLength is checked against its
TimeBudget's own decisions on a simulated clock, through a real one-rank gloo process group (its broadcast).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import random
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from app.train import parse_args
from app.training.plan import open_inputs, plan_run
from app.training.run_length import StepLength, TimeLength
from app.training.run_schedule import MEASURE_STEPS, Schedule
from app.training.schedule import lr_multiplier
from app.training.state import TrainState
from app.training.time_budget import TimeBudget

ROOT = Path(__file__).resolve().parents[1]
DS = str(ROOT / "ds_configs" / "cpu_pp2_zero1.json")  # lr 0.003
PEAK = 3e-3


def old_scheduler(warmup: int, total: int, state: dict | None = None):
    """A step-count run's lr before the run length: DeepSpeed's scheduler slot held this LambdaLR."""
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=PEAK)
    fn = functools.partial(lr_multiplier, warmup=warmup, total=total, decay="cosine", min_ratio=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, fn)
    if state is not None:
        opt.param_groups[0]["lr"] = state["_last_lr"][0]  # the optimizer's state_dict restores its lr
        sched.load_state_dict(state)
    return opt, sched


def step_length(total: int, warmup: int, eval_every: int = 4, save_every: int = 3) -> StepLength:
    return StepLength(total, Schedule(warmup, eval_every, save_every), decay="cosine", min_ratio=0.1, lr=PEAK)


def test_a_step_count_sets_each_lr_as_the_scheduler_did_skips_and_resume_included():
    """30 steps, warmup 3, steps 2, 5 and 17 skipped (non-finite): the lr of every step equals the old
    scheduler's bit for bit; a resume at step 12 (the old scheduler from its state_dict, the new length fresh,
    the updates from the counters a checkpoint keeps) continues it."""
    total, skipped = 30, {2, 5, 17}
    opt, sched = old_scheduler(3, total)
    length, updates, saved = step_length(total, 3), 0, None
    for step in range(total):
        if step == 12:  # a resume: both rebuilt from what the checkpoint holds
            saved = sched.state_dict()
            opt, sched = old_scheduler(3, total, saved)
            length = step_length(total, 3)
        ask = length.next_step(step, updates, elapsed=0.0)
        assert not ask.stop
        assert PEAK * ask.lr_scale == opt.param_groups[0]["lr"], step  # Engine.set_lr_scale: peak x scale
        if step + 1 not in skipped:  # DeepSpeed steps its scheduler on an applied update only
            opt.step()
            sched.step()
            updates += 1
    assert saved is not None and saved["last_epoch"] == 10  # 12 steps, 2 of them skipped
    assert length.next_step(total, updates, 0.0).stop


def test_a_step_count_validates_and_saves_at_its_counts_and_says_its_schedule():
    length = step_length(8, 2, eval_every=4, save_every=3)
    assert [s for s in range(1, 9) if length.validates_after(s)] == [4]  # step 8: the final validation
    assert [s for s in range(1, 9) if length.saves_after(s)] == [3, 6]
    assert [s for s in range(1, 9) if length.ends_at(s)] == [8] and length.stopped_by == "steps"
    assert length.counts() == {"warmup_steps": 2, "eval_every": 4, "save_every": 3}
    assert length.recorded_schedule() == Schedule(2, 4, 3).as_dict() and length.describe() == "8 steps"
    assert length.budget_s is None
    assert length.schedule_line(0.5) == (
        "schedule: 8 steps of ~0.5 s (~4 s): warmup 2 steps (1 s), then cosine decay to 0.1 x lr 0.003 by the "
        "last step; validation every 4 steps (2 s); a save every 3 steps (2 s)"
    )
    state = TrainState(step=3)
    length.record(state)  # a step count keeps nothing beyond the step and the optimizer's counters
    assert state == TrainState(step=3)


def plan_of(data: Path, *flags: str):
    args = parse_args(["--deepspeed_config", DS, "--data", str(data), "--pipeline-stages", "2", *flags])
    inputs, model_cfg = open_inputs(args.cfg, args.model_overrides)
    return plan_run(args.cfg, args.deepspeed, inputs, model_cfg, 2)


def test_the_resolve_step_chooses_the_length_and_its_step_count(prepared_dir):
    spe = plan_of(prepared_dir).steps_per_epoch
    cases = [
        ((), StepLength, spe),  # one epoch by default
        (("--max-steps", "7", "--epochs", "3"), StepLength, 7),  # --max-steps wins
        (("--epochs", "2.5"), StepLength, math.ceil(2.5 * spe)),
        (("--time-budget", "2"), TimeLength, None),  # the clock alone
        (("--time-budget", "2", "--epochs", "2"), TimeLength, 2 * spe),  # the count ends it first
    ]
    for flags, kind, total in cases:
        p = plan_of(prepared_dir, *flags)
        assert type(p.length) is kind and p.length.total_steps == p.total_steps == total, flags
    timed = plan_of(prepared_dir, "--time-budget", "2", "--warmup-steps", "5")
    assert timed.length.describe() == "time budget 2 min, no step limit" and timed.length.budget_s == 120.0
    assert timed.cfg.eval_every is None and timed.cfg.warmup_steps == 5  # a budget's counts: decided later
    assert timed.resolved(1)["schedule"] is None


@pytest.fixture
def one_rank(tmp_path):
    """A real gloo process group of one rank (the broadcast TimeLength makes), removed after the test (one an
    in-process run of this worker left is used as it is)."""
    if dist.is_initialized():
        assert dist.get_world_size() == 1
        yield torch.device("cpu")
        return
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    yield torch.device("cpu")
    dist.destroy_process_group()


def started(plan, state: TrainState, device, log) -> TimeLength:
    length = plan.length
    assert isinstance(length, TimeLength)
    length.start(plan.cfg, plan.data, 2_000_000, state, device, 0, log)
    return length


def run_on_clock(length: TimeLength, oracle: TimeBudget, rng: random.Random, start: float = 0.0):
    """The loop's questions on a simulated clock, each answer checked against the budget's own decision:
    -> (lr scales, validation steps, the last step)."""
    clock, step, scales, validated = start, 0, [], []
    length.note_eval(2.0, 3000, periodic=False)  # the sanity evaluation (one-off: set aside)
    oracle.note_eval(2.0, 3000, periodic=False)
    while True:
        ask = length.next_step(step, step, clock)
        want, stop = oracle.decide(step, clock)
        assert (ask.stop, length.points) == (stop, oracle.points()), step
        if ask.stop:
            return scales, validated, step
        assert ask.lr_scale == want, step
        scales.append(ask.lr_scale)
        dt = rng.uniform(0.2, 0.3)
        clock, step = clock + dt, step + 1
        for b in (length, oracle):
            b.note_step(dt, tokens=4000)
        if length.validates_after(step):
            clock += 0.4
            validated.append(step)
            for b in (length, oracle):
                b.note_eval(0.4, 3000, periodic=True)
        if length.saves_after(step):
            clock += 0.3
            for b in (length, oracle):
                b.note_save(0.3)


def oracle_for(length: TimeLength, state: TrainState) -> TimeBudget:
    b = length.budget
    return TimeBudget(
        b.budget_s, decay_from=state.decay_from, final_eval_tokens=b.final_eval_tokens,
        periodic_eval_tokens=b.periodic_eval_tokens, params=b.params, given=b.given, schedule=b.schedule,
        decay=b.decay, min_ratio=b.min_ratio, max_steps=b.max_steps,
    )  # fmt: skip


def test_a_time_budget_answers_as_its_clock_decides_and_a_resume_keeps_its_schedule(
    prepared_dir, one_rank, caplog
):
    """One simulated minute: every answer is the budget's decision (the broadcast changes nothing on one rank),
    the validation points are the schedule decided after MEASURE_STEPS steps, the run stops by time at the
    lr's floor. Saved, then resumed: the recorded schedule holds from the first step, the decay goes on from
    where it began, and a step count given on top ends the resumed run first."""
    seed = random.randrange(2**32)
    log = logging.getLogger("test_run_length")
    caplog.set_level(logging.INFO, logger=log.name)
    plan = plan_of(prepared_dir, "--time-budget", "1", "--wandb-mode", "disabled")
    length = started(plan, TrainState(), one_rank, log)
    scales, validated, last = run_on_clock(length, oracle_for(length, TrainState()), random.Random(seed))
    decided = length.budget.schedule
    assert decided is not None and decided.decided_at == MEASURE_STEPS, seed
    assert validated == list(range(decided.eval_every, last + 1, decided.eval_every)), (seed, validated)
    assert length.stopped_by == "time" and length.ends_at(last) and scales[-1] == pytest.approx(0.1), seed
    lines = [r.getMessage() for r in caplog.records if r.name == log.name]
    assert sum(ln.startswith("schedule: time budget 1 min, ~") for ln in lines) == 1, lines
    assert lines[0].startswith("time budget 1 min (60 s left)")
    assert "time budget: stopping after step" in lines[-1]

    saved = TrainState(step=last, train_seconds=30.0)
    length.record(saved)
    assert saved.schedule == decided.as_dict() and 0 < saved.decay_from < 1, (seed, saved)
    resumed = plan_of(prepared_dir, "--time-budget", "1", "--max-steps", str(last + 4))
    again = started(resumed, dataclasses.replace(saved), one_rank, log)
    assert again.points == (0, 0) and again.budget.schedule == decided  # the recorded one, before any step
    ask = again.next_step(last, last, 30.0)
    assert again.points == (decided.eval_every, decided.save_every) and not ask.stop, seed
    assert again.budget.decay_from == saved.decay_from, seed
    assert ask.lr_scale < 1.0, seed  # the decay goes on
    assert again.next_step(last + 4, last + 4, 31.0).stop  # the step count given on top
    assert again.stopped_by == "steps" and again.ends_at(last + 4)
