"""TrainConfig validation and app/train.py's command line: flags, --config files, DeepSpeed's arguments."""

import json
import re
from pathlib import Path

import pytest

from app.common.errors import UserError
from app.train import main, parse_args
from app.training.config import TrainConfig

ROOT = Path(__file__).resolve().parents[1]
DS = str(ROOT / "ds_configs" / "cpu_pp2_zero1.json")


def test_help_lists_fields_presets_and_choices(capsys):
    with pytest.raises(SystemExit):
        parse_args(["--help"])
    raw = capsys.readouterr().out
    out = " ".join(raw.split())  # argparse wraps to the terminal's width
    assert "--pipeline-stages" in out and "Pipeline stages P" in out
    assert "--keep-last" in out and "never the one `latest` names" in out
    for preset in ("debug", "small", "medium", "large"):  # with their sizes
        assert f"\n  {preset} " in raw
    assert "small embed_dim=128 hidden_dim=256 num_layers=2" in out
    for needle in (
        "--lr-decay {cosine,linear,constant}",
        "--wandb-mode {online,offline,disabled}",
        "--precision {fp32,bf16,fp16}",
        "time (balance each layer's measured",  # partition methods
        "type:REGEX",
        "model.core {auto,fused,python}",
        "model.cell {mlstm,lstm}",
        "--progress, --no-progress",
        "--deepspeed [FILE]",
        "--config FILE",
    ):
        assert needle in out, needle


def test_flags_and_overrides_are_typed():
    cfg, ds, model_over, dry, _ = parse_args(
        ["--deepspeed_config", DS, "--data", "d", "--max-steps", "7", "model.hidden_dim=48", "warmup_steps=3",
         "train.deterministic=false", "--lr", "3e-4", "--local_rank=1"]
    )  # fmt: skip
    assert (cfg.max_steps, cfg.warmup_steps, cfg.deterministic, cfg.lr, dry) == (7, 3, False, 3e-4, False)
    assert model_over == {"hidden_dim": 48} and ds.data["optimizer"]["type"] == "AdamW"


@pytest.mark.parametrize(
    "flags, want",
    [
        (["--no-progress"], False),
        (["--progress"], True),
        (["--progress", "false"], False),  # the spelling scripts used before --no-x
        (["--progress=no"], False),
        (["--progress", "model.hidden_dim=48"], True),  # a bare flag never swallows an override
        ([], True),
    ],
)
def test_booleans(flags, want):
    args = parse_args(["--deepspeed_config", DS, "--data", "d", *flags])
    assert args.cfg.progress is want
    assert args.model_overrides == ({"hidden_dim": 48} if "model.hidden_dim=48" in flags else {})


def test_hf_style_deepspeed_flag_is_the_config_path():
    """`--deepspeed ds.json` (HF Trainer) names the DeepSpeed JSON; a bare `--deepspeed` (DeepSpeed's own
    switch) is accepted and leaves the next argument alone."""
    args = parse_args(["--deepspeed", str(ROOT / "ds_configs" / "cpu_zero2.json"), "--data", "d"])
    assert args.deepspeed.data["zero_optimization"]["stage"] == 2 and "cpu_zero2" in args.deepspeed.source
    args = parse_args(["--deepspeed_config", DS, "--deepspeed", "model.num_layers=3", "--data", "d"])
    assert args.deepspeed.data["zero_optimization"]["stage"] == 1 and args.model_overrides == {
        "num_layers": 3
    }
    with pytest.raises(UserError, match="two DeepSpeed configs"):
        parse_args(
            [
                "--deepspeed",
                str(ROOT / "ds_configs" / "cpu_zero2.json"),
                "--deepspeed_config",
                DS,
                "--data",
                "d",
            ]
        )


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--data", "d", "--max-steps", "x"], "--max-steps: expects an integer"),
        (["--data", "d", "--lr-decay", "step"], "--lr-decay: expects one of cosine, linear, constant"),
        (["--data", "d", "--precision", "fp8"], "--precision: expects one of fp32, bf16, fp16"),
        (["--data", "d", "--progress", "maybe"], "--progress: expects true or false"),
        (["--data", "d", "--no-such-flag"], "unrecognized arguments: --no-such-flag"),
        (["--data", "d", "no_such=1"], "unknown setting `no_such`"),
        (["--data", "d", "model.depth=3"], "unknown setting `depth`"),
        (["--max-steps", "3"], "--data"),
        (["--data", "d", "--keep-last", "0"], "--keep-last"),
        (["--data", "d", "--lr", "0"], "--lr: must be > 0"),
        (["--data", "d", "--grad-accum", "0"], "--grad-accum: must be >= 1"),
        (["--data", "d", "--wandb-artifacts", "all"], "--wandb-artifacts"),
        (["--data", "d", "--samples", "-1"], "--samples"),
        (["--data", "d", "--sample-tokens", "0"], "--sample-tokens"),
    ],
)
def test_bad_values_name_the_flag(argv, needle):
    with pytest.raises(UserError, match=needle.replace("(", r"\(")):
        parse_args(["--deepspeed_config", DS, *argv])


def test_wandb_mode_checked():
    with pytest.raises(ValueError, match="--wandb-mode"):
        TrainConfig(data="d", wandb_mode="cloud")


def test_config_file_sections_and_precedence(tmp_path):
    """defaults < config file < flags; `model:` and `deepspeed:` sections; YAML's `3e-4` (a string) reads."""
    f = tmp_path / "run.yaml"
    f.write_text(
        "data: d\nmax_steps: 5\nlr: 3e-4\nprogress: no\ntrain:\n  seed: 7\n"
        f"model:\n  hidden_dim: 48\ndeepspeed: {ROOT}/ds_configs/cpu_zero2.json\n"
    )
    args = parse_args(["--config", str(f), "--max-steps", "9", "model.embed_dim=16"])
    cfg = args.cfg
    assert (cfg.data, cfg.max_steps, cfg.lr, cfg.progress, cfg.seed, cfg.eval_every) == (
        "d",
        9,
        3e-4,
        False,
        7,
        None,  # a default that follows the run's length: planned with the run (app/training/run_schedule.py)
    )
    assert args.model_overrides == {"hidden_dim": 48, "embed_dim": 16}
    assert args.deepspeed.data["zero_optimization"]["stage"] == 2
    args = parse_args(["--config", str(f), "--deepspeed", DS, "--progress"])  # the command line wins
    assert args.deepspeed.data["zero_optimization"]["stage"] == 1 and args.cfg.progress is True


@pytest.mark.parametrize(
    "text, needle",
    [
        (
            "data: d\nmax_step: 5\n",
            "run.yaml line 2: unknown setting `max_step` for TrainConfig (did you mean `max_steps`?)",
        ),
        ("data: d\nmax_steps: [5]\n", "run.yaml line 2: `max_steps`: expects an integer or null, got [5]"),
        (
            "data: d\nmodel:\n  hidden_dim: wide\n",
            "run.yaml line 3: `model.hidden_dim`: expects an integer, got 'wide'",
        ),
        ("data: d\nmodel:\n  depth: 3\n", "run.yaml line 3: unknown setting `depth` for ModelConfig"),
        ("data: d\ntest_eval: maybe\n", "run.yaml line 2: `test_eval`: expects true or false"),
        ("data: d\nlr_decay: step\n", "run.yaml line 2: `lr_decay`: expects one of cosine, linear, constant"),
        ("data: d\nseed: 1\ntrain:\n  seed: 2\n", "run.yaml line 4: `train.seed`: also set at the top level"),
        ("data: d\n  max_steps: 5\n", "run.yaml line 2 column 12: invalid YAML"),
        ("- data\n", "expected a mapping of settings"),
        (
            "data: d\ndeepspeed: 3\n",
            "run.yaml line 2: `deepspeed`: expected a DeepSpeed JSON path or mapping",
        ),
    ],
)
def test_bad_config_file_is_one_line_naming_file_line_and_key(tmp_path, capsys, text, needle):
    f = tmp_path / "run.yaml"
    f.write_text(text)
    assert main(["--config", str(f), "--deepspeed_config", DS]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and needle in err[0], err


def test_config_json_with_a_deepspeed_section_must_agree_with_itself(tmp_path):
    """A run's config.json holds lr and batch twice (train and deepspeed): an edit to one side only is
    refused, never silently overridden; a redacted secret is not sent to DeepSpeed."""
    ds = json.loads(Path(DS).read_text())
    f = tmp_path / "config.json"
    f.write_text(json.dumps({"train": {"data": "d", "lr": 0.01, "grad_accum": 4}, "deepspeed": ds}, indent=1))
    with pytest.raises(
        UserError, match=r"config.json line 4: `lr`: 0.01 disagrees with the file's deepspeed"
    ):
        parse_args(["--config", str(f)])
    ds["monitor"] = {"api_key": "<redacted>"}
    f.write_text(json.dumps({"train": {"data": "d"}, "deepspeed": ds}, indent=1))
    with pytest.raises(UserError, match=r"`deepspeed.monitor.api_key`: a redacted secret"):
        parse_args(["--config", str(f)])


def test_the_manuals_config_file_parses(tmp_path, monkeypatch):
    """The YAML shown in docs/training.md is a working config file (its paths relative to the checkout)."""
    monkeypatch.chdir(ROOT)
    manual = (ROOT / "docs" / "training.md").read_text()
    block = re.search(r"```yaml\n(# run\.yaml.*?)```", manual, re.S)
    assert block, "docs/training.md lost its config file example"
    f = tmp_path / "run.yaml"
    f.write_text(block.group(1))
    args = parse_args(["--config", str(f)])
    assert (args.cfg.lr, args.cfg.micro_batch, args.cfg.precision, args.cfg.progress) == (
        1e-3,
        16,
        "bf16",
        False,
    )
    assert (
        args.model_overrides == {"hidden_dim": 1024, "dropout": 0.1} and "gpu_bf16" in args.deepspeed.source
    )
