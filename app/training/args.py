"""The training command line: `--config FILE`, one flag per TrainConfig field, model.<field>=V overrides,
and DeepSpeed's own arguments (`--deepspeed_config`, HF-style `--deepspeed FILE`, the launcher's
`--local_rank`).

Precedence: TrainConfig's defaults < the config file < flags and KEY=VALUE overrides. A config file is
YAML or JSON with TrainConfig's fields at the top level or in a `train:` section, ModelConfig's fields
in a `model:` section, and `deepspeed:` (a DeepSpeed JSON path, or the DeepSpeed config itself), so a
run's own config.json is a config file: its other keys (layout, data, ...) record results and are
ignored with a note.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import textwrap
from typing import Any, NamedTuple

from app.common.cli import (
    FlagParser,
    build,
    choices,
    collect_flags,
    command_parser,
    field_docs,
    field_types,
    parse_value,
    settings_from_mapping,
)
from app.common.config_file import ConfigFile, read_config_file
from app.common.errors import UserError
from app.common.redact import REDACTED
from app.model.config import PRESETS, ModelConfig
from app.parallel.layout import DeepSpeedJson, load_ds_json, stated_settings
from app.training.config import TrainConfig
from app.training.ds_adopt import adopt

SECTIONS = ("train", "model", "deepspeed")
# What a run's config.json records besides its settings: results, read back as nothing.
RECORDED = (
    "layout", "data", "code", "total_steps", "steps_per_epoch", "world_size", "threads_per_process",
    "layer_costs", "partition", "schedule",
)  # fmt: skip
DS_SETTINGS = ("lr", "micro_batch", "grad_accum", "global_batch", "precision")


class TrainArgs(NamedTuple):
    cfg: TrainConfig
    deepspeed: DeepSpeedJson
    model_overrides: dict
    dry_run: bool
    notes: list[str]  # lines for rank 0's log (what a config file held that is not a setting)


def build_parser(description: str = "") -> FlagParser:
    example = (
        "`model:` and `train:` sections, and `deepspeed:` (a path or the JSON itself): a run's own config.json "
        "works"
    )
    p = command_parser(TrainConfig, description, epilog=epilog(), launcher=True, example=example)
    # the two settings a run cannot do without (either may come from --config instead), then the rest
    p.usage = "%(prog)s --deepspeed_config FILE --data DIR [--config FILE] [options] [KEY=VALUE ...]"
    ds = p.add_argument_group("DeepSpeed")
    ds.add_argument(
        "--deepspeed_config",
        metavar="FILE",
        help="Required: the DeepSpeed JSON (batch, optimizer, ZeRO, precision), a path or a shipped config's "
        "name (e.g. cpu_pp2_zero1.json); or --deepspeed FILE, or `deepspeed:` in --config.",
    )
    ds.add_argument(
        "--deepspeed",
        nargs="?",
        metavar="FILE",
        help="The same, as HF's Trainer spells it; a bare --deepspeed (DeepSpeed's enable switch) changes nothing.",
    )
    ds.add_argument("--deepscale_config", help=argparse.SUPPRESS)  # DeepSpeed's deprecated spellings
    ds.add_argument("--deepscale", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--dry-run", action="store_true", help="Validate configs and data, print the plan, exit.")
    p.add_argument(
        "overrides",
        nargs="*",
        metavar="KEY=VALUE",
        help="model.<field>=V overrides the model config (e.g. model.hidden_dim=512; fields listed below); "
        "<field>=V or train.<field>=V sets a training field.",
    )
    return p


def epilog() -> str:
    """The presets and every model field (with its choices), for the end of --help."""
    lines = ["model presets (--model-config NAME; vocab_size comes from the data):"]
    for name, dims in PRESETS.items():
        lines.append(f"  {name:<8}" + " ".join(f"{k}={v}" for k, v in dims.items()))
    lines.append("model fields (model.<field>=VALUE, or a `model:` section in --config):")
    docs = field_docs(ModelConfig)
    defaults = {f.name: f.default for f in dataclasses.fields(ModelConfig)}
    for name, (tp, _) in field_types(ModelConfig).items():
        opts = choices(tp)
        kind = "{" + ",".join(opts) + "}" if opts else tp.__name__
        default = "" if defaults[name] is dataclasses.MISSING else f" (default: {defaults[name]})"
        lines.append(f"  model.{name} {kind}{default}")
        lines += textwrap.wrap(docs.get(name, ""), 100, initial_indent=" " * 6, subsequent_indent=" " * 6)
    return "\n".join(lines)


def parse_args(argv: list[str] | None, description: str = "") -> TrainArgs:
    p = build_parser(description)
    ns = p.parse_args(_hf_deepspeed_flag(argv))
    values: dict[str, Any] = {}
    model_over: dict[str, Any] = {}
    notes: list[str] = []
    file_ds: DeepSpeedJson | None = None
    if ns.config is not None:
        cfg_file = read_config_file(ns.config)
        values, model_over, file_ds, notes = read_train_file(cfg_file)
    values.update(collect_flags(ns, TrainConfig))
    for item in ns.overrides:
        key, eq, raw = item.partition("=")
        if not eq:
            raise UserError(f"override {item!r}: expected KEY=VALUE")
        if key.startswith("model."):
            model_over[key[6:]] = parse_value(ModelConfig, key[6:], raw, key)
        else:
            field = key.removeprefix("train.")
            values[field] = parse_value(TrainConfig, field, raw, key)
    ds, values, adopted = adopt(_deepspeed_source(ns, file_ds), values)  # "auto" and `scheduler`
    return TrainArgs(build(TrainConfig, values), ds, model_over, ns.dry_run, notes + adopted)


def _hf_deepspeed_flag(argv: list[str] | None) -> list[str] | None:
    """`--deepspeed FILE` -> `--deepspeed=FILE`; a bare `--deepspeed` (a no-op switch) is dropped, so that it
    never swallows a following KEY=VALUE override."""
    if argv is None:
        argv = sys.argv[1:]
    out = []
    i = 0
    while i < len(argv):
        if argv[i] == "--deepspeed":
            nxt = argv[i + 1] if i + 1 < len(argv) else None
            if nxt is not None and not nxt.startswith("-") and "=" not in nxt:
                out.append(f"--deepspeed={nxt}")
                i += 1
        elif argv[i] == "--":
            out += argv[i:]
            break
        else:
            out.append(argv[i])
        i += 1
    return out


def _deepspeed_source(ns: argparse.Namespace, file_ds: DeepSpeedJson | None) -> DeepSpeedJson:
    """The DeepSpeed JSON: from the command line (one spelling only), else the config file's."""
    given = {
        flag: path
        for flag, path in (
            ("--deepspeed_config", ns.deepspeed_config),
            ("--deepspeed", ns.deepspeed),
            ("--deepscale_config", ns.deepscale_config),
        )
        if path
    }
    if len(set(given.values())) > 1:
        raise UserError(
            f"two DeepSpeed configs given ({', '.join(f'{k} {v}' for k, v in given.items())}): give one"
        )
    if given:
        flag, path = next(iter(given.items()))
        return DeepSpeedJson(load_ds_json(path, flag), f"{flag} {path}")
    if file_ds is not None:
        return file_ds
    return DeepSpeedJson(load_ds_json(None), "")


def read_train_file(cfg: ConfigFile) -> tuple[dict, dict, DeepSpeedJson | None, list[str]]:
    """(train settings, model overrides, DeepSpeed config, notes) from a training config file."""
    recorded = [k for k, v in cfg.data.items() if _is_recorded(k, v)]
    flat = {k: v for k, v in cfg.data.items() if k not in SECTIONS and k not in recorded}
    values = settings_from_mapping(TrainConfig, flat, cfg)
    train = _section(cfg, "train")
    for key, value in settings_from_mapping(TrainConfig, train, cfg, ("train",)).items():
        if key in values and values[key] != value:
            raise UserError(
                f"{cfg.where('train', key)}: also set at the top level to {values[key]!r}: keep one"
            )
        values[key] = value
    model = settings_from_mapping(ModelConfig, _section(cfg, "model"), cfg, ("model",))
    ds = _file_deepspeed(cfg, values)
    notes = (
        [f"--config {cfg.path}: ignored what it records of a run ({', '.join(recorded)})"] if recorded else []
    )
    return values, model, ds, notes


def _is_recorded(key: str, value: object) -> bool:
    """A result a run's config.json records (its `data` is a mapping there; `data: DIR` is the setting)."""
    return key in RECORDED and (key not in field_types(TrainConfig) or isinstance(value, dict))


def _section(cfg: ConfigFile, name: str) -> dict:
    section = cfg.data.get(name, {})
    if not isinstance(section, dict):
        raise UserError(f"{cfg.where(name)}: expected a mapping of settings, got {section!r}")
    return section


def _file_deepspeed(cfg: ConfigFile, values: dict) -> DeepSpeedJson | None:
    """`deepspeed:` as a path, or as the DeepSpeed config itself (as a run's config.json holds it). The
    latter must agree with the file's own lr/batch/precision, so an edit to one side is never ignored."""
    ds = cfg.data.get("deepspeed")
    if ds is None:
        return None
    if isinstance(ds, str):
        return DeepSpeedJson(load_ds_json(ds, cfg.where("deepspeed")), f"{cfg.where('deepspeed')} {ds}")
    if not isinstance(ds, dict):
        raise UserError(f"{cfg.where('deepspeed')}: expected a DeepSpeed JSON path or mapping, got {ds!r}")
    if (hidden := _redacted_key(ds)) is not None:
        raise UserError(
            f"{cfg.where('deepspeed', *hidden)}: a redacted secret (config.json keeps none): give the "
            f"DeepSpeed JSON with --deepspeed_config FILE"
        )
    stated = stated_settings(ds)
    for name in DS_SETTINGS:
        if name in values and name in stated and values[name] != stated[name]:
            raise UserError(
                f"{cfg.where(name)}: {values[name]!r} disagrees with the file's deepspeed section "
                f"({stated[name]!r}): change both, or drop one"
            )
    return DeepSpeedJson(ds, f"{cfg.where('deepspeed')}")


def _redacted_key(obj: object, path: tuple[str, ...] = ()) -> tuple[str, ...] | None:
    if obj == REDACTED:
        return path
    items = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, list) else ()
    for k, v in items:
        if (found := _redacted_key(v, (*path, str(k)))) is not None:
            return found
    return None
