"""The export format: a folder that loads with torch alone (no DeepSpeed, no pickle).

model.safetensors   the full float32 weights, keys "{i}.{name}" (see app.model.lm)
config.json         {"format": "mlstm-ds-export", "version": 1, model_config, tokenizer, step, ...}
                    optional "feature_preprocess": "openai" (an import's: mlstm-import, docs/import.md)
tokenizer.model     the SentencePiece model (absent for the byte tokenizer)

The same folder also loads with `transformers` (app.checkpoints.hf_format: more keys in config.json, a
few more files) and carries a model card (README.md); this module reads only the three files above.
A classifier folder (app.classifier.folder) is an export too: its config says so and its
model.safetensors also holds the head's tensors ("classifier.*"), which the language model's readers here
leave out.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from app.checkpoints.consolidate import StateDict, check_state_dict
from app.common.errors import UserError
from app.common.files import atomic_write, read_json_object
from app.model.config import ModelConfig

EXPORT_FORMAT = "mlstm-ds-export"
EXPORT_VERSION = 1
CLASSIFIER_FORMAT = "mlstm-ds-classifier"  # app.classifier.folder
HEAD_PREFIX = "classifier."  # a classifier's head tensors in its model.safetensors
WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"
TOKENIZER_FILE = "tokenizer.model"
FEATURE_PREPROCESS_KEY = "feature_preprocess"
FEATURE_PREPROCESSES = ("none", "openai")  # what app.classifier.features.prepare_texts does with each


def is_export_dir(p: Path) -> bool:
    return (p / WEIGHTS_FILE).is_file() and (p / CONFIG_FILE).is_file()


def read_export_config(d: Path) -> dict:
    p = Path(d) / CONFIG_FILE
    cfg = read_json_object(p, "export config")
    if cfg.get("format") not in (EXPORT_FORMAT, CLASSIFIER_FORMAT):
        raise UserError(f"{p}: not an {EXPORT_FORMAT} config")
    if cfg.get("version") != EXPORT_VERSION:
        raise UserError(
            f"{p}: export version {cfg.get('version')!r}, this version reads {EXPORT_VERSION}: export again"
        )
    if not isinstance(cfg.get("tokenizer"), dict):
        raise UserError(f"{p}: no tokenizer entry")
    return cfg


def feature_preprocess(path: Path) -> str:
    """How texts are prepared before featurizing (app/transfer.py) with the model at `path`: the export
    config's `feature_preprocess` ("none" when absent, and for a training checkpoint)."""
    p = Path(path)
    if not is_export_dir(p):
        return "none"
    value = read_export_config(p).get(FEATURE_PREPROCESS_KEY, "none")
    if value not in FEATURE_PREPROCESSES:
        raise UserError(
            f"{p / CONFIG_FILE}: {FEATURE_PREPROCESS_KEY} must be one of {', '.join(FEATURE_PREPROCESSES)}, "
            f"got {value!r}"
        )
    return value


def weight_shapes(d: Path, head: bool = False) -> dict[str, tuple[int, ...]]:
    """The tensor shapes model.safetensors declares, from its header alone (nothing is loaded): the
    language model's (`head`: a classifier's head tensors, "classifier.*", instead)."""
    p = Path(d) / WEIGHTS_FILE
    try:
        with open(p, "rb") as f:
            size = f.seek(0, 2)
            f.seek(0)
            n = int.from_bytes(f.read(8), "little")
            if not 0 < n <= size - 8:
                raise ValueError(f"a header of {n} bytes in a file of {size}")
            header = json.loads(f.read(n))
        return {
            k: tuple(int(x) for x in v["shape"])
            for k, v in header.items()
            if k != "__metadata__" and k.startswith(HEAD_PREFIX) == head
        }
    except (OSError, ValueError, TypeError, KeyError, AttributeError) as e:
        raise UserError(f"{p}: unreadable or corrupt safetensors file ({e})") from None


def read_weights(d: Path, model_cfg: ModelConfig) -> StateDict:
    """The exported state dict (safetensors: tensors only, nothing executed), checked against the config."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    p = Path(d) / WEIGHTS_FILE
    try:
        sd = {k: v for k, v in load_file(str(p)).items() if not k.startswith(HEAD_PREFIX)}
    except (SafetensorError, OSError, ValueError) as e:
        raise UserError(f"{p}: unreadable or corrupt safetensors file ({e})") from None
    check_state_dict(sd, model_cfg, str(p))
    return sd


def write_export(
    out: Path, sd: StateDict, config: dict, tokenizer_path: Path | None, files: dict[str, bytes] | None = None
) -> None:
    """Write (or replace) the export files in `out`, plus `files` (name -> content). The config goes last,
    so a folder that passes `is_export_dir` holds completely written weights and files."""
    from safetensors.torch import save

    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out}: exists and is not a folder")
    out.mkdir(parents=True, exist_ok=True)
    (out / CONFIG_FILE).unlink(missing_ok=True)
    sd = {k: v.contiguous() for k, v in sd.items()}
    atomic_write(out / WEIGHTS_FILE, save(sd, metadata={"format": EXPORT_FORMAT}))
    if tokenizer_path is not None:
        shutil.copyfile(tokenizer_path, out / TOKENIZER_FILE)
    else:
        (out / TOKENIZER_FILE).unlink(missing_ok=True)
    for name, data in (files or {}).items():
        atomic_write(out / name, data)
    config = {"format": EXPORT_FORMAT, "version": EXPORT_VERSION, **config}
    atomic_write(out / CONFIG_FILE, json.dumps(config, indent=1, sort_keys=True))
