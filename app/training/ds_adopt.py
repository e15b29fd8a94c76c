"""A DeepSpeed config written for Hugging Face's Trainer, adopted: its `"auto"` values filled from our flags
and its `scheduler` section mapped onto our schedule (warmup, then cosine, linear or no decay).

HF's integration fills "auto" from its TrainingArguments; ours from the run's settings (flags or --config):
the batch keys and the precision sections from --micro-batch/--grad-accum/--global-batch/--precision (or
derived as for any config), `optimizer.params.lr` from --lr; where we have no flag, the value HF's
defaults would give (AdamW betas [0.9, 0.999], eps 1e-8, weight_decay 0, gradient_clipping 1.0), and
ZeRO's bucket sizes are left to DeepSpeed. The schedule then comes from our settings alone (the section
is removed from what DeepSpeed gets), so it agrees with --max-steps/--epochs and resumes as ours does.
"""

from __future__ import annotations

import json

from app.common.errors import UserError
from app.parallel.layout import GLOBAL, MICRO, DeepSpeedJson

AUTO = "auto"
BATCH_KEYS = (MICRO, "gradient_accumulation_steps", GLOBAL)
OPTIMIZER_DEFAULTS = {"betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.0}
CLIP_DEFAULT = 1.0
# DeepSpeed's schedulers that mean one of ours: type -> (our --lr-decay, the params we read)
SCHEDULERS = {
    "WarmupLR": ("constant", {"warmup_min_lr", "warmup_max_lr", "warmup_num_steps", "warmup_type"}),
    "WarmupDecayLR": (
        "linear",
        {"warmup_min_lr", "warmup_max_lr", "warmup_num_steps", "warmup_type", "total_num_steps"},
    ),
    "WarmupCosineLR": (
        "cosine",
        {"warmup_min_ratio", "cos_min_ratio", "warmup_num_steps", "warmup_type", "total_num_steps"},
    ),
}
FLAGS = {"lr": "--lr", "warmup_steps": "--warmup-steps", "lr_decay": "--lr-decay"}
FLAGS |= {"min_lr_ratio": "--min-lr-ratio", "max_steps": "--max-steps"}


def adopt(ds: DeepSpeedJson, values: dict) -> tuple[DeepSpeedJson, dict, list[str]]:
    """(the DeepSpeed config with no "auto" and no scheduler, the settings with the scheduler's, log lines).

    `values` are the settings the user gave (flags and --config), not the defaults: a scheduler value that
    disagrees with one of them is one line naming both."""
    data = {k: v for k, v in ds.data.items() if k != "scheduler"}
    notes: list[str] = []
    values = dict(values)
    if "scheduler" in ds.data:  # first: its warmup_max_lr may be the lr an "auto" takes
        settings, line = _map_scheduler(ds.data["scheduler"], values, ds.source)
        values.update(settings)
        notes.append(line)
    filled = _fill_auto(data, values, ds.source)
    if filled:
        notes.insert(0, f'{ds.source}: "auto" filled: {", ".join(filled)}')
    leftover = _find_auto(data)
    if leftover:
        raise UserError(
            f'{ds.source}: `{leftover}` is "auto", which has no setting of ours to fill it: give a value'
        )
    return DeepSpeedJson(data, ds.source), values, notes


def _fill_auto(data: dict, values: dict, src: str) -> list[str]:
    """Replace the "auto" values we know in place (a copy of each section); returns what was filled."""
    filled = []
    for key in BATCH_KEYS:
        if data.get(key) == AUTO:
            del data[key]  # the batch flags fill it, or resolve_layout derives it from the other two
            filled.append(f"{key} (batch flags)")
    for key in ("bf16", "fp16"):
        section = data.get(key)
        if isinstance(section, dict) and section.get("enabled") == AUTO:
            data[key] = {**section, "enabled": values.get("precision") == key}
            filled.append(f"{key}.enabled ({values.get('precision') or 'fp32'})")
    opt = data.get("optimizer")
    params = opt.get("params") if isinstance(opt, dict) else None
    if isinstance(params, dict):
        params = data["optimizer"] = {**opt, "params": dict(params)}
        params = params["params"]
        if params.get("lr") == AUTO:
            if values.get("lr") is None:
                raise UserError(
                    f'{src}: `optimizer.params.lr` is "auto": give the peak learning rate with --lr'
                )
            params["lr"] = values["lr"]
            filled.append(f"optimizer.params.lr (--lr {values['lr']:g})")
        for name, default in OPTIMIZER_DEFAULTS.items():
            if params.get(name) == AUTO:
                params[name] = default
                filled.append(f"optimizer.params.{name} {default}")
    if data.get("gradient_clipping") == AUTO:
        data["gradient_clipping"] = CLIP_DEFAULT
        filled.append(f"gradient_clipping {CLIP_DEFAULT}")
    zero = data.get("zero_optimization")
    if isinstance(zero, dict) and AUTO in zero.values():
        data["zero_optimization"] = {k: v for k, v in zero.items() if v != AUTO}
        filled += [f"zero_optimization.{k} (DeepSpeed's default)" for k, v in zero.items() if v == AUTO]
    return filled


def _find_auto(obj: object, path: str = "") -> str | None:
    if obj == AUTO:
        return path
    items = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, list) else ()
    for k, v in items:
        if (found := _find_auto(v, f"{path}.{k}" if path else str(k))) is not None:
            return found
    return None


def _map_scheduler(section: object, values: dict, src: str) -> tuple[dict, str]:
    """Our settings for a DeepSpeed `scheduler` section, and the line saying what it became."""
    kind = section.get("type") if isinstance(section, dict) else None
    params = section.get("params", {}) if isinstance(section, dict) else None
    if kind not in SCHEDULERS or not isinstance(params, dict):
        raise UserError(
            f"{src}: scheduler {kind or json.dumps(section)} has no counterpart in our schedule (linear warmup, "
            f"then cosine, linear or no decay; DeepSpeed's {', '.join(SCHEDULERS)} map onto it): remove the "
            f"`scheduler` section and use --warmup-steps, --lr-decay and --min-lr-ratio"
        )
    decay, known = SCHEDULERS[kind]
    unknown = sorted(set(params) - known)
    if unknown:
        raise UserError(f"{src}: scheduler.params.{unknown[0]} is not a {kind} parameter we map; remove it")
    floor = params.get("warmup_min_lr", params.get("warmup_min_ratio", 0))
    if floor not in (0, 0.0, AUTO):
        raise UserError(
            f"{src}: scheduler {kind}'s warmup starts at {floor}, ours at 0 (linear from lr/warmup): "
            f"set {'warmup_min_lr' if 'warmup_min_lr' in params else 'warmup_min_ratio'} to 0"
        )
    if params.get("warmup_type", "linear") not in ("linear", AUTO):
        raise UserError(
            f"{src}: scheduler.params.warmup_type {params['warmup_type']!r}: our warmup is linear; set it "
            f'to "linear"'
        )
    wanted = {"lr_decay": decay}
    if kind == "WarmupDecayLR":
        wanted["min_lr_ratio"] = 0.0
    if kind == "WarmupCosineLR":
        wanted["min_lr_ratio"] = _number(params.get("cos_min_ratio", 1e-4), "cos_min_ratio", src)
    for ours, theirs in (("warmup_steps", "warmup_num_steps"), ("lr", "warmup_max_lr"), ("max_steps", "total_num_steps")):  # fmt: skip
        if params.get(theirs, AUTO) != AUTO:
            wanted[ours] = _number(params[theirs], theirs, src, whole=ours != "lr")
    if "max_steps" in wanted:
        _check_length(values, wanted["max_steps"], src)
    for name, value in wanted.items():
        if name in values and values[name] is not None and values[name] != value:
            raise UserError(
                f"{src}: the scheduler section's {_theirs(name)} {value!r} disagrees with "
                f'{FLAGS[name]} {values[name]!r}: drop one of them (or set the section\'s to "auto")'
            )
    out = {k: v for k, v in wanted.items() if values.get(k) is None}
    said = ", ".join(f"{FLAGS[k]} {v}" for k, v in wanted.items())
    return out, f"{src}: scheduler {kind} runs as our schedule: {said}"


def _theirs(name: str) -> str:
    return {
        "lr_decay": "type",
        "min_lr_ratio": "decay floor",
        "warmup_steps": "warmup_num_steps",
        "lr": "warmup_max_lr",
        "max_steps": "total_num_steps",
    }[name]


def _check_length(values: dict, steps: int | float, src: str) -> None:
    for name, flag in (("epochs", "--epochs"), ("time_budget", "--time-budget")):
        if values.get(name) is not None and values.get("max_steps") is None:
            raise UserError(
                f"{src}: the scheduler section's total_num_steps {steps} disagrees with {flag} "
                f"{values[name]} (the run's length): drop one of them (or set the section's to \"auto\")"
            )


def _number(v: object, name: str, src: str, *, whole: bool = False) -> int | float:
    kinds = int if whole else (int, float)
    if isinstance(v, bool) or not isinstance(v, kinds) or v < 0:
        what = "a whole number" if whole else "a number"
        raise UserError(f'{src}: scheduler.params.{name} must be {what} >= 0 or "auto", got {v!r}')
    return v
