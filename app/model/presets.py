"""Named model sizes; `--model-config` takes one of these names or a JSON file."""

from __future__ import annotations

import json
from pathlib import Path

from app.common.errors import UserError
from app.model.config import ModelConfig

PRESETS: dict[str, dict] = {
    # Shared by tests, CI and launch/ smoke runs.
    "debug": dict(embed_dim=32, hidden_dim=64, num_layers=2),
    # The quickstart: trains visibly on 2 CPU processes in a few minutes.
    "small": dict(embed_dim=128, hidden_dim=256, num_layers=2),
    "medium": dict(embed_dim=256, hidden_dim=1024, num_layers=2),
    # The size of OpenAI's byte-level review model (Radford et al. 2017).
    "large": dict(embed_dim=64, hidden_dim=4096, num_layers=1),
}


def load_model_config(spec: str | None, vocab_size: int, overrides: dict) -> ModelConfig:
    """A preset name or a JSON file, then `model.key=value` overrides; vocab size comes from the data."""
    spec = spec or "small"
    if spec in PRESETS:
        d = dict(PRESETS[spec])
    else:
        p = Path(spec)
        if not p.is_file():
            raise UserError(f"--model-config: {spec!r} is neither a preset ({', '.join(PRESETS)}) nor a file")
        try:
            d = json.loads(p.read_text())
        except json.JSONDecodeError as e:
            raise UserError(f"--model-config: {p}:{e.lineno}:{e.colno}: invalid JSON: {e.msg}") from None
        if not isinstance(d, dict):
            raise UserError(f"--model-config: {p}: expected a JSON object")
    if "vocab_size" in d and d["vocab_size"] != vocab_size:
        raise UserError(
            f"--model-config: vocab_size {d['vocab_size']} does not match the data's tokenizer ({vocab_size})"
        )
    d.update(overrides)
    d["vocab_size"] = vocab_size
    try:
        return ModelConfig.from_dict(d)
    except (ValueError, TypeError) as e:
        raise UserError(f"--model-config: {e}") from None
