"""The run plan: the app's lr, batch and precision written into the DeepSpeed config DeepSpeed is given
(from flags and from a config file), cross-checked, recorded; a run's config.json fed back reproduces it."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest

from app.common.errors import UserError
from app.parallel.layout import engine_config
from app.train import parse_args
from app.training.plan import open_inputs, plan_run

ROOT = Path(__file__).resolve().parents[1]
DS = str(ROOT / "ds_configs" / "cpu_pp2_zero1.json")  # micro 8 x accum 4, lr 0.003, fp32


def plan(argv: list[str], world: int = 2):
    args = parse_args(argv)
    data, model_cfg = open_inputs(args.cfg, args.model_overrides)
    return plan_run(args.cfg, args.deepspeed, data, model_cfg, world)


def given_to_deepspeed(p) -> dict:
    """The dict the engine hands to deepspeed.initialize (Trainer._build_engine)."""
    return engine_config(p.ds_json, p.layout)


@pytest.mark.parametrize(
    "settings, world, want",  # want: (lr, micro, accum, global, precision)
    [
        ([], 2, (0.003, 8, 4, 32, "fp32")),
        (["--lr", "1e-3"], 2, (1e-3, 8, 4, 32, "fp32")),
        (["--micro-batch", "4"], 2, (0.003, 4, 4, 16, "fp32")),  # accumulation kept
        (["--global-batch", "64"], 2, (0.003, 8, 8, 64, "fp32")),  # micro-batch kept
        (["--global-batch", "64", "--grad-accum", "2"], 2, (0.003, 32, 2, 64, "fp32")),
        (["--grad-accum", "1"], 4, (0.003, 8, 1, 16, "fp32")),  # dp 2
        (["--precision", "bf16"], 2, (0.003, 8, 4, 32, "bf16")),
    ],
)
def test_settings_from_flags_and_file_reach_deepspeed(prepared_dir, tmp_path, settings, world, want):
    base = ["--data", str(prepared_dir), "--pipeline-stages", "2", "--model-config", "debug"]
    from_flags = plan(["--deepspeed_config", DS, *base, *settings], world)
    # the same settings from a config file
    f = tmp_path / "run.yaml"
    pairs = dict(zip(settings[::2], settings[1::2]))
    f.write_text(
        f"deepspeed: {DS}\n" + "".join(f"{k[2:].replace('-', '_')}: {v}\n" for k, v in pairs.items())
    )
    from_file = plan(["--config", str(f), *base], world)
    for p in (from_flags, from_file):
        ds = given_to_deepspeed(p)
        lr, micro, accum, glob, precision = want
        assert ds["optimizer"]["params"]["lr"] == pytest.approx(lr)
        assert (ds["train_micro_batch_size_per_gpu"], ds["gradient_accumulation_steps"]) == (micro, accum)
        assert ds["train_batch_size"] == glob == micro * accum * world // 2
        assert ds.get("bf16", {}).get("enabled", False) is (precision == "bf16")
        assert p.layout.precision == precision
        # recorded: the train section states the values in force, the deepspeed section what DeepSpeed got
        r = p.resolved(threads=1)
        t = r["train"]
        assert (
            t["lr"],
            t["micro_batch"],
            t["grad_accum"],
            t["global_batch"],
            t["precision"],
        ) == pytest.approx(want)
        assert r["deepspeed"] == ds


@pytest.mark.parametrize(
    "settings, needle",
    [
        (
            ["--global-batch", "30"],
            "with global_batch=30: train_batch_size 30 is not a multiple of micro_batch 8",
        ),
        (
            ["--micro-batch", "2", "--grad-accum", "3", "--global-batch", "7"],
            "train_batch_size 7 != micro_batch 2 * gradient_accumulation_steps 3 * data_parallel 1",
        ),
    ],
)
def test_batch_identity_is_checked_on_the_settings(prepared_dir, settings, needle):
    with pytest.raises(UserError, match=re.escape(needle)):
        plan(["--deepspeed_config", DS, "--data", str(prepared_dir), "--pipeline-stages", "2", *settings])


def test_run_config_json_round_trip_reproduces_the_resolved_config(reference_run):
    """The reference run's config.json as --config (nothing else): the same resolved config, for the same
    world size; what only a started run knows (the measured stage split, the code it ran) is left out."""
    out, _ = reference_run
    saved = json.loads((out / "config.json").read_text())
    args = parse_args(["--config", str(out / "config.json")])
    assert args.notes and "layout" in args.notes[0]  # recorded results are reported as ignored
    data, model_cfg = open_inputs(args.cfg, args.model_overrides)
    p = plan_run(args.cfg, args.deepspeed, data, model_cfg, world=saved["world_size"])
    got = json.loads(json.dumps(p.resolved(threads=saved["threads_per_process"]), default=str))
    expected = {k: v for k, v in saved.items() if k not in ("layer_costs", "partition", "code")}
    assert got == expected
    # and a flag on top changes only what it names (the file's deepspeed section follows the flag)
    args = parse_args(["--config", str(out / "config.json"), "--lr", "0.01", "--max-steps", "3"])
    p = plan_run(args.cfg, args.deepspeed, *open_inputs(args.cfg, args.model_overrides), world=2)
    r = p.resolved(threads=1)
    assert r["deepspeed"]["optimizer"]["params"]["lr"] == r["train"]["lr"] == 0.01
    assert r["train"]["max_steps"] == 3 and r["model"] == saved["model"]


def test_more_pipeline_stages_than_layer_specs_is_one_line(prepared_dir):
    """The `large` preset has one recurrent layer, i.e. 3 layer specs: 4 stages cannot hold them."""
    argv = ["--deepspeed_config", DS, "--data", str(prepared_dir), "--pipeline-stages", "4"]
    with pytest.raises(UserError) as e:
        plan([*argv, "--model-config", "debug", "model.num_layers=1"], world=4)
    assert str(e.value) == (
        "--pipeline-stages 4 needs at least 4 layer specs, but --model-config debug has 3 (embedding, "
        "1 recurrent layer, head): use --pipeline-stages 3 or fewer, or model.num_layers=2 or more"
    )
    assert plan([*argv, "--model-config", "debug"], world=4).layout.stages == 4  # 4 specs: one a stage


def test_the_resolve_step_caps_in_one_place_and_freezes_what_it_makes(prepared_dir):
    """Every cap (the waits, the counts the data can use) in plan_run, each in one line, and the config it
    makes frozen: the train loop reads it, never writes it. The config given is left as given."""
    argv = ["--deepspeed_config", DS, "--data", str(prepared_dir), "--pipeline-stages", "2", "--model-config",
            "debug", "--dist-timeout-s", "1e15", "--eval-max-batches", "1000"]  # fmt: skip
    args = parse_args(argv)
    warned: list[str] = []
    p = plan_run(args.cfg, args.deepspeed, *open_inputs(args.cfg, args.model_overrides), 2, warned.append)
    batches = p.data.schedule("validation").steps_per_epoch
    assert (p.cfg.dist_timeout_s, p.cfg.eval_max_batches) == (86400.0, batches)
    assert warned[0].startswith("--dist-timeout-s 1000000000000000.0 capped at 86400.0: ")
    assert warned[1].startswith(f"--eval-max-batches 1000 capped at {batches}: ")
    assert (args.cfg.dist_timeout_s, args.cfg.eval_max_batches) == (1e15, 1000)
    assert (p.cfg.warmup_steps, p.cfg.eval_every, p.cfg.save_every) == (100, 200, 500)  # the step defaults
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.cfg.eval_every = 7
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.cfg = args.cfg


def test_a_json_under_which_deepspeed_would_apply_a_nan_step_is_one_line(prepared_dir, tmp_path):
    """bf16 with `check_grad_overflow: false`: DeepSpeed's ZeRO optimizer would apply a step whose gradients
    are NaN (a GPU loop whose barrier gave up leaves NaN in its step: app/model/gpu_health.py), so start-up
    refuses it in one line naming the setting (tests/test_parallel_precision.py runs the engine on it)."""
    cfg = json.loads((ROOT / "ds_configs" / "gpu_bf16_zero2.json").read_text())
    cfg["bf16"]["check_grad_overflow"] = False
    (tmp_path / "c.json").write_text(json.dumps(cfg))
    argv = [
        "--deepspeed_config",
        str(tmp_path / "c.json"),
        "--data",
        str(prepared_dir),
        "--pipeline-stages",
        "1",
    ]
    with pytest.raises(
        UserError, match=r"bf16\.check_grad_overflow is false: DeepSpeed's ZeRO optimizer then"
    ):
        plan(argv, world=1)
    cfg["bf16"].pop("check_grad_overflow")
    (tmp_path / "c.json").write_text(json.dumps(cfg))
    assert plan(argv, world=1).layout.precision == "bf16"
