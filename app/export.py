"""Export any checkpoint to a folder that loads with torch alone (no DeepSpeed, no pickle) and with
`transformers`, with a model card (README.md) written from the run's config, data and evaluation.

    python app/export.py --checkpoint runs/quickstart --out exported/

The folder's format: `app.checkpoints.export_format` (ours) and `app.checkpoints.hf_format` (transformers).

    from app.export import load_exported
    model, tokenizer, cfg = load_exported("exported/")   # model: app.model.lm.LanguageModel, eval mode

    from transformers import AutoModelForCausalLM, AutoTokenizer    # pip install -e '.[hf]'
    model = AutoModelForCausalLM.from_pretrained("exported/", trust_remote_code=True)
    tokenizer = AutoTokenizer.from_pretrained("exported/", trust_remote_code=True)
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: import the repo, not app/
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

from dataclasses import dataclass

import torch

from app.checkpoints.export_format import WEIGHTS_FILE, is_our_export, read_export_config, write_export
from app.checkpoints.hf_check import check_hf_export
from app.checkpoints.hf_format import hf_config, hf_files, import_transformers
from app.checkpoints.loader import Source, open_source
from app.checkpoints.model_card import model_card
from app.checkpoints.run_info import read_run_info
from app.common import outputs
from app.common.cli import parse_config
from app.common.errors import UserError, exit_on_user_error
from app.common.logs import heartbeat
from app.common.numbers import check_numbers
from app.model.lm import LanguageModel


@dataclass(kw_only=True, slots=True)
class ExportConfig:
    checkpoint: str = ""
    """A run directory (its latest complete checkpoint), <run>/best (the checkpoint with the lowest validation
    loss), its checkpoints/ folder, or one step_XXXXXXXX folder."""
    out: str = ""
    """Folder to write: created whole, or an earlier export's files replaced (a folder holding files
    mlstm-ds did not write gets the export in its subfolder export/)."""
    check_hf: bool = False
    """Then load the folder with transformers (AutoModelForCausalLM, AutoTokenizer; the optional extra hf)
    and compare its logits and token ids with this repository's on random ids and a probe text."""

    def __post_init__(self) -> None:
        check_numbers(self)
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


def source_name(src: Source) -> str:
    """Where the export came from, without the machine's paths: "<run>/checkpoints/<tag>" or the folder's name."""
    p = src.path.resolve()
    return f"{p.parent.parent.name}/{p.parent.name}/{p.name}" if p.parent.name == "checkpoints" else p.name


def export(ckpt: str | Path, out: str | Path) -> Path:
    src, out = open_source(ckpt), Path(out)
    sd = src.state_dict()
    tok = src.tokenizer()  # refuse to export a checkpoint whose tokenizer does not load
    tok_meta = {**tok.meta(), **src.tokenizer_meta}
    parameters = sum(v.numel() for v in sd.values())
    config = {
        "model_config": src.model_cfg.to_dict(),
        "tokenizer": tok_meta,
        "step": src.step,
        "trained_layout": src.trained_layout,
        "source": source_name(src),
        "parameters": parameters,
        **hf_config(src.model_cfg, tok_meta),
    }
    folder = out.name or "."
    card = model_card(
        src.model_cfg, tok_meta, parameters, src.step, src.trained_layout, read_run_info(src), folder
    )
    files = {**hf_files(tok_meta), "README.md": card.encode()}
    write_export(out, sd, config, src.tokenizer_path, files)
    return out


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


@exit_on_user_error
def main(argv: list[str] | None = None) -> int:
    cfg = parse_config(ExportConfig, argv, __doc__)
    cfg.out = str(
        outputs.output_folder(
            "--out", cfg.out, [("--checkpoint", cfg.checkpoint)], "export", is_our_export, _say
        )
    )
    if cfg.check_hf:
        import_transformers("--check-hf")  # a missing extra fails before any work
    out = export(cfg.checkpoint, cfg.out)
    meta = read_export_config(out)
    size = (out / WEIGHTS_FILE).stat().st_size
    print(
        f"exported step {meta['step']} ({meta['parameters']:,} parameters, {size / 2**20:.1f} MiB) to {out}",
        flush=True,
    )
    if cfg.check_hf:
        with heartbeat("--check-hf: loading the export with transformers and comparing it with ours", _say):
            diff = check_hf_export(out, "--check-hf")
        print(
            f"transformers loads it: logits within {diff:.1e} of this repository's, same token ids",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
