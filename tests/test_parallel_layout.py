"""Batch/parallel arithmetic cross-checks and every shipped DeepSpeed config."""

import json
from pathlib import Path

import pytest

from app.common.errors import UserError
from app.parallel.layout import apply_settings, engine_config, load_ds_json, resolve_layout

ROOT = Path(__file__).resolve().parents[1]
OPT = {"type": "AdamW", "params": {"lr": 1e-3}}


def test_fills_grad_accum_from_train_batch():
    lay = resolve_layout(
        {"train_batch_size": 64, "train_micro_batch_size_per_gpu": 4, "optimizer": OPT}, 4, 2
    )
    assert (lay.data_parallel, lay.grad_accum, lay.train_batch) == (2, 8, 64)


def test_inconsistent_batch_names_every_number():
    cfg = {
        "train_batch_size": 60,
        "train_micro_batch_size_per_gpu": 4,
        "gradient_accumulation_steps": 8,
        "optimizer": OPT,
    }
    with pytest.raises(UserError) as e:
        resolve_layout(cfg, 4, 2)
    msg = str(e.value)
    for number in ("60", "4", "8", "2", "64"):
        assert number in msg


def test_stages_must_divide_world():
    with pytest.raises(UserError, match="does not divide the world size 4"):
        resolve_layout({"train_micro_batch_size_per_gpu": 1, "optimizer": OPT}, 4, 3)


@pytest.mark.parametrize("stage", [2, 3])
def test_zero_2_3_refused_with_pipeline(stage):
    cfg = {"train_micro_batch_size_per_gpu": 1, "optimizer": OPT, "zero_optimization": {"stage": stage}}
    with pytest.raises(UserError, match=f"ZeRO stage {stage} cannot be combined"):
        resolve_layout(cfg, 2, 2)
    assert resolve_layout(cfg, 2, 1).zero_stage == stage


def test_bad_json_names_file_and_line(tmp_path):
    p = tmp_path / "x.json"
    p.write_text('{\n  "a": 1,\n  oops\n}')
    with pytest.raises(UserError, match=r"x.json:3:"):
        load_ds_json(str(p))


@pytest.mark.parametrize("path", sorted((ROOT / "ds_configs").glob("*.json")), ids=lambda p: p.name)
def test_shipped_configs_validate(path):
    cfg = load_ds_json(str(path))
    stages = 1 if "zero2" in path.name or "zero3" in path.name else 2
    if "pp4" in path.name:
        stages = 4
    world = stages * 2
    lay = resolve_layout(cfg, world, stages, src=path.name)
    assert lay.train_batch == lay.micro_batch * lay.grad_accum * lay.data_parallel
    out = engine_config(cfg, lay)
    assert out["train_batch_size"] == lay.train_batch
    json.dumps(out)
    if path.name.startswith("gpu_"):
        assert lay.precision == "bf16"
        # fp32 gradient accumulation: with it DeepSpeed 0.19.8 takes BF16_Optimizer for bf16 + ZeRO-1 (the
        # one that works with its PipelineEngine; DeepSpeedZeroOptimizer there lacks clear_lp_grads, DeepSpeed
        # issue 1835), and ZeRO-2/3 accumulate in separate fp32 buffers (engine._do_optimizer_sanity_check)
        assert out["data_types"] == {"grad_accum_dtype": "fp32"}
    if "offload" in path.name:
        assert out["zero_optimization"]["offload_optimizer"]["device"] == "cpu"


MB, GA, TB = "train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "train_batch_size"


@pytest.mark.parametrize(
    "json_keys, given, want",  # want: (micro, accum, global) at world 4, P 2 (dp 2)
    [
        ({MB: 8, GA: 4, TB: 64}, dict(micro_batch=4), (4, 4, 32)),  # the JSON's accumulation kept
        ({MB: 8, TB: 64}, dict(micro_batch=4), (4, 8, 64)),  # no accumulation key: its global batch kept
        ({MB: 8, GA: 4}, dict(global_batch=32), (8, 2, 32)),
        ({TB: 64, GA: 2}, dict(global_batch=32), (8, 2, 32)),
        ({MB: 8, GA: 4}, dict(grad_accum=1, global_batch=32), (16, 1, 32)),
        ({MB: 8, GA: 4}, dict(micro_batch=2, grad_accum=2, global_batch=8), (2, 2, 8)),
    ],
)
def test_batch_settings_replace_the_json_keys_and_fill_from_it(json_keys, given, want):
    cfg = {**json_keys, "optimizer": OPT}
    out = apply_settings(cfg, **given)
    lay = resolve_layout(out, 4, 2)
    assert (lay.micro_batch, lay.grad_accum, lay.train_batch) == want
    assert cfg == {**json_keys, "optimizer": OPT}, "the caller's dict must not change"


def test_lr_and_precision_settings():
    cfg = {MB: 1, "optimizer": OPT, "fp16": {"enabled": True, "loss_scale": 0}}
    out = apply_settings(cfg, lr=5e-4, precision="bf16")
    assert out["optimizer"]["params"]["lr"] == 5e-4 and OPT["params"]["lr"] == 1e-3
    assert out["bf16"] == {"enabled": True} and out["fp16"] == {"enabled": False, "loss_scale": 0}
    assert resolve_layout(out, 1, 1).precision == "bf16"
    assert resolve_layout(apply_settings(out, precision="fp32"), 1, 1).precision == "fp32"
    with pytest.raises(UserError, match="--lr: the DeepSpeed config needs an `optimizer` section"):
        apply_settings({MB: 1}, lr=1e-3)
