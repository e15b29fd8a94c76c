"""Bring the field's released mLSTM weights in as an export that every command reads (evaluate, generate,
transfer, train --init-from):

    mlstm-import --from openai DIR --out EXPORT                   # OpenAI's model/0.npy ... 14.npy
    mlstm-import --from sentiment-discovery mlstm.pt --out EXPORT  # NVIDIA's RNNModel state dict

DIR is the folder holding 0.npy ... 14.npy, or a checkout of generating-reviews-discovering-sentiment (its
model/ folder). The .pt file is read weights-only: nothing in it runs. The mapping and its traps (the gate
order, the byte ids, BOS and EOS, weight norm): docs/import.md.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: import the repo, not app/
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

from dataclasses import dataclass, field
from typing import Literal

from app.common import outputs
from app.common.cli import flag, parse_config
from app.common.errors import exit_on_user_error
from app.common.numbers import check_numbers

KINDS = ("openai", "sentiment-discovery")


@dataclass(kw_only=True, slots=True)
class ImportConfig:
    source: list[str] = field(
        default_factory=list, metadata=flag(name="from", nargs=2, metavar=("KIND", "PATH"))
    )
    """What to import: openai DIR (0.npy ... 14.npy, or DIR/model/) or sentiment-discovery FILE.pt (`from:
    [KIND, PATH]` in a --config file)."""
    out: str = ""
    """Folder to write the export to: created whole, or an earlier export's files replaced (a folder holding
    files mlstm-ds did not write gets it in its subfolder import/)."""
    feature_preprocess: Literal["openai", "none"] = "openai"
    """How app/transfer.py prepares a text before featurizing it with this model, recorded in the export's
    config.json: `openai` reads [BOS] + " " + text + " " (HTML entities unescaped, newlines as spaces,
    stripped), which is the sources' "\\n " + text + " " since BOS reads as "\\n"; `none`: the text as it is."""
    check_hf: bool = False
    """Then load the folder with transformers (the optional extra hf) and compare its logits and token ids
    with this repository's, as app/export.py --check-hf does."""

    def __post_init__(self) -> None:
        check_numbers(self)
        if not self.source:
            raise ValueError("--from KIND PATH is required: openai DIR or sentiment-discovery FILE.pt")
        if len(self.source) != 2:
            raise ValueError(f"--from: expects KIND PATH, got {self.source}")
        if self.kind not in KINDS:
            raise ValueError(f"--from: KIND must be one of {', '.join(KINDS)}, got {self.kind!r}")
        if not self.out:
            raise ValueError("--out is required (the folder to write the export to)")

    @property
    def kind(self) -> str:
        """`openai` or `sentiment-discovery`: the layout of the weights."""
        return self.source[0]

    @property
    def path(self) -> str:
        """The folder (openai) or the .pt file (sentiment-discovery) to read."""
        return self.source[1]


def run(cfg: ImportConfig) -> str:
    """Read, map and write; -> the line that says what was written."""
    from app.checkpoints.export_format import WEIGHTS_FILE
    from app.checkpoints.importing import write_import

    src, out = Path(cfg.path), Path(cfg.out)
    print(f"reading {cfg.kind} weights from {src}", flush=True)
    if cfg.kind == "openai":
        from app.checkpoints.import_openai import read_openai

        imported = read_openai(src)
    else:
        from app.checkpoints.import_sentiment_discovery import read_sentiment_discovery

        imported = read_sentiment_discovery(src)
    print("mapping: " + "; ".join(imported.notes), flush=True)
    model_cfg, parameters = write_import(imported, out, cfg.feature_preprocess)
    size = (out / WEIGHTS_FILE).stat().st_size
    return (
        f"imported {cfg.kind} {imported.source}: {model_cfg.num_layers} layer(s), hidden {model_cfg.hidden_dim}, "
        f"embedding {model_cfg.embed_dim}, {parameters:,} parameters ({size / 2**20:.1f} MiB) to {out} "
        f"(feature_preprocess {cfg.feature_preprocess})"
    )


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


@exit_on_user_error
def main(argv: list[str] | None = None) -> int:
    cfg = parse_config(ImportConfig, argv, __doc__)
    from app.checkpoints.export_format import is_our_export

    cfg.out = str(
        outputs.output_folder("--out", cfg.out, [("--from", cfg.path)], "import", is_our_export, _say)
    )
    if cfg.check_hf:
        from app.checkpoints.hf_format import import_transformers

        import_transformers("--check-hf")  # a missing extra fails before any work
    print(run(cfg), flush=True)
    if cfg.check_hf:
        from app.checkpoints.hf_check import check_hf_export

        diff = check_hf_export(Path(cfg.out), "--check-hf")
        print(
            f"transformers loads it: logits within {diff:.1e} of this repository's, same token ids",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
