"""Where a run stands: the one thing the train loop changes, recorded with every checkpoint."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class TrainState:
    """Where the run stands; saved with every checkpoint and restored on resume."""

    step: int = 0
    skipped_total: int = 0
    consecutive_skips: int = 0
    tokens: int = 0  # tokens trained on so far (real ones, pads excluded)
    bytes: int = 0  # the bytes of text those tokens are
    wandb_id: str | None = None
    last_saved: int = -1
    train_seconds: float = 0.0  # rank 0's training time up to the last save (--time-budget counts it)
    decay_from: float | None = None  # --time-budget: the budget fraction at which the warmup ended
    schedule: dict | None = (
        None  # --time-budget: the warmup, validation and save steps decided (run_schedule)
    )

    @classmethod
    def resumed(cls, saved: dict) -> TrainState:
        """The state a checkpoint's app state records: the run continues from its step."""
        return cls(
            step=saved["step"],
            skipped_total=saved["skipped_total"],
            tokens=saved.get("tokens", 0),  # absent in checkpoints written before it was recorded
            bytes=saved.get("bytes", 0),
            wandb_id=saved.get("wandb_id"),
            last_saved=saved["step"],
            train_seconds=float(saved.get("train_seconds", 0.0)),  # absent in checkpoints before the budget
            decay_from=saved.get("decay_from"),
            schedule=saved.get("schedule"),  # absent before the budget's defaults were decided per run
        )
