"""`--time-budget`: when a wall-clock-budgeted run stops, and where its learning rate stands meanwhile.

What the budget counts: the training loop from its first step to the end of the final evaluation, save
and test evaluation, on rank 0's clock. Start-up (process launch, engine build, the fused core's one-off
compile, the sanity evaluation) is not counted. A checkpoint records the training seconds spent
so far, so a resumed run continues the same budget (time after the last checkpoint of a killed run is
lost with the steps it paid for).

The stop rule, decided by rank 0 before every step (`decide`; app.training.run_length's TimeLength broadcasts
it, so every rank sets the same lr, validates and saves at the same steps and stops at the same step):

    stop when  elapsed + next step (+ the periodic evaluation / save it triggers) + reserve  >  budget

where `reserve` is the final phase (the whole validation split, a save, the test split) estimated from
what this run measured: seconds per evaluated token from the latest evaluation (not the first one, whose
time is mostly one-off work: kernel choices, allocations; before a usable one, half the training time
per token, an overestimate as a forward pass is about a third of a step), the latest save (before any, a
guess from the parameter count), each scaled by SAFETY plus MARGIN_S seconds for closing the logs, and
at most MAX_RESERVE of the budget (a larger estimate is logged: training that time matters more than
ending on the second). The step estimate is the median of the last few steps. The learning rate decays
over the training time: the elapsed share of `budget - reserve` (see `schedule.budget_lr_multiplier`),
and reaches its floor on the last step that fits (the one after which the next would not).

The warmup and the validation and save points default to shares of the steps the budget is expected to
hold, decided once the first steps are timed (app/training/run_schedule.py).

Time-budgeted runs are not step-reproducible: the stop step and every post-warmup learning rate depend
on the machine's speed and load (two runs with the same seed agree until their clocks differ).
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass, field

from app.training import run_schedule
from app.training.run_schedule import EVAL_SHARE, MEASURE_STEPS, Schedule
from app.training.schedule import budget_lr_multiplier

SAFETY = 1.5  # the final phase's estimate is scaled by this (evaluation speed varies with load)
MARGIN_S = 3.0  # closing the logs, the summary, the last barrier
SAVE_BYTES_PER_PARAM = 16  # fp32 weights + Adam's two moments + slack, before a save has been timed
SAVE_GUESS_BYTES_PER_S = 100e6
RECENT_STEPS = 5
EVAL_VS_STEP = 0.5  # evaluation seconds per token over training seconds per token, before one is timed
MAX_RESERVE = 0.5  # the final phase may take at most this share of the budget


def should_stop(elapsed_s: float, budget_s: float, next_cost_s: float, reserve_s: float) -> bool:
    """True when the next step (and what it triggers) would not leave `reserve_s` for the final phase."""
    return elapsed_s + next_cost_s + reserve_s > budget_s


def train_fraction(elapsed_s: float, budget_s: float, reserve_s: float) -> float:
    """The elapsed share of the budget's training time (budget minus the final phase), in [0, 1]."""
    span = budget_s - reserve_s
    return 1.0 if span <= 0 else min(1.0, max(0.0, elapsed_s / span))


@dataclass(slots=True)
class Estimates:
    """What this run measured, for the stop rule: step, evaluation and save times."""

    eval_s_per_token: float | None = None
    periodic_eval_s: float | None = None
    save_s: float | None = None
    step_tokens: float | None = None
    evals_seen: int = 0
    steps: deque[float] = field(default_factory=lambda: deque(maxlen=RECENT_STEPS))

    def step_s(self) -> float:
        return statistics.median(self.steps) if self.steps else 0.0

    def eval_rate(self) -> float:
        """Seconds per evaluated token; before any evaluation, the training rate (an overestimate)."""
        if self.eval_s_per_token is not None:
            return self.eval_s_per_token
        if self.steps and self.step_tokens:
            return EVAL_VS_STEP * self.step_s() / self.step_tokens
        return 0.0


class TimeBudget:
    """Rank 0's estimates and decisions for one run with `--time-budget` (the clock is the trainer's)."""

    def __init__(
        self,
        budget_s: float,
        *,
        decay_from: float | None,
        final_eval_tokens: int,
        periodic_eval_tokens: int,
        params: int,
        given: dict[str, int],
        schedule: Schedule | None,
        decay: str,
        min_ratio: float,
        max_steps: int | None = None,
    ) -> None:
        """`given`: the counts given in steps (run_schedule.given); `schedule`: the one a resumed run recorded
        (None: decided after the first steps)."""
        self.budget_s, self.decay_from = budget_s, decay_from
        self.final_eval_tokens, self.periodic_eval_tokens = final_eval_tokens, periodic_eval_tokens
        self.params = params
        self.given, self.schedule, self.max_steps = given, schedule, max_steps
        self.decay, self.min_ratio = decay, min_ratio
        self.est = Estimates()
        self.fraction = 0.0
        self._reserve_warned = False
        self._schedule_due = True  # said once per process, when it is known and steps have been timed

    # ---- measurements
    def note_step(self, seconds: float, tokens: int) -> None:
        self.est.steps.append(seconds)
        self.est.step_tokens = float(tokens)

    def note_eval(self, seconds: float, tokens: int, periodic: bool) -> None:
        self.est.evals_seen += 1
        if self.est.evals_seen == 1:
            return  # the first evaluation of a process pays one-off costs: its rate says little
        if tokens > 0:
            self.est.eval_s_per_token = seconds / tokens
        if periodic:
            self.est.periodic_eval_s = seconds

    def note_save(self, seconds: float) -> None:
        self.est.save_s = seconds

    # ---- the estimates
    def save_estimate(self) -> float:
        if self.est.save_s is not None:
            return self.est.save_s
        return 1.0 + SAVE_BYTES_PER_PARAM * self.params / SAVE_GUESS_BYTES_PER_S

    def estimated_reserve(self) -> float:
        """Seconds the final phase is expected to need: full validation (+ test) evaluation and a save."""
        final = self.final_eval_tokens * self.est.eval_rate() + self.save_estimate()
        return SAFETY * final + MARGIN_S

    def reserve(self) -> float:
        """Seconds kept for the final phase (the estimate, at most MAX_RESERVE of the budget)."""
        return min(self.estimated_reserve(), MAX_RESERVE * self.budget_s)

    def reserve_warning(self) -> str | None:
        """Once per run: the line saying the final phase is estimated at more than the reserve it is given."""
        want = self.estimated_reserve()
        if want <= self.reserve() or self._reserve_warned:
            return None
        self._reserve_warned = True
        return (
            f"time budget: the final evaluation and save are estimated at {want:.0f} s, more than half the "
            f"budget; keeping {self.reserve():.0f} s (the run may end late). A smaller validation split "
            "(data_prep --val-fraction) or --test-eval false shortens them"
        )

    def periodic_estimate(self) -> float:
        """Seconds of one periodic evaluation."""
        periodic = self.est.periodic_eval_s
        return periodic if periodic is not None else self.periodic_eval_tokens * self.est.eval_rate()

    def points(self) -> tuple[int, int]:
        """(validate every, save every) in steps as decided; before that, the counts given (0: none yet)."""
        s = self.schedule or run_schedule.provisional(self.given)
        if s is None:
            return self.given.get("eval_every", 0), self.given.get("save_every", 0)
        return s.eval_every, s.save_every

    def next_cost(self, next_step: int, high: bool = False) -> float:
        """The next step, plus the periodic evaluation and save that step triggers (`high`: all of it
        SAFETY x, and the slowest recent step rather than the median)."""
        cost = max(self.est.steps, default=0.0) if high else self.est.step_s()
        eval_every, save_every = self.points()
        if eval_every and next_step % eval_every == 0:
            cost += self.periodic_estimate()
        if save_every and next_step % save_every == 0:
            cost += self.save_estimate()
        return SAFETY * cost if high else cost

    def expected_steps(self, step: int, elapsed: float, reserve: float) -> float:
        """Steps the budget will hold at the measured step time, the default validations and saves (one
        every EVAL_SHARE of the run) paid for; at most --max-steps."""
        left = self.budget_s - reserve - elapsed
        if "eval_every" not in self.given:
            left -= round(1 / EVAL_SHARE) * (self.periodic_estimate() + self.save_estimate())
        expected = step + max(1.0, left / max(self.est.step_s(), 1e-9))
        return min(expected, self.max_steps) if self.max_steps else expected

    # ---- the decision (rank 0)
    def decide(self, step: int, elapsed: float) -> tuple[float, bool]:
        """Before optimizer step `step` (0-based), `elapsed` training seconds into the budget (earlier
        runs' included): (lr multiplier for the step, stop now)."""
        reserve = self.reserve()
        self.fraction = max(self.fraction, train_fraction(elapsed, self.budget_s, reserve))
        if self.schedule is None and len(self.est.steps) >= MEASURE_STEPS:
            self.schedule = run_schedule.for_budget(
                self.given, self.expected_steps(step, elapsed, reserve), step
            )
        stop = should_stop(elapsed, self.budget_s, self.next_cost(step + 1), reserve)
        warm = run_schedule.warmup_multiplier(step, self.schedule or run_schedule.provisional(self.given))
        if warm is not None:
            return warm, stop
        if self.decay_from is None:
            self.decay_from = self.fraction  # the warmup just ended: the decay spans the rest of the time
        if not stop and self.last_step(step, elapsed, reserve):
            self.fraction = 1.0  # the decay ends on the last step that fits, at its floor
        mult = budget_lr_multiplier(
            step, self.fraction, self.decay_from, warmup=0, decay=self.decay, min_ratio=self.min_ratio
        )
        return mult, stop

    def last_step(self, step: int, elapsed: float, reserve: float) -> bool:
        """True when the step after `step` (and what it triggers) may not fit, its cost and this one's taken
        on the high side (SAFETY x the slowest recent step): `step` may be the last, so the decay ends here
        (a step or two early rather than one late: the stop rule takes the median)."""
        after = elapsed + self.next_cost(step + 1, high=True)
        return should_stop(after, self.budget_s, self.next_cost(step + 2, high=True), reserve)

    def schedule_line(self, lr: float) -> str | None:
        """Once, when the schedule is known (decided, or recorded by a resumed run) and steps have been timed:
        the line that says it (run_schedule.describe)."""
        if not self._schedule_due or self.schedule is None or len(self.est.steps) < MEASURE_STEPS:
            return None
        self._schedule_due = False
        return run_schedule.describe(
            self.schedule,
            step_s=self.est.step_s(),
            total_steps=None,
            budget_min=self.budget_s / 60,
            decay=self.decay,
            min_ratio=self.min_ratio,
            lr=lr,
        )

    def record(self, state) -> None:
        """Rank 0, at a save: what a resume continues from (where the decay started, the schedule)."""
        state.decay_from = self.decay_from
        state.schedule = self.schedule.as_dict() if self.schedule is not None else None
