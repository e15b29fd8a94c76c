"""How long a run trains: the one object the train loop asks, before every step, for the step's learning-rate
scale and whether to stop, and after it, whether to validate and save. The loop never decides either itself.

Chosen once, by the resolve step (app.training.plan, `for_run`), from the frozen config:
- `StepLength` (--max-steps, --epochs): a step count known at the start. The lr follows
  `schedule.lr_multiplier` of the optimizer updates applied so far: a step skipped for a non-finite gradient
  does not advance it (as DeepSpeed advances its scheduler only on an applied update). Validation and saves
  every fixed count of steps (run_schedule.for_steps).
- `TimeLength` (--time-budget): rank 0's clock decides before every step (app.training.time_budget) and every
  rank applies the same decision (a broadcast): the lr, whether to stop, and once the first steps are timed,
  where to validate and save (run_schedule.for_budget). --max-steps/--epochs, when given, stop it earlier.

Both are the lr's only source: the loop sets each step's lr from `next_step` (Engine.set_lr_scale).
What a resume continues from: StepLength, the updates applied (DeepSpeed's step counters, which every
checkpoint holds, those of older trees included); TimeLength, the training seconds spent, where its decay
began and the schedule it decided (TrainState, filled in at each save by `record`, read back by `start`).
"""

from __future__ import annotations

import functools
import logging
import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist

from app.batching.run_data import RunData
from app.training import run_schedule
from app.training.config import TrainConfig
from app.training.run_schedule import Schedule
from app.training.schedule import lr_multiplier
from app.training.state import TrainState
from app.training.time_budget import TimeBudget


@dataclass(frozen=True, slots=True)
class NextStep:
    """The answer before an optimizer step: its lr as a share of the peak (unused when `stop`), stop now."""

    lr_scale: float
    stop: bool


class RunLength:
    """What both lengths share: the step count (None: only the clock stops the run), where the run validates
    and saves, why it stopped. The measurements (`note_*`) are the clock's; a step count needs none."""

    budget_s: float | None = None  # the time budget in seconds (None: a step count)

    def __init__(self, total_steps: int | None, points: tuple[int, int]) -> None:
        self.total_steps = total_steps
        self.points = points  # (validate every, save every) in steps; 0: only at the end
        self.stopped_by = "steps"

    def next_step(self, step: int, updates: int, elapsed: float) -> NextStep:
        """Every rank, before optimizer step `step` (0-based), `updates` optimizer updates applied so far,
        `elapsed` training seconds spent (earlier runs' included): the step's lr scale, or stop."""
        raise NotImplementedError

    def describe(self) -> str:
        """The run's length, for the start-up line."""
        raise NotImplementedError

    def start(
        self,
        cfg: TrainConfig,
        data: RunData,
        params: int,
        state: TrainState,
        device: torch.device,
        rank: int,
        log: logging.Logger,
    ) -> None:
        """Once the engine is built and `state` resumed, before the first step (the clock's estimates)."""

    def validates_after(self, step: int) -> bool:
        """Whether the loop validates after `step` (the run's last step has the final validation instead)."""
        every = self.points[0]
        return bool(every) and step % every == 0 and step != self.total_steps

    def saves_after(self, step: int) -> bool:
        every = self.points[1]
        return bool(every) and step % every == 0

    def ends_at(self, step: int) -> bool:
        """Whether `step` is the run's last (its save is the final one)."""
        return self.stopped_by == "time" or (self.total_steps is not None and step >= self.total_steps)

    def counts(self) -> dict[str, int]:
        """The step counts in force from the start, for the resolved config (a budget's are decided later)."""
        return {}

    def recorded_schedule(self) -> dict | None:
        """The schedule the resolved config records (a budget's: in its checkpoints, once decided)."""
        return None

    def schedule_line(self, step_s: float) -> str | None:
        """The line saying the schedule, once the first steps are timed at `step_s` each (None: the length says
        it itself)."""
        return None

    def note_step(self, seconds: float, tokens: int) -> None:
        """A step of `tokens` took `seconds`, from its batch to its update."""

    def note_eval(self, seconds: float, tokens: int, periodic: bool) -> None:
        """An evaluation of `tokens` took `seconds`."""

    def note_save(self, seconds: float) -> None:
        """A save took `seconds`."""

    def record(self, state: TrainState) -> None:
        """Rank 0, at a save: what a resume continues from, into `state`."""


class StepLength(RunLength):
    """A run of `total_steps` steps on `schedule` (warmup, validation and save counts)."""

    def __init__(
        self, total_steps: int, schedule: Schedule, *, decay: str, min_ratio: float, lr: float
    ) -> None:
        super().__init__(total_steps, (schedule.eval_every, schedule.save_every))
        self.schedule, self.decay, self.min_ratio, self.lr = schedule, decay, min_ratio, lr
        self._multiplier = functools.partial(
            lr_multiplier, warmup=schedule.warmup_steps, total=total_steps, decay=decay, min_ratio=min_ratio
        )

    def next_step(self, step: int, updates: int, elapsed: float) -> NextStep:
        return NextStep(self._multiplier(updates), step >= self.total_steps)

    def describe(self) -> str:
        return f"{self.total_steps} steps"

    def counts(self) -> dict[str, int]:
        return {k: getattr(self.schedule, k) for k in run_schedule.FIELDS}

    def recorded_schedule(self) -> dict:
        return self.schedule.as_dict()

    def schedule_line(self, step_s: float) -> str:
        return run_schedule.describe(
            self.schedule,
            step_s=step_s,
            total_steps=self.total_steps,
            budget_min=None,
            decay=self.decay,
            min_ratio=self.min_ratio,
            lr=self.lr,
        )


class TimeLength(RunLength):
    """A run of `minutes` on rank 0's clock (at most `total_steps` steps when given), its counts `given` in
    steps honoured and the others decided once its first steps are timed."""

    def __init__(
        self,
        total_steps: int | None,
        minutes: float,
        given: dict[str, int],
        *,
        decay: str,
        min_ratio: float,
        lr: float,
    ) -> None:
        super().__init__(total_steps, (given.get("eval_every", 0), given.get("save_every", 0)))
        self.minutes, self.budget_s, self.given = minutes, minutes * 60.0, given
        self.decay, self.min_ratio, self.lr = decay, min_ratio, lr
        self.budget: TimeBudget | None = None  # rank 0's estimates and decisions, from `start`

    def describe(self) -> str:
        steps = f"{self.total_steps} steps" if self.total_steps else "no step limit"
        return f"time budget {self.minutes:g} min, {steps}"

    def start(
        self,
        cfg: TrainConfig,
        data: RunData,
        params: int,
        state: TrainState,
        device: torch.device,
        rank: int,
        log: logging.Logger,
    ) -> None:
        """The estimates the stop rule starts from (the evaluations' sizes, the parameter count), the budget a
        resumed run has left and the schedule it recorded (the counts given now on top)."""
        self.device, self.rank, self.log = device, rank, log
        tokens = {s: int(np.sum(data.store(s).lengths)) for s in ("validation", "test")}
        val_batches = data.schedule("validation").steps_per_epoch
        capped = min(1.0, cfg.eval_max_batches / max(1, val_batches)) if cfg.eval_max_batches else 1.0
        recorded = Schedule.recorded(state.schedule)
        self.budget = TimeBudget(
            self.budget_s,
            decay_from=state.decay_from,
            final_eval_tokens=tokens["validation"] + (tokens["test"] if cfg.test_eval else 0),
            periodic_eval_tokens=int(capped * tokens["validation"]),
            params=params,
            given=self.given,
            schedule=None if recorded is None else Schedule(**(recorded.as_dict() | self.given)),
            decay=self.decay,
            min_ratio=self.min_ratio,
            max_steps=self.total_steps,
        )
        if rank == 0:
            left = self.budget_s - state.train_seconds
            log.info(
                f"time budget {self.minutes:g} min ({left:.0f} s left): the lr decays over the training time, "
                f"which ends in time for the final evaluation and save (not step-reproducible)"
            )

    def next_step(self, step: int, updates: int, elapsed: float) -> NextStep:
        """Rank 0 decides on its clock and broadcasts (the lr scale, stop now, where to validate and save); it
        logs the schedule once decided, and why the run stops."""
        if self.total_steps is not None and step >= self.total_steps:
            return NextStep(math.nan, True)  # the step count given on top ends it first
        decision = torch.zeros(4, dtype=torch.float64, device=self.device)
        if self.rank == 0:
            decision[0], decision[1] = self._decide(step, elapsed)
            decision[2], decision[3] = self.budget.points()
        dist.broadcast(decision, src=0)
        self.points = (int(decision[2]), int(decision[3]))
        stop = bool(decision[1])
        self.stopped_by = "time" if stop else self.stopped_by
        return NextStep(float(decision[0]), stop)

    def _decide(self, step: int, elapsed: float) -> tuple[float, bool]:
        """Rank 0: the budget's decision before `step`, and the lines it gives."""
        budget = self.budget
        mult, stop = budget.decide(step, elapsed)
        if (warning := budget.reserve_warning()) is not None:
            self.log.warning(warning)
        if (line := budget.schedule_line(self.lr)) is not None:
            self.log.info(line)
        if stop:
            self.log.info(
                f"time budget: stopping after step {step} at {elapsed:.0f} s of {budget.budget_s:.0f} s, "
                f"keeping {budget.reserve():.0f} s for the final evaluation and save"
            )
        return mult, stop

    def note_step(self, seconds: float, tokens: int) -> None:
        self.budget.note_step(seconds, tokens)

    def note_eval(self, seconds: float, tokens: int, periodic: bool) -> None:
        self.budget.note_eval(seconds, tokens, periodic)

    def note_save(self, seconds: float) -> None:
        self.budget.note_save(seconds)

    def record(self, state: TrainState) -> None:
        self.budget.record(state)


def total_steps(cfg: TrainConfig, steps_per_epoch: int) -> int | None:
    """--max-steps, else --epochs (1 without --time-budget) of `steps_per_epoch`; None: the clock alone."""
    if cfg.max_steps is not None:
        return cfg.max_steps
    if cfg.epochs or cfg.time_budget is None:
        return max(1, math.ceil((cfg.epochs or 1.0) * steps_per_epoch))
    return None


def for_run(cfg: TrainConfig, steps_per_epoch: int, lr: float) -> RunLength:
    """The run's length (the resolve step's one choice of it): the clock under --time-budget, else the step
    count, with the peak `lr` in force (the schedule line states it)."""
    total, given = total_steps(cfg, steps_per_epoch), run_schedule.given(cfg)
    kw = dict(decay=cfg.lr_decay, min_ratio=cfg.min_lr_ratio, lr=lr)
    if cfg.time_budget:
        return TimeLength(total, cfg.time_budget, given, **kw)
    return StepLength(total, run_schedule.for_steps(given), **kw)
