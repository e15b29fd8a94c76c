"""TrainConfig validation and the flag/override parsing of app/train.py."""

import pytest

from app.common.errors import UserError
from app.train import parse_args
from app.training.config import TrainConfig


def test_help_comes_from_field_docstrings(capsys):
    with pytest.raises(SystemExit):
        parse_args(["--help"])
    out = capsys.readouterr().out
    assert "--pipeline-stages" in out and "Pipeline stages P" in out
    assert "--keep-last" in out and "never the one `latest` names" in out


def test_flags_and_overrides_are_typed():
    cfg, ds, model_over, dry = parse_args(
        [
            "--deepspeed_config",
            "x.json",
            "--data",
            "d",
            "--max-steps",
            "7",
            "model.hidden_dim=48",
            "warmup_steps=3",
            "train.deterministic=false",
        ]
    )
    assert (cfg.max_steps, cfg.warmup_steps, cfg.deterministic, ds, dry) == (7, 3, False, "x.json", False)
    assert model_over == {"hidden_dim": 48}


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--data", "d", "--max-steps", "x"], "`max_steps` expects int"),
        (["--data", "d", "--lr-decay", "step"], "--lr-decay"),
        (["--data", "d", "no_such=1"], "unknown setting `no_such`"),
        (["--data", "d", "model.depth=3"], "unknown setting `depth`"),
        (["--max-steps", "3"], "--data"),
        (["--data", "d", "--keep-last", "0"], "--keep-last"),
        (["--data", "d", "--wandb-artifacts", "all"], "--wandb-artifacts"),
        (["--data", "d", "--samples", "-1"], "--samples"),
        (["--data", "d", "--sample-tokens", "0"], "--sample-tokens"),
    ],
)
def test_bad_values_name_the_flag(argv, needle):
    with pytest.raises(UserError, match=needle.replace("(", r"\(")):
        parse_args(argv)


def test_wandb_mode_checked():
    with pytest.raises(ValueError, match="--wandb-mode"):
        TrainConfig(data="d", wandb_mode="cloud")
