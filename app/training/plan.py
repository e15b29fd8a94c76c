"""What a training run will do, decided from its configs and a world size alone: the run's one resolve step.

The app's lr, batch and precision settings are written into the DeepSpeed config here (the one dict
DeepSpeed gets), the batch identity and ZeRO/pipeline limits are checked on the result, every count is
capped at what the data can use (app.training.bounds), the run's length is chosen (app.training.run_length),
and the TrainConfig is made once with the values in force, frozen: the resolved config records them
whichever side set them, and nothing changes it afterwards. No process group, no global state: `--dry-run`
and the tests plan any world in one process.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass

from app.batching.run_data import RunData
from app.checkpoints.dir_kind import check_data_dir
from app.checkpoints.warm_start import init_model_fields, resumed_model_fields
from app.common.errors import UserError
from app.common.redact import redact_secrets
from app.model.config import ModelConfig
from app.model.presets import load_model_config
from app.parallel.layout import (
    DeepSpeedJson,
    Layout,
    apply_settings,
    check_stages_fit,
    engine_config,
    optimizer_lr,
    resolve_layout,
)
from app.parallel.precision import non_finite_update
from app.training import bounds, run_length
from app.training.config import TrainConfig
from app.training.run_length import RunLength


@dataclass(frozen=True, slots=True)
class RunPlan:
    cfg: TrainConfig  # lr, batch, precision, caps and step counts as in force (frozen)
    model_cfg: ModelConfig
    ds_json: dict  # the DeepSpeed config with the app's settings written in
    ds_source: str  # how errors name it
    layout: Layout
    data: RunData
    world: int
    steps_per_epoch: int
    length: RunLength  # when the run stops, its lr, where it validates and saves

    @property
    def total_steps(self) -> int | None:
        """None: only the --time-budget clock stops the run."""
        return self.length.total_steps

    def resolved(self, threads: int) -> dict:
        """The run's resolved config (config.json, checkpoints, W&B); `--config` reads it back."""
        return {
            "train": self.cfg.to_dict(),
            "model": self.model_cfg.to_dict(),
            # what DeepSpeed is given, secrets redacted (it is copied to config.json, checkpoints and W&B)
            "deepspeed": redact_secrets(engine_config(self.ds_json, self.layout)),
            "layout": self.layout.as_dict(),
            "data": self.data.describe(),
            "total_steps": self.total_steps,
            "steps_per_epoch": self.steps_per_epoch,
            # a step-count run's schedule; a budgeted one's is decided after its first steps (checkpoints)
            "schedule": self.length.recorded_schedule(),
            "world_size": self.world,
            "threads_per_process": threads,
        }

    def check_fits(self, prompts: list[str]) -> None:
        """Refuse (one line) a model, micro-batch or samples of `prompts` that cannot fit in memory
        (app.training.bounds): every rank, before any of them exists."""
        bounds.check_run_fits(self.cfg, self.model_cfg, self.layout, self.data, self.ds_json, prompts)

    def describe(self, threads: int) -> str:
        """The start-up line: the layout, the batch identity, ZeRO, precision, lr and the run's length."""
        lay, cfg = self.layout, self.cfg
        length = self.length.describe()
        return (
            f"world {self.world} = {lay.stages} stages x {lay.data_parallel} data-parallel | "
            f"batch {lay.train_batch} = micro {lay.micro_batch} x accum {lay.grad_accum} x dp "
            f"{lay.data_parallel} | ZeRO-{lay.zero_stage} {lay.precision} | lr {cfg.lr:g} | "
            f"{length} ({self.steps_per_epoch}/epoch) | {threads} threads/process"
        )


def open_inputs(
    cfg: TrainConfig, model_overrides: dict, info=lambda msg: None
) -> tuple[RunData, ModelConfig]:
    """--data opened and the model config built (cheap: a bad path fails before any process starts). With
    --init-from and no --model-config, the model it names gives the sizes (`model.x=...` still applies), or,
    when --out holds a checkpoint to resume, that checkpoint (the --init-from source may be gone by then)."""
    check_data_dir(cfg.data)
    data = RunData(cfg.data)
    spec: str | dict | None = cfg.model_config
    if spec is None and cfg.init_from:
        tok = data.prepared.tokenizer_path
        spec, line = resumed_model_fields(cfg.out, cfg.resume) or init_model_fields(
            cfg.init_from, data.tokenizer, tok
        )
        info(line)
    return data, load_model_config(spec, data.tokenizer["vocab_size"], model_overrides)


def plan_run(
    cfg: TrainConfig,
    ds: DeepSpeedJson,
    data: RunData,
    model_cfg: ModelConfig,
    world: int,
    say: Callable[[str], None] | None = None,
    note: Callable[[str], None] | None = None,
) -> RunPlan:
    """The run's one resolve step -> its plan, the config frozen as in force. Settings larger than the data
    can fill and waits past a day are capped (app.training.bounds), each in one line through `say` (rank 0's
    warnings; `note`, its info lines, for a default)."""
    timeout = bounds.cap_timeout(cfg.dist_timeout_s, say)
    ds_json, src, layout = _layout(cfg, ds, model_cfg, world)
    lr = _peak_lr(ds_json, src)
    counts = bounds.split_counts(data, cfg.test_eval)
    layout, tpmb = bounds.cap_batches(cfg, layout, counts, data.prepared.meta["buckets"], ds_json, say)
    data.configure(layout, cfg.seed, tpmb, cfg.carry_state)
    evals = bounds.cap_eval_batches(cfg, data.schedule("validation").steps_per_epoch, say, note)
    steps_per_epoch = data.schedule("train").steps_per_epoch
    length = run_length.for_run(cfg, steps_per_epoch, lr)
    in_force = dataclasses.replace(
        cfg,
        lr=lr,
        micro_batch=layout.micro_batch,
        grad_accum=layout.grad_accum,
        global_batch=layout.train_batch,
        precision=layout.precision,
        tokens_per_micro_batch=tpmb,
        dist_timeout_s=timeout,
        **evals,
        **length.counts(),  # a step count's warmup, validation and save steps (a budget's: decided later)
    )
    return RunPlan(in_force, model_cfg, ds_json, src, layout, data, world, steps_per_epoch, length)


def _layout(
    cfg: TrainConfig, ds: DeepSpeedJson, model_cfg: ModelConfig, world: int
) -> tuple[dict, str, Layout]:
    """The app's settings written into the DeepSpeed config, and the layout it gives on `world` ranks,
    checked -> (the DeepSpeed config, how errors name it, the layout)."""
    settings = {
        name: getattr(cfg, name) for name in ("lr", "micro_batch", "grad_accum", "global_batch", "precision")
    }
    given = {k: v for k, v in settings.items() if v is not None}
    ds_json = apply_settings(ds.data, **given)
    src = ds.source + (f" with {', '.join(f'{k}={v}' for k, v in given.items())}" if given else "")
    layout = resolve_layout(ds_json, world, cfg.pipeline_stages, src=src)
    check_stages_fit(layout.stages, model_cfg.num_layers, f"--model-config {cfg.model_config or 'small'}")
    if layout.zero_stage == 0 and layout.precision != "fp16":
        raise UserError(
            f"{src}: ZeRO stage 0 has no non-finite-gradient check in DeepSpeed for {layout.precision}; "
            f"use stage 1 (the same memory use at data_parallel 1)"
        )
    if (why := non_finite_update(ds_json, layout.precision)) is not None:  # a NaN step must be skipped
        raise UserError(f"{src}: {why}; remove the setting (its default skips the step)")
    return ds_json, src, layout


def _peak_lr(ds_json: dict, src: str) -> float:
    lr = optimizer_lr(ds_json)
    if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not 0 < lr < math.inf:
        raise UserError(f"{src}: optimizer.params.lr must be a positive number, got {lr!r}")
    return float(lr)
