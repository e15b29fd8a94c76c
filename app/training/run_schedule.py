"""The step counts a run follows: its warmup, and where it validates and saves.

Defaults follow the run's length. With a step count (--max-steps, --epochs) they are fixed counts
(STEP_DEFAULTS). Under --time-budget they are shares of the steps the budget is expected to hold, which are
only known once steps have been timed: the first MEASURE_STEPS steps are timed (the first pays one-off
costs: kernel choices, allocations; the median of three sets it aside), then the warmup is WARMUP_SHARE of
the expected steps (at most WARMUP_CAP), a validation comes every EVAL_SHARE of them and a save at each
validation (so `best` can be any of them). Meanwhile the learning rate ramps as a WARMUP_CAP-step warmup
would, and goes on from there to the peak at the decided warmup's end. Values given in steps are
honoured as given. A checkpoint records the schedule, so a resumed run keeps it.

Every run logs, once, the schedule in steps and in minutes (`describe`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

FIELDS = ("warmup_steps", "eval_every", "save_every")
STEP_DEFAULTS = {"warmup_steps": 100, "eval_every": 200, "save_every": 500}
MEASURE_STEPS = 3
WARMUP_SHARE = 0.05
WARMUP_CAP = 100
EVAL_SHARE = 0.10


@dataclass(frozen=True, slots=True)
class Schedule:
    """Warmup steps, and every how many steps the run validates and saves (0: only at the end)."""

    warmup_steps: int
    eval_every: int
    save_every: int
    expected_steps: int | None = None  # under a budget: the steps it was expected to hold when decided
    decided_at: int = 0  # the step before which it was decided (a budget's warmup ramp goes on from there)

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def recorded(cls, d: dict | None) -> Schedule | None:
        """The schedule a checkpoint or config.json recorded (None: none recorded)."""
        if not isinstance(d, dict) or not all(isinstance(d.get(k), int) for k in FIELDS):
            return None
        return cls(**{k: d[k] for k in (*FIELDS, "expected_steps", "decided_at") if k in d})


def given(values: object) -> dict[str, int]:
    """The counts given in steps (flags, --config): the fields of `values` (a TrainConfig) that are not None."""
    return {k: getattr(values, k) for k in FIELDS if getattr(values, k) is not None}


def for_steps(counts: dict[str, int]) -> Schedule:
    """A run of a known step count: the `counts` given, else STEP_DEFAULTS."""
    return Schedule(**(STEP_DEFAULTS | counts))


def for_budget(counts: dict[str, int], expected_steps: float, decided_at: int) -> Schedule:
    """A budgeted run expected to hold `expected_steps`, decided before step `decided_at`: the `counts`
    given, the others shares of the expected steps."""
    expected = max(1, round(expected_steps))
    eval_every = counts.get("eval_every", max(1, round(EVAL_SHARE * expected)))
    auto = {
        "warmup_steps": min(WARMUP_CAP, max(1, round(WARMUP_SHARE * expected))),
        "eval_every": eval_every,
        "save_every": eval_every,
    }
    ramp_from = 0 if "warmup_steps" in counts else decided_at  # a given warmup ramps as given from step 0
    return Schedule(**(auto | counts), expected_steps=expected, decided_at=ramp_from)


def provisional(counts: dict[str, int]) -> Schedule | None:
    """What a budgeted run follows before its first steps are timed: a given warmup (None: the ramp of
    WARMUP_CAP steps) and the points given (else none yet)."""
    if "warmup_steps" not in counts:
        return None
    return Schedule(counts["warmup_steps"], counts.get("eval_every", 0), counts.get("save_every", 0))


def warmup_multiplier(step: int, schedule: Schedule | None) -> float | None:
    """The warmup's factor on the peak lr before optimizer step `step` (0-based); None once it is over.
    Undecided (a budget's first steps): the ramp of a WARMUP_CAP-step warmup. Decided after steps had run
    on that ramp: a straight line from where it stood to 1 at the warmup's end."""
    if schedule is None:
        return min(1.0, (step + 1) / WARMUP_CAP)
    warmup, start = schedule.warmup_steps, schedule.decided_at
    if step >= warmup:
        return None
    if start == 0:
        return (step + 1) / warmup
    at_start = min(1.0, start / WARMUP_CAP)  # the ramp's value on the last step before the decision
    return at_start + (1.0 - at_start) * (step + 1 - start) / max(1, warmup - start)


def _minutes(seconds: float) -> str:
    """A duration as a reader takes it in: seconds under a minute, else minutes (hours past 2)."""
    if seconds < 60:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.1f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h"


def _every(n: int, step_s: float, what: str) -> str:
    return f"{what} only at the end" if n == 0 else f"{what} every {n} steps ({_minutes(n * step_s)})"


def describe(
    s: Schedule,
    *,
    step_s: float,
    total_steps: int | None,
    budget_min: float | None,
    decay: str,
    min_ratio: float,
    lr: float,
) -> str:
    """The schedule line: `schedule: ...` in steps and in minutes at `step_s` seconds a step."""
    steps = total_steps or s.expected_steps or 0
    if budget_min is not None and total_steps is None:
        length = f"time budget {budget_min:g} min, ~{steps} steps of {step_s:.2g} s"
    else:
        length = f"{steps} steps of ~{step_s:.2g} s (~{_minutes(steps * step_s)})"
    decay_part = (
        f"then a constant lr {lr:g}"
        if decay == "constant"
        else f"then {decay} decay to {min_ratio:g} x lr {lr:g} by the last step"
    )
    if s.eval_every and s.save_every == s.eval_every:
        points = f"{_every(s.eval_every, step_s, 'validation and a save')}"
    else:
        points = f"{_every(s.eval_every, step_s, 'validation')}; {_every(s.save_every, step_s, 'a save')}"
    end = "" if not s.eval_every or steps >= s.eval_every else " (none before the end)"
    warm = f"warmup {s.warmup_steps} steps ({_minutes(s.warmup_steps * step_s)})"
    return f"schedule: {length}: {warm}, {decay_part}; {points}{end}"
