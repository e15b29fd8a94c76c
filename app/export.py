"""Export any checkpoint to a folder that loads with torch alone: no DeepSpeed, no pickle.

    python app/export.py --checkpoint runs/quickstart --out exported/

The folder holds
    model.safetensors   the full float32 weights, keys "{i}.{name}" (see app.parallel.pipeline)
    config.json         {"format": "mlstm-ds-export", "version": 1, model_config, tokenizer, step, ...}
    tokenizer.model     the SentencePiece model (absent for the byte tokenizer)

    from app.export import load_exported
    model, tokenizer, cfg = load_exported("exported/")   # model: app.model.lm.InferenceModel, eval mode
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: import the repo, not app/
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

import json
import os
import shutil
from dataclasses import dataclass

import torch

from app.common.cli import parse_config
from app.common.errors import UserError, exit_on_user_error
from app.model.config import ModelConfig

EXPORT_FORMAT = "mlstm-ds-export"
EXPORT_VERSION = 1
WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"
TOKENIZER_FILE = "tokenizer.model"


@dataclass(kw_only=True, slots=True)
class ExportConfig:
    checkpoint: str = ""
    """A run directory (its latest complete checkpoint), its checkpoints/ folder, or one step_XXXXXXXX folder."""
    out: str = ""
    """Folder to write (created; existing export files in it are replaced)."""

    def __post_init__(self) -> None:
        if not self.checkpoint:
            raise ValueError("--checkpoint is required (a run directory or a checkpoint folder)")
        if not self.out:
            raise ValueError("--out is required (the folder to write the export to)")


def is_export_dir(p: Path) -> bool:
    return (p / WEIGHTS_FILE).is_file() and (p / CONFIG_FILE).is_file()


def read_export_config(d: Path) -> dict:
    p = Path(d) / CONFIG_FILE
    try:
        cfg = json.loads(p.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise UserError(f"{p}: unreadable export config ({e.__class__.__name__})") from None
    if not isinstance(cfg, dict) or cfg.get("format") != EXPORT_FORMAT:
        raise UserError(f"{p}: not an {EXPORT_FORMAT} config")
    if cfg.get("version") != EXPORT_VERSION:
        raise UserError(
            f"{p}: export version {cfg.get('version')!r}, this version reads {EXPORT_VERSION}: export again"
        )
    if not isinstance(cfg.get("tokenizer"), dict):
        raise UserError(f"{p}: no tokenizer entry")
    return cfg


def read_weights(d: Path, model_cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """The exported state dict (safetensors: tensors only, nothing executed), checked against the config."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    from app.checkpoints.consolidate import check_state_dict

    p = Path(d) / WEIGHTS_FILE
    try:
        sd = load_file(str(p))
    except (SafetensorError, OSError, ValueError) as e:
        raise UserError(f"{p}: unreadable or corrupt safetensors file ({e})") from None
    check_state_dict(sd, model_cfg, str(p))
    return sd


def load_exported(d: str | Path, device: str | torch.device = "cpu"):
    """(model, tokenizer, model_cfg) from an export folder, with torch, safetensors and sentencepiece only."""
    from app.checkpoints.loader import open_source
    from app.model.lm import InferenceModel

    src = open_source(d)
    if src.kind != "export":
        raise UserError(f"{d}: not an export folder (no {WEIGHTS_FILE} + {CONFIG_FILE})")
    sd = read_weights(src.path, src.model_cfg)
    with torch.device("meta"):
        model = InferenceModel(src.model_cfg)
    model.load_state_dict(sd, strict=True, assign=True)
    return model.to(device).eval(), src.tokenizer(), src.model_cfg


def export(ckpt: str | Path, out: str | Path) -> Path:
    from safetensors.torch import save_file

    from app.checkpoints.loader import open_source

    src = open_source(ckpt)
    sd = {k: v.contiguous() for k, v in src.state_dict().items()}
    tok = src.tokenizer()  # refuse to export a checkpoint whose tokenizer does not load
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out}: exists and is not a folder")
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / (WEIGHTS_FILE + f".tmp{os.getpid()}")
    save_file(sd, str(tmp), metadata={"format": EXPORT_FORMAT})
    os.replace(tmp, out / WEIGHTS_FILE)
    if src.tokenizer_path is not None:
        shutil.copyfile(src.tokenizer_path, out / TOKENIZER_FILE)
    elif (out / TOKENIZER_FILE).exists():
        (out / TOKENIZER_FILE).unlink()
    cfg = {
        "format": EXPORT_FORMAT,
        "version": EXPORT_VERSION,
        "model_config": src.model_cfg.to_dict(),
        "tokenizer": {**tok.meta(), **src.tokenizer_meta},
        "step": src.step,
        "trained_layout": src.trained_layout,
        "source": str(src.path.resolve()),
        "parameters": sum(v.numel() for v in sd.values()),
    }
    (out / CONFIG_FILE).write_text(json.dumps(cfg, indent=1, sort_keys=True))
    return out


@exit_on_user_error
def main(argv: list[str] | None = None) -> int:
    cfg = parse_config(ExportConfig, argv, __doc__)
    out = export(cfg.checkpoint, cfg.out)
    meta = json.loads((out / CONFIG_FILE).read_text())
    size = (out / WEIGHTS_FILE).stat().st_size
    print(
        f"exported step {meta['step']} ({meta['parameters']:,} parameters, {size / 2**20:.1f} MiB) to {out}",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
