"""A checkpoint of the step a run stands at: every rank writes its part, then rank 0 records the run's app
state and commits it (the format: app/checkpoints/training.py). A failed write on any rank (a full disk)
reaches every rank as one line, the partial save removed (app/checkpoints/save_guard.py), instead of
leaving the others waiting in a collective."""

from __future__ import annotations

import logging
from pathlib import Path

from app.checkpoints import training as ckpt
from app.checkpoints.save_guard import deepspeed_save, run_on_all_ranks
from app.common import faults
from app.model.layers import RecurrentLayer
from app.parallel.engine import Engine
from app.training import carry_state
from app.training.plan import RunPlan
from app.training.startup import run_identity
from app.training.state import TrainState


def app_state(
    state: TrainState, plan: RunPlan, resolved: dict, validation_at: tuple[int, dict | None]
) -> dict:
    """What a checkpoint records beside the weights: where the run stands, what a resume checks (config,
    model, tokenizer, layout, data), and `validation_at`'s (step, validation loss record) if it is this
    step's (best_tag reads it)."""
    out = {
        "step": state.step,
        "skipped_total": state.skipped_total,
        "tokens": state.tokens,
        "bytes": state.bytes,
        "sampler": plan.data.schedule("train").fingerprint(),
        "wandb_id": state.wandb_id,
        "train_seconds": state.train_seconds,
        "decay_from": state.decay_from,
        "schedule": state.schedule,
        "config": resolved | ({"schedule": state.schedule} if state.schedule else {}),
        "model_config": plan.model_cfg.to_dict(),
        "tokenizer": plan.data.tokenizer,
        "layout": plan.layout.as_dict(),
        **run_identity(plan.data, plan.model_cfg),
    }
    at, validation = validation_at
    if at == state.step:
        out["validation"] = validation
    return out


def save_checkpoint(
    plan: RunPlan,
    engine: Engine,
    state: TrainState,
    resolved: dict,
    validation_at: tuple[int, dict | None],
    *,
    rank: int,
    carried: list[RecurrentLayer] | None,
    log: logging.Logger,
) -> str:
    """Checkpoint `state.step` on every rank; rank 0 commits it once all have written and prunes to
    --keep-last -> the tag."""
    root, step = Path(plan.cfg.out) / "checkpoints", state.step
    tag = ckpt.tag_for(step)

    def write() -> None:
        if rank == 0:
            ckpt.invalidate(root, tag)  # a rewritten tag is incomplete until its new manifest
        deepspeed_save(engine.ds, root, tag)
        ckpt.write_rank_state(root / tag, rank)
        faults.enospc_in_save(step, root / tag)
        if carried is not None:
            carry_state.save(carried, root / tag, rank)
        faults.crash_in_save(step)

    def commit() -> None:
        if rank != 0:
            return
        record = app_state(state, plan, resolved, validation_at)
        ckpt.commit(root, tag, record, plan.world, plan.data.prepared.tokenizer_path)
        removed = ckpt.prune(root, plan.cfg.keep_last)
        log.info(f"saved {root / tag}" + (f" (removed {', '.join(removed)})" if removed else ""))

    # every rank learns of a failed write (disk full) on any rank: one line, the partial save removed
    run_on_all_ranks(write, root, tag, engine.device)
    run_on_all_ranks(commit, root, tag, engine.device)
    return tag
