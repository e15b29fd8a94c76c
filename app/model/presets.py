"""Named model sizes; `--model-config` takes one of these names or a JSON file."""

from __future__ import annotations

from pathlib import Path

from app.common.errors import UserError
from app.common.files import read_json_object
from app.model.config import PRESETS, ModelConfig


def load_model_config(spec: str | dict | None, vocab_size: int, overrides: dict) -> ModelConfig:
    """A preset name, a JSON file or a model config's fields (another model's, as `--init-from` gives them),
    then `model.key=value` overrides; vocab size comes from the data."""
    spec = spec or "small"
    if isinstance(spec, dict):
        d = dict(spec)
    elif spec in PRESETS:
        d = dict(PRESETS[spec])
    else:
        p = Path(spec)
        if not p.is_file():
            raise UserError(f"--model-config: {spec!r} is neither a preset ({', '.join(PRESETS)}) nor a file")
        d = read_json_object(p, "--model-config")
    if "vocab_size" in d and d["vocab_size"] != vocab_size:
        raise UserError(
            f"--model-config: vocab_size {d['vocab_size']} does not match the data's tokenizer ({vocab_size})"
        )
    if overrides.get("vocab_size", vocab_size) != vocab_size:
        raise UserError(
            f"model.vocab_size {overrides['vocab_size']} does not match the data's tokenizer ({vocab_size})"
        )
    d.update(overrides)
    d["vocab_size"] = vocab_size
    try:
        return ModelConfig.from_dict(d)
    except (ValueError, TypeError) as e:
        raise UserError(f"--model-config: {e}") from None
