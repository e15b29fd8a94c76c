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
from app.common import outputs
from app.common.errors import UserError
from app.common.files import read_json_object
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


EXPORT_FILES = (
    WEIGHTS_FILE, CONFIG_FILE, TOKENIZER_FILE, "README.md", "configuration_mlstm.py", "modeling_mlstm.py",
    "tokenization_mlstm.py", "tokenizer_config.json", "generation_config.json",
)  # fmt: skip  # what write_export writes: in a folder of ours from before app.common.outputs' mark


def is_our_export(p: Path) -> bool:
    """An export or classifier folder this program wrote (its config says so): one it may write over."""
    if not is_export_dir(p):
        return False
    try:
        return json.loads((p / CONFIG_FILE).read_text()).get("format") in (EXPORT_FORMAT, CLASSIFIER_FORMAT)
    except (OSError, ValueError, AttributeError):
        return False


def write_export(
    out: Path,
    sd: StateDict,
    config: dict,
    tokenizer_path: Path | None,
    files: dict[str, bytes] | None = None,
    program: str = "mlstm-export",
    flag: str = "--out",
) -> None:
    """Write (or replace) the export folder `out`, plus `files` (name -> content), whole or not at all
    (app.common.outputs.new_folder): a new folder is built beside it and renamed into place, or an existing
    export's files are replaced with the config last, so a folder that passes `is_export_dir` holds
    completely written weights and files. A full disk is one line naming `flag`; nothing half-written
    stays."""
    from safetensors.torch import save_file

    if out.exists() and not out.is_dir():
        raise UserError(f"{flag} {out}: exists and is not a folder")
    sd = {k: v.contiguous() for k, v in sd.items()}
    config = {"format": EXPORT_FORMAT, "version": EXPORT_VERSION, **config}
    kept = (
        "nothing was written under that name (the partial folder is removed): free some space and run again"
    )
    with (
        outputs.disk_errors(flag, out, kept),
        outputs.new_folder(out, program, CONFIG_FILE, EXPORT_FILES, is_our_export) as stage,
    ):
        save_file(sd, str(stage / WEIGHTS_FILE), metadata={"format": EXPORT_FORMAT})
        if tokenizer_path is not None:
            shutil.copyfile(tokenizer_path, stage / TOKENIZER_FILE)
        for name, data in (files or {}).items():
            (stage / name).write_bytes(data)
        (stage / CONFIG_FILE).write_text(json.dumps(config, indent=1, sort_keys=True))
