"""Read the DeepSpeed JSON and cross-check it against the app config and the world size.

Every inconsistency is a `UserError` that names the key or flag and prints the numbers involved.
"""

from __future__ import annotations

import copy
import json
import typing
from dataclasses import dataclass
from typing import Literal

from app.common.errors import UserError
from app.common.files import read_json_object
from app.parallel.ds_configs import resolve_ds_config

Precision = Literal["fp32", "bf16", "fp16"]
PRECISIONS: tuple[str, ...] = typing.get_args(Precision)
MICRO, ACCUM, GLOBAL = "train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "train_batch_size"


@dataclass(frozen=True, slots=True)
class DeepSpeedJson:
    """A DeepSpeed config and how errors name where it came from (`--deepspeed_config X`, a --config file)."""

    data: dict
    source: str


@dataclass(frozen=True, slots=True)
class Layout:
    """How the world is split: `stages * data_parallel == world_size`, and the batch arithmetic."""

    world_size: int
    stages: int
    data_parallel: int
    micro_batch: int
    grad_accum: int
    zero_stage: int
    precision: str  # fp32 | bf16 | fp16

    @property
    def train_batch(self) -> int:
        return self.micro_batch * self.grad_accum * self.data_parallel

    def as_dict(self) -> dict:
        """The fields, as recorded in a checkpoint's config and compared on resume."""
        return {f: getattr(self, f) for f in self.__slots__}


def load_ds_json(path: str | None, flag: str = "--deepspeed_config") -> dict:
    if not path:
        raise UserError(
            "--deepspeed_config is required (e.g. ds_configs/cpu_pp2_zero1.json; also --deepspeed FILE, "
            "or `deepspeed:` in --config)"
        )
    return read_json_object(resolve_ds_config(path, flag), flag)


def apply_settings(
    cfg: dict,
    *,
    lr: float | None = None,
    micro_batch: int | None = None,
    grad_accum: int | None = None,
    global_batch: int | None = None,
    precision: str | None = None,
) -> dict:
    """The DeepSpeed dict with the app's settings written in (a copy; None leaves a key as it is).

    Batch: the keys given win; of the DeepSpeed dict's own batch keys only as many are kept, in the order
    micro-batch, accumulation, global batch, as leave one of the three to derive (`resolve_layout`), so
    `--micro-batch 4` alone keeps the accumulation steps and `--global-batch 64` alone keeps the micro-batch.
    """
    out = copy.deepcopy(cfg)
    pairs = ((MICRO, micro_batch), (ACCUM, grad_accum), (GLOBAL, global_batch))
    given = {k: v for k, v in pairs if v is not None}
    if given:
        kept = dict(given)
        for key in (MICRO, ACCUM, GLOBAL):
            if len(kept) >= 2:
                break
            if key not in kept and out.get(key) not in (None, "auto"):
                kept[key] = out[key]
        for key in (MICRO, ACCUM, GLOBAL):
            out.pop(key, None)
        out.update({k: kept[k] for k in (MICRO, ACCUM, GLOBAL) if k in kept})
    if lr is not None:
        opt = out.get("optimizer")
        if not isinstance(opt, dict) or not isinstance(opt.get("params", {}), dict):
            raise UserError("--lr: the DeepSpeed config needs an `optimizer` section (e.g. AdamW) to take it")
        opt.setdefault("params", {})["lr"] = lr
    if precision is not None:
        for key in ("bf16", "fp16"):
            want = precision == key
            if want or isinstance(out.get(key), dict):
                section = out.get(key) if isinstance(out.get(key), dict) else {}
                out[key] = {**section, "enabled": want}
    return out


def stated_settings(cfg: dict) -> dict:
    """What a DeepSpeed dict itself says of the app's settings (only the keys it states, not "auto";
    precision only where it has a bf16 or fp16 section)."""
    out: dict = {}
    for key, name in ((MICRO, "micro_batch"), (ACCUM, "grad_accum"), (GLOBAL, "global_batch")):
        if isinstance(cfg.get(key), int):
            out[name] = cfg[key]
    opt = cfg.get("optimizer")
    if (
        isinstance(opt, dict)
        and isinstance(opt.get("params"), dict)
        and opt["params"].get("lr", "auto") != "auto"
    ):
        out["lr"] = opt["params"]["lr"]
    sections = [k for k in ("bf16", "fp16") if isinstance(cfg.get(k), dict)]
    if any(cfg[k].get("enabled") == "auto" for k in sections):
        sections = []  # "auto": the precision flag decides (app/training/ds_adopt.py)
    on = [k for k in sections if cfg[k].get("enabled") is True]
    if sections:  # no section at all states nothing (fp32 by default)
        out["precision"] = on[0] if len(on) == 1 else "fp32" if not on else None
    return {k: v for k, v in out.items() if v is not None}


def optimizer_lr(cfg: dict) -> float | None:
    """The peak learning rate the DeepSpeed dict gives its optimizer."""
    return stated_settings(cfg).get("lr")


def is_partition_method(method: str) -> bool:
    """DeepSpeed's "parameters", "uniform", "type:<regex>", and our FLOP-balanced "cost"."""
    m = method.lower()
    return m in ("cost", "parameters", "uniform") or m.startswith("type:")


def _int_key(cfg: dict, key: str, src: str) -> int | None:
    v = cfg.get(key)
    if v is None or v == "auto":
        return None
    if not isinstance(v, int) or isinstance(v, bool) or v < 1:
        raise UserError(f"{src}: `{key}` must be a positive integer, got {v!r}")
    return v


_EXAMPLES = {
    "bf16": '{"enabled": true}',
    "fp16": '{"enabled": true}',
    "zero_optimization": '{"stage": 1}',
    "optimizer": '{"type": "AdamW", "params": {"lr": 0.001}}',
}


def _section(cfg: dict, key: str, src: str) -> dict:
    """A sub-object of the DeepSpeed JSON (`{}` when absent); any other type is one line naming the key."""
    v = cfg.get(key, {})
    if not isinstance(v, dict):
        raise UserError(
            f"{src}: `{key}` must be a JSON object such as {_EXAMPLES.get(key, '{...}')}, got {json.dumps(v)}"
        )
    return v


def resolve_layout(
    cfg: dict, world_size: int, stages: int, src: str = "deepspeed config", *, training: bool = True
) -> Layout:
    """Check the batch/parallel arithmetic; fill in whichever batch key is missing.

    `training=False` (evaluation) needs no optimizer section."""
    if stages < 1 or world_size % stages:
        raise UserError(
            f"--pipeline-stages {stages} does not divide the world size {world_size}: "
            f"stages * data_parallel must equal world_size"
        )
    dp = world_size // stages
    tb = _int_key(cfg, GLOBAL, src)
    mb = _int_key(cfg, MICRO, src)
    ga = _int_key(cfg, ACCUM, src)
    if mb is None and tb is None:
        raise UserError(
            f"{src}: set `train_micro_batch_size_per_gpu` (or --micro-batch), and optionally `train_batch_size`"
        )
    if ga is None:
        if tb is None:
            ga = 1
        elif mb is None:
            raise UserError(f"{src}: with `train_batch_size` set, also set `train_micro_batch_size_per_gpu`")
        elif tb % (mb * dp):
            raise UserError(
                f"{src}: train_batch_size {tb} is not a multiple of micro_batch {mb} * data_parallel {dp} "
                f"(world_size {world_size} / pipeline_stages {stages})"
            )
        else:
            ga = tb // (mb * dp)
    if mb is None:
        assert tb is not None
        if tb % (ga * dp):
            raise UserError(
                f"{src}: train_batch_size {tb} is not a multiple of grad_accum {ga} * data_parallel {dp}"
            )
        mb = tb // (ga * dp)
    if tb is not None and tb != mb * ga * dp:
        raise UserError(
            f"{src}: train_batch_size {tb} != micro_batch {mb} * gradient_accumulation_steps {ga} * "
            f"data_parallel {dp} (= world_size {world_size} / pipeline_stages {stages}) = {mb * ga * dp}"
        )

    zero = _section(cfg, "zero_optimization", src).get("stage", 0)
    if zero not in (0, 1, 2, 3) or isinstance(zero, bool):
        raise UserError(f"{src}: zero_optimization.stage must be 0-3, got {zero!r}")
    if stages > 1 and zero >= 2:
        raise UserError(
            f"{src}: ZeRO stage {zero} cannot be combined with pipeline parallelism (--pipeline-stages {stages}): "
            f"use --pipeline-stages 1 with ZeRO-{zero}, or ZeRO-1 with pipeline stages"
        )
    bf16 = _enabled(cfg, "bf16", src)
    fp16 = _enabled(cfg, "fp16", src)
    if bf16 and fp16:
        raise UserError(f"{src}: enable at most one of `bf16` and `fp16`")
    if "optimizer" in cfg and training:
        _section(cfg, "optimizer", src)
    opt = cfg.get("optimizer")
    if training and (not isinstance(opt, dict) or "lr" not in opt.get("params", {})):
        raise UserError(f"{src}: an `optimizer` section with `params.lr` is required (e.g. AdamW)")
    return Layout(
        world_size=world_size,
        stages=stages,
        data_parallel=dp,
        micro_batch=mb,
        grad_accum=ga,
        zero_stage=zero,
        precision="bf16" if bf16 else "fp16" if fp16 else "fp32",
    )


def check_stages_fit(stages: int, num_layers: int, model_flag: str) -> None:
    """Every pipeline stage needs at least one of the model's layer specs (embedding, num_layers recurrent
    layers, head): more stages than specs is one line naming both flags and the fixes."""
    specs = num_layers + 2
    if stages > specs:
        raise UserError(
            f"--pipeline-stages {stages} needs at least {stages} layer specs, but {model_flag} has {specs} "
            f"(embedding, {num_layers} recurrent layer{'s' if num_layers > 1 else ''}, head): use "
            f"--pipeline-stages {specs} or fewer, or model.num_layers={stages - 2} or more"
        )


def _enabled(cfg: dict, key: str, src: str) -> bool:
    v = _section(cfg, key, src).get("enabled", False)
    if not isinstance(v, bool):
        raise UserError(f"{src}: `{key}.enabled` must be true or false, got {v!r}")
    return v


def engine_config(cfg: dict, layout: Layout) -> dict:
    """The dict handed to deepspeed.initialize: the batch keys made explicit, DeepSpeed's own step log off."""
    out = dict(cfg)
    out["train_batch_size"] = layout.train_batch
    out["train_micro_batch_size_per_gpu"] = layout.micro_batch
    out["gradient_accumulation_steps"] = layout.grad_accum
    # The app prints its own compact metrics line; DeepSpeed's per-N-step print would duplicate it.
    out.setdefault("steps_per_print", 10**9)
    return out


def inference_layout(world_size: int, stages: int, micro_batch: int) -> tuple[Layout, dict]:
    """Evaluation's layout and DeepSpeed dict, through the same checks as training's (fp32, ZeRO-0)."""
    ds = {
        "train_micro_batch_size_per_gpu": micro_batch,
        # enough micro-batches in flight to keep every stage busy
        "gradient_accumulation_steps": 2 * stages if stages > 1 else 1,
        "zero_optimization": {"stage": 0},
    }
    layout = resolve_layout(ds, world_size, stages, src="evaluation", training=False)
    return layout, engine_config(ds, layout)
