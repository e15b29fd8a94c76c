"""A DeepSpeed config written for HF's Trainer: "auto" values filled from our flags, a `scheduler` section
mapped onto our schedule, conflicts and the schedulers we cannot honour one line each (plan level, and
one real launch that must repeat the reference run's losses)."""

from __future__ import annotations

import json

import pytest
from conftest import REF_STEPS
from launcher import train_losses
from runs import HF_CONFIG, HF_FLAGS

from app.common.errors import UserError
from app.parallel.layout import engine_config
from app.train import parse_args
from app.training.plan import open_inputs, plan_run

FLAGS = list(
    HF_FLAGS
)  # HF_CONFIG (tests/runs.py): the stock cpu_pp2_zero1.json with "auto" where HF fills one


def write(tmp_path, cfg: dict, name: str = "hf.json") -> str:
    path = tmp_path / name
    path.write_text(json.dumps(cfg))
    return str(path)


def parse(prepared_dir, ds_path: str, *flags: str):
    return parse_args(
        ["--deepspeed", ds_path, "--data", str(prepared_dir), "--model-config", "debug", *flags]
    )


def plan(prepared_dir, ds_path: str, *flags: str):
    args = parse(prepared_dir, ds_path, *flags)
    data, model_cfg = open_inputs(args.cfg, args.model_overrides)
    return plan_run(args.cfg, args.deepspeed, data, model_cfg, 2), args.notes


def test_auto_values_are_filled_from_the_flags(prepared_dir, tmp_path):
    p, notes = plan(prepared_dir, write(tmp_path, HF_CONFIG), *FLAGS, "--pipeline-stages", "2")
    ds = engine_config(p.ds_json, p.layout)
    assert "auto" not in json.dumps(ds) and "scheduler" not in ds
    assert (ds["train_micro_batch_size_per_gpu"], ds["gradient_accumulation_steps"], ds["train_batch_size"]) == (
        8, 4, 32,
    )  # fmt: skip
    assert ds["optimizer"]["params"] == {
        "lr": 0.003, "betas": [0.9, 0.99], "eps": 1e-8, "weight_decay": 0.0, "torch_adam": True,
    }  # fmt: skip
    assert ds["gradient_clipping"] == 1.0 and ds["bf16"] == {"enabled": False}
    assert ds["zero_optimization"] == {"stage": 1}
    assert (p.cfg.lr_decay, p.cfg.min_lr_ratio, p.cfg.warmup_steps) == ("cosine", 0.1, 100)
    assert any('"auto" filled' in n for n in notes) and any("WarmupCosineLR runs as" in n for n in notes)
    with_bf16, _ = plan(prepared_dir, write(tmp_path, HF_CONFIG), *FLAGS, "--precision", "bf16")
    assert with_bf16.ds_json["bf16"] == {"enabled": True} and with_bf16.layout.precision == "bf16"


@pytest.mark.parametrize(
    "scheduler, flags, want",  # want: (warmup_steps, lr_decay, min_lr_ratio, max_steps, lr)
    [
        ({"type": "WarmupLR", "params": {"warmup_num_steps": 5, "warmup_type": "linear"}}, [],
         (5, "constant", 0.1, None, 0.003)),
        ({"type": "WarmupDecayLR", "params": {"warmup_num_steps": 3, "total_num_steps": 40, "warmup_max_lr": 0.01}},
         [], (3, "linear", 0.0, 40, 0.01)),
        ({"type": "WarmupCosineLR", "params": {"warmup_num_steps": "auto", "total_num_steps": 40}},
         ["--warmup-steps", "7", "--max-steps", "40"], (7, "cosine", 1e-4, 40, 0.003)),
    ],
)  # fmt: skip
def test_a_scheduler_section_becomes_our_schedule(prepared_dir, tmp_path, scheduler, flags, want):
    cfg = {**HF_CONFIG, "scheduler": scheduler}
    lr = [] if "warmup_max_lr" in scheduler["params"] else ["--lr", "0.003"]  # the section's lr, or the flag
    c = parse(prepared_dir, write(tmp_path, cfg), "--micro-batch", "8", *lr, *flags).cfg
    assert (c.warmup_steps, c.lr_decay, c.min_lr_ratio, c.max_steps, c.lr) == pytest.approx(want)


@pytest.mark.parametrize(
    "change, flags, needle",
    [
        ({"scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 5}}}, [*FLAGS, "--warmup-steps", "3"],
         "the scheduler section's warmup_num_steps 5 disagrees with --warmup-steps 3"),
        ({"scheduler": {"type": "WarmupLR", "params": {}}}, [*FLAGS, "--lr-decay", "cosine"],
         "the scheduler section's type 'constant' disagrees with --lr-decay 'cosine'"),
        ({"scheduler": {"type": "WarmupDecayLR", "params": {"total_num_steps": 40}}}, [*FLAGS, "--epochs", "2"],
         "total_num_steps 40 disagrees with --epochs 2"),
        ({"scheduler": {"type": "OneCycle", "params": {}}}, FLAGS, "scheduler OneCycle has no counterpart"),
        ({"scheduler": {"type": "WarmupLR", "params": {"warmup_type": "log"}}}, FLAGS, "our warmup is linear"),
        ({"scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 1e-4}}}, FLAGS, "set warmup_min_lr to 0"),
        ({"optimizer": {"type": "AdamW", "params": {"lr": "auto"}}}, ["--micro-batch", "8"],
         'optimizer.params.lr` is "auto": give the peak learning rate with --lr'),
        ({"activation_checkpointing": {"number_checkpoints": "auto"}}, FLAGS,
         '`activation_checkpointing.number_checkpoints` is "auto", which has no setting of ours'),
    ],
)  # fmt: skip
def test_conflicts_and_what_we_cannot_honour_are_one_line(prepared_dir, tmp_path, change, flags, needle):
    path = write(tmp_path, {**HF_CONFIG, **change})
    with pytest.raises(UserError) as e:
        parse(prepared_dir, path, *flags)
    msg = str(e.value)
    assert "\n" not in msg and needle in msg and msg.startswith(f"--deepspeed {path}:"), msg


def test_auto_values_in_a_config_file_deepspeed_section(prepared_dir, tmp_path):
    """`deepspeed:` as the mapping itself, beside the file's own lr and batch: "auto" is no disagreement."""
    f = tmp_path / "run.yaml"
    f.write_text(json.dumps({"deepspeed": HF_CONFIG, "lr": 0.003, "micro_batch": 8, "grad_accum": 4}))
    args = parse_args(["--config", str(f), "--data", str(prepared_dir), "--model-config", "debug"])
    assert args.deepspeed.data["optimizer"]["params"]["lr"] == 0.003 and args.cfg.lr_decay == "cosine"


# `long`: a launch (tests/runs.py's "hf_auto") for what the plan-level tests above check in this process (every
# "auto" value filled, the scheduler mapped); what only it runs is the auto config through DeepSpeed to ref's losses
@pytest.mark.long
@pytest.mark.slow
def test_hf_auto_config_trains_as_the_reference_run(reference_run, runs):
    """One real launch with the "auto" config and flags equal to the stock file (tests/runs.py's "hf_auto"):
    the reference's losses."""
    out = runs.get("hf_auto").dir
    ref, got = train_losses(reference_run[0]), train_losses(out)
    assert got.keys() == ref.keys() and len(got) == int(REF_STEPS)
    for s in ref:
        assert got[s] == pytest.approx(ref[s], rel=2e-5, abs=2e-5), s
