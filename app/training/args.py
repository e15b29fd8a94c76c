"""The training command line: DeepSpeed's flags, one flag per TrainConfig field, model.<field>=V overrides."""

from __future__ import annotations

import argparse

from app.common.cli import add_dataclass_flags, collect_flags, parse_value
from app.common.errors import UserError
from app.model.config import ModelConfig
from app.training.config import TrainConfig


def parse_args(argv: list[str] | None, description: str = "") -> tuple[TrainConfig, str, dict, bool]:
    """-> (train config, --deepspeed_config path, model overrides, --dry-run)."""
    import deepspeed

    p = argparse.ArgumentParser(
        description=description, formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False
    )
    p.add_argument("--local_rank", type=int, default=-1, help=argparse.SUPPRESS)  # set by the launcher
    deepspeed.add_config_arguments(p)
    add_dataclass_flags(p, TrainConfig)
    p.add_argument("--dry-run", action="store_true", help="Validate configs and data, print the plan, exit.")
    p.add_argument(
        "overrides",
        nargs="*",
        metavar="KEY=VALUE",
        help="model.<field>=V overrides the model config (e.g. model.hidden_dim=512); "
        "<field>=V or train.<field>=V sets a training field.",
    )
    ns = p.parse_args(argv)
    values = collect_flags(ns, TrainConfig)
    model_over: dict = {}
    for item in ns.overrides:
        key, eq, raw = item.partition("=")
        if not eq:
            raise UserError(f"override {item!r}: expected KEY=VALUE")
        if key.startswith("model."):
            model_over[key[6:]] = parse_value(ModelConfig, key[6:], raw)
        else:
            field = key.removeprefix("train.")
            values[field] = parse_value(TrainConfig, field, raw)
    try:
        cfg = TrainConfig(**values)
    except ValueError as e:
        raise UserError(str(e)) from None
    return cfg, ns.deepspeed_config, model_over, ns.dry_run
