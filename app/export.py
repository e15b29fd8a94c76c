"""Export any checkpoint to a folder that loads with torch alone: no DeepSpeed, no pickle.

    python app/export.py --checkpoint runs/quickstart --out exported/

The folder's format: `app.checkpoints.export_format`.

    from app.export import load_exported
    model, tokenizer, cfg = load_exported("exported/")   # model: app.model.lm.LanguageModel, eval mode
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: import the repo, not app/
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

from dataclasses import dataclass

import torch

from app.checkpoints.export_format import WEIGHTS_FILE, read_export_config, write_export
from app.checkpoints.loader import open_source
from app.common.cli import parse_config
from app.common.errors import UserError, exit_on_user_error
from app.model.lm import LanguageModel


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


def load_exported(d: str | Path, device: str | torch.device = "cpu") -> tuple[LanguageModel, object, object]:
    """(model, tokenizer, model_cfg) from an export folder, with torch, safetensors and sentencepiece only."""
    src = open_source(d)
    if src.kind != "export":
        raise UserError(f"{d}: not an export folder (no {WEIGHTS_FILE} + config.json)")
    return src.load_model(device), src.tokenizer(), src.model_cfg


def export(ckpt: str | Path, out: str | Path) -> Path:
    src = open_source(ckpt)
    sd = src.state_dict()
    tok = src.tokenizer()  # refuse to export a checkpoint whose tokenizer does not load
    config = {
        "model_config": src.model_cfg.to_dict(),
        "tokenizer": {**tok.meta(), **src.tokenizer_meta},
        "step": src.step,
        "trained_layout": src.trained_layout,
        "source": str(src.path.resolve()),
        "parameters": sum(v.numel() for v in sd.values()),
    }
    write_export(Path(out), sd, config, src.tokenizer_path)
    return Path(out)


@exit_on_user_error
def main(argv: list[str] | None = None) -> int:
    cfg = parse_config(ExportConfig, argv, __doc__)
    out = export(cfg.checkpoint, cfg.out)
    meta = read_export_config(out)
    size = (out / WEIGHTS_FILE).stat().st_size
    print(
        f"exported step {meta['step']} ({meta['parameters']:,} parameters, {size / 2**20:.1f} MiB) to {out}",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
