"""The end of a run, on rank 0: its summary (final_metrics.json and W&B's), the line naming the checkpoint
with the lowest validation loss (which `--checkpoint <run>/best` names to every tool), the last line."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from app.checkpoints import training as ckpt
from app.common.files import atomic_write
from app.training.state import TrainState
from app.training.tracking import Tracker


def finish_run(
    tracker: Tracker,
    final: dict,
    state: TrainState,
    *,
    params: int,
    train_seconds: float,
    stopped_by: str,
    budget_s: float | None,
    code: dict,
    run_dir: Path,
    log: logging.Logger,
) -> None:
    """The final evaluations' figures and the run's, in <run>/final_metrics.json and the tracker's summary;
    the tracker closed."""
    summary = {
        **final,
        "step": state.step,
        "skipped_total": state.skipped_total,
        "params": params,
        "train_seconds": round(train_seconds, 2),
        "stopped_by": stopped_by,
        "time_budget_s": budget_s,
        "code": code,
    }
    root = run_dir / "checkpoints"
    best = ckpt.best_tag(root)
    if best is not None:
        v = ckpt.read_app_state(root / best)["validation"]
        summary["best_checkpoint"] = {"tag": best, "val_loss": v["loss"]}
        n = v.get("max_batches") or 0
        over = f" over the first {n} batch{'es' if n > 1 else ''}, as periodic ones" if n else ""
        log.info(
            f"lowest validation loss: {best} ({v['loss']:.4f} nats/token{over}); evaluate, export or "
            f"sample it with --checkpoint {run_dir / ckpt.BEST}"
        )
    atomic_write(run_dir / "final_metrics.json", json.dumps(summary, indent=1))
    tracker.summary(summary)
    tracker.close()
    log.info(
        f"done: {state.step} steps, {params / 1e6:.2f}M parameters, {summary['train_seconds']:.0f} s "
        f"of training{'' if budget_s is None else f' of a {budget_s:.0f} s budget'}; run directory {run_dir}"
    )
