"""Every numeric flag of every CLI with nan, inf, -1 and 0: refused in one line naming the flag, or (0 only,
and -1 where the flag is signed) taken. Parse level: the CLIs' own parsers, no run behind them."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from app.common.cli import field_types, flag_of, parse_config
from app.common.errors import UserError
from app.evaluation.config import EvalConfig
from app.generation.config import GenerateConfig
from app.model.config import ModelConfig
from app.model.presets import load_model_config
from app.probing.config import TransferConfig
from app.training.args import parse_args as train_parse
from app.training.config import TrainConfig
from data_prep.cli import parse as prep_parse
from data_prep.config import PrepConfig

DS = str(Path(__file__).resolve().parents[1] / "ds_configs" / "cpu_pp2_zero1.json")
SIGNED = {("TransferConfig", "layer"), ("ModelConfig", "forget_bias")}  # -1 means something there


def _model(argv: list[str]) -> ModelConfig:
    name, value = argv[0][len("model.") :].split("=")
    return load_model_config(
        "debug",
        384,
        train_parse(["--data", "d", "--deepspeed_config", DS, f"model.{name}={value}"]).model_overrides,
    )


CLIS = {  # each CLI's config class (app/export.py and app/plot.py take no number): (its parser with the other arguments it requires, the class)
    "TrainConfig": (lambda a: train_parse(["--data", "d", "--deepspeed_config", DS, *a]).cfg, TrainConfig),
    "EvalConfig": (lambda a: parse_config(EvalConfig, ["--checkpoint", "c", "--data", "d", *a], None), EvalConfig),
    "GenerateConfig": (lambda a: parse_config(GenerateConfig, ["--checkpoint", "c", *a], None), GenerateConfig),
    "TransferConfig": (
        lambda a: parse_config(TransferConfig, ["--checkpoint", "c", "--train", "a", "--test", "b", *a], None),
        TransferConfig,
    ),
    "PrepConfig": (lambda a: prep_parse(["--out", "o", *a]), PrepConfig),
    "ModelConfig": (_model, ModelConfig),
}  # fmt: skip


def _numeric_fields(cls: type) -> list[str]:
    return [
        f.name for f in dataclasses.fields(cls) if field_types(cls)[f.name][0] in (int, float, list[float])
    ]


def _outcome(cli: str, field: str, value: str, capsys) -> str:
    """The one-line refusal, or "" when the value was taken."""
    parse, _ = CLIS[cli]
    flag = f"model.{field}" if cli == "ModelConfig" else flag_of(field)
    try:
        cfg = parse([f"{flag}={value}"] if cli == "ModelConfig" else [flag, value])
    except (UserError, ValueError) as e:
        return str(e)
    except SystemExit as e:  # data_prep's argparse: a non-number for an integer flag
        assert e.code == 2
        return capsys.readouterr().err.strip().splitlines()[-1]
    taken = getattr(cfg, field)
    want = [float(value)] if isinstance(taken, list) else float(value)  # a list of numbers: the one given
    assert value in ("0", "-1") and taken == want, f"{flag} {value} was taken"
    return ""


@pytest.mark.parametrize("cli", list(CLIS))
def test_every_numeric_flag_with_nan_inf_negative_and_zero(cli, capsys):
    fields = _numeric_fields(CLIS[cli][1])
    assert fields
    for field in fields:
        # ModelConfig's own checks name the field (`embed_dim must be ...`) after `--model-config:`
        name = field if cli == "ModelConfig" else flag_of(field)
        for value in ("nan", "inf", "-1", "0"):
            msg = _outcome(cli, field, value, capsys)
            if not msg:
                signed = value == "-1" and (cli, field) in SIGNED
                assert value == "0" or signed, f"{cli}: {name} {value} was taken"
            else:
                assert "\n" not in msg and name in msg, f"{cli}: {name} {value}: {msg}"
