"""A run's set-up before its first step, in the order `Trainer.setup` calls it: the checkpoint it resumes
(checked before any of its weights are read), the engine in the stage split that checkpoint fixes, the
weights and state it resumes with, and the trackers (rank 0).

Each function takes what it needs and returns what it built; `info` is rank 0's log line.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from app.batching.run_data import RunData
from app.checkpoints import resume as resume_check
from app.checkpoints import training as ckpt
from app.checkpoints import universal
from app.checkpoints.safety import verify_tag_files, weights_only_loads
from app.checkpoints.warm_start import load_into, open_init_source
from app.common import phase_clock
from app.model.config import ModelConfig, flops_per_token
from app.model.layers import RecurrentLayer
from app.parallel.engine import Engine
from app.parallel.layout import Layout, engine_config
from app.training import carry_state
from app.training.config import TrainConfig
from app.training.metrics import StepLogger
from app.training.peak_flops import world_peak
from app.training.plan import RunPlan
from app.training.state import TrainState
from app.training.tracking import Tracker, recorded_run_id, resolve_wandb_mode

Info = Callable[[str], None]


def run_identity(data: RunData, model_cfg: ModelConfig) -> dict:
    """What a checkpoint records so a resume can tell another model, tokenizer or data set."""
    prepared = data.prepared
    tok = prepared.tokenizer_path
    return {
        "model_config": model_cfg.to_dict(),
        "tokenizer_sha256": resume_check.file_sha256(tok),
        "data_fingerprint": resume_check.data_fingerprint(prepared.path / "meta.json"),
    }


def check_resume_tag(tag: str, cfg: TrainConfig, layout: Layout, data: RunData, identity: dict) -> dict:
    """Every rank: checkpoint `tag` of --out checked before any of its weights are read -> its app state."""
    run_dir = Path(cfg.out)
    tag_dir = run_dir / "checkpoints" / tag
    verify_tag_files(tag_dir, run_dir)  # nothing outside, nothing to execute
    saved = ckpt.read_app_state(tag_dir)
    resume_check.check_compatible(saved, identity, tag, run_dir, cfg.allow_data_change)
    ckpt.check_resumable(
        saved,
        tag,
        layout.as_dict(),
        data.schedule("train").fingerprint(),
        run_dir,
        cfg.allow_data_change,
    )
    return saved


def build_engine(
    plan: RunPlan,
    *,
    recorded_costs: list[float] | None,
    load_universal: bool,
    init_weights: Callable[[torch.nn.Module], None] | None,
) -> Engine:
    """The DeepSpeed engine: stages split by `recorded_costs` (a checkpoint's) or by timing the layers on a
    typical micro-batch, `init_weights` loaded into each rank's part before DeepSpeed starts. Its lr is set
    before every step from the run's length (app/training/run_length.py)."""
    phase_clock.mark("plan")
    cfg, layout = plan.cfg, plan.layout
    lengths = plan.data.store("train").lengths
    timing_len = max(8, int(np.median(lengths)))
    timing_batch = cfg.tokens_per_micro_batch // timing_len or layout.micro_batch
    ds_config = engine_config(plan.ds_json, layout)
    if load_universal:
        ds_config["checkpoint"] = {**ds_config.get("checkpoint", {}), "load_universal": True}
    engine = Engine(
        plan.model_cfg,
        layout,
        ds_config,
        seed=cfg.seed,
        partition_method=cfg.partition_method,
        layer_costs=recorded_costs,
        timing_shape=(max(1, timing_batch), timing_len),
        init_weights=init_weights,
    )
    phase_clock.mark("deepspeed initialised")
    return engine


def init_source_of(path: str, model_cfg: ModelConfig, data: RunData):
    """--init-from PATH opened and checked against this run's model and --data's tokenizer (one line if it
    does not fit)."""
    return open_init_source(path, model_cfg, data.tokenizer, data.prepared.tokenizer_path)


def warm_start(init_source, plan: RunPlan, info: Info) -> Callable[[torch.nn.Module], None] | None:
    """--init-from on a fresh run: the weights every rank loads into its part before DeepSpeed starts (opened
    here when the Trainer skipped it for a resume and no intact checkpoint was found after all)."""
    if init_source is None and plan.cfg.init_from:
        init_source = init_source_of(plan.cfg.init_from, plan.model_cfg, plan.data)
    if init_source is None:
        return None
    info(f"weights from {init_source.describe()}; fresh optimizer, schedule and step count")
    return load_into(init_source.state_dict())


def count_parameters(engine: Engine, data_parallel: int) -> int:
    # Stages hold disjoint layers and replicas identical ones; ZeRO-3 keeps the true size in ds_numel.
    local = sum(getattr(p, "ds_numel", p.numel()) for p in engine.module.parameters())
    counted = torch.tensor(float(local), device=engine.device)
    dist.all_reduce(counted)
    return int(counted.item()) // data_parallel


def resume_from(
    engine: Engine,
    root: Path,
    tag: str,
    saved: dict,
    *,
    rank: int,
    re_sliced: bool,
    carried: list[RecurrentLayer] | None,
    init_from: str | None,
    info: Info,
) -> TrainState:
    """Load checkpoint `tag` (its per-parameter copy when `re_sliced` for another layout, removed once every
    rank has loaded it) into the engine, this rank's RNG streams and carried state -> the state the run
    continues from."""
    where = universal.universal_dir(root, tag).parent if re_sliced else root
    with weights_only_loads():  # DeepSpeed asks torch.load for weights_only=False: refused here
        engine.ds.load_checkpoint(str(where), tag=tag)
    if (root / tag / f"rng_rank{rank}.json").exists():  # a rank the writing layout had
        ckpt.set_rng_state(ckpt.read_rank_state(root / tag, rank))
    if carried is not None and (re_sliced or not carry_state.load(carried, root / tag, rank, engine.device)):
        info(f"--carry-state: no carried state in {tag} for this layout; every stream restarts from zero")
    state = TrainState.resumed(saved)
    info(
        f"resumed from {root / tag} at step {state.step} ({state.train_seconds:.0f} s of training before)"
        + (f"; written as {universal.describe(saved['layout'])}, re-sliced for this one" if re_sliced else "")
        + ("; --init-from ignored (it starts a run, this one resumes)" if init_from else "")
    )
    if re_sliced:  # loaded on every rank: the per-parameter copy has done its work
        dist.barrier()
        if rank == 0:
            shutil.rmtree(universal.universal_dir(root, tag).parent, ignore_errors=True)
    return state


def measure_peak(plan: RunPlan, engine: Engine) -> tuple[float, str]:
    """Every rank: the whole world's peak for the training dtype, and the line saying which (peak_flops)."""
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(plan.layout.precision, torch.float32)
    return world_peak(dtype, engine.device, plan.world)


def start_tracking(
    plan: RunPlan,
    resolved: dict,
    state: TrainState,
    peak: tuple[float, str],
    rewind_to: int | None,
    log: logging.Logger,
) -> tuple[Tracker, StepLogger]:
    """Rank 0: the tracker (metrics.jsonl, W&B continuing the run's id, which `state` records) and the
    per-step metrics line, whose MFU divides by `peak` (the world's, from `measure_peak`)."""
    cfg, run_dir = plan.cfg, Path(plan.cfg.out)
    tracker = Tracker(
        run_dir,
        project=cfg.wandb_project,
        mode=resolve_wandb_mode(cfg.wandb_mode),
        name=cfg.wandb_run_name or run_dir.name,
        config=resolved,
        resume_id=state.wandb_id or recorded_run_id(run_dir),  # a crash before any save too
        rewind_to=rewind_to,
        system_metrics=cfg.wandb_system_metrics,
    )
    state.wandb_id = tracker.run_id
    peak, peak_line = peak
    log.info(peak_line)
    metrics = StepLogger(
        tracker,
        log,
        flops_per_token=flops_per_token(plan.model_cfg),
        peak_flops=peak,
        total_steps=plan.total_steps,
        steps_per_epoch=plan.steps_per_epoch,
        log_every=cfg.log_every,
        progress=cfg.progress,
        initial_step=state.step,
        schedule_line=plan.length.schedule_line,
    )
    return tracker, metrics
