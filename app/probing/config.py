"""What `app/transfer.py` does: one typed config, checked at start-up (errors name the flag)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

from app.classifier.spec import FEATURES, parse_layers
from app.common.numbers import check_numbers

Feature = Literal["auto", "final_cell", "final_hidden", "mean_hidden", "max_hidden"]  # auto: each of FEATURES


@dataclass(kw_only=True, slots=True)
class TransferConfig:
    checkpoint: str = ""
    """A run directory (its latest complete checkpoint), <run>/best (the checkpoint with the lowest validation
    loss), its checkpoints/ folder, a step_XXXXXXXX folder, or an export folder."""
    train: str = ""
    """Labelled training texts: a .csv, .jsonl/.json or .parquet file (read through `datasets`)."""
    test: str = ""
    """Labelled test texts (same format); every label must occur in --train."""
    validation: str | None = None
    """Labelled validation texts for choosing C (default: a seeded --val-fraction split of --train)."""
    text_field: str = "text"
    """Column holding the text."""
    label_field: list[str] = dataclasses.field(default_factory=lambda: ["label"])
    """Column holding the label (strings or ints, reported back by name). Multi-label: several columns
    (each a 0/1 or true/false indicator; the label is the column's name), or one column whose values are
    lists of labels (JSONL, Parquet): one-vs-rest probes with a threshold per label chosen on validation."""
    features: Feature = "auto"
    """final_cell (the cell state after each text's last token, as in the sentiment-neuron paper),
    final_hidden (the hidden state there), mean_hidden / max_hidden (the layer's output averaged / maxed
    over the text), or auto: each of them, the validation split picking the kind as it picks C."""
    layer: str = "-1"
    """Recurrent layer(s) to read: 0-based, -1 the last, a comma list (0,1) or all: the listed layers'
    features side by side. Layers above the highest are not run."""
    out: str | None = None
    """Output folder for transfer.json, the PNGs and the feature cache (default: <run>/transfer/<tag>,
    <export>/transfer)."""
    val_fraction: float = 0.2
    """Share of --train held out to choose C when --validation is not given."""
    seed: int = 0
    """Seed of the --train/validation split and of the solver."""
    top_k: int = 10
    """Neurons reported by |weight|."""
    batch_tokens: int = 16384
    """Featurizing and fine-tuning: padded tokens per batch (texts are sorted by length, so padding stays
    small)."""
    heatmap_texts: int = 4
    """Test texts drawn in the per-character heatmap of the top neuron."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """auto (cuda when available), cpu or cuda."""
    finetune_epochs: int = 4
    """Beside the probe, fine-tune the LM's layers (up to the highest of --layer) and a linear head on their
    mean output over the text for this many epochs; the best epoch on validation is kept, and the
    validation split picks probe or fine-tuned (0: the probe only)."""
    finetune_lr: float = 1e-3
    """Fine-tuning: AdamW learning rate of the LM's layers (the head's is 3x)."""
    finetune_rows: int = 32
    """Fine-tuning: texts per step (similar lengths; at most --batch-tokens padded tokens)."""
    finetune_max_tokens: int = 1024
    """Fine-tuning: each text read up to this many tokens, BOS included (its memory grows with the
    length); texts cut are counted in transfer.json (0: whole texts)."""
    drop_rare_labels: bool = False
    """Multi-label: leave out (said in one line) each label a split cannot hold: fewer than two positive
    rows in --train when validation is split from it, none in --validation or in --test. Without it such a
    label stops the run before featurising (one missing from --test only is said)."""
    finetune_from_scratch: bool = False
    """Fine-tune the same architecture from a fresh initialisation instead: the control that shows what
    the LM's pretraining adds."""

    def __post_init__(self) -> None:
        check_numbers(self)
        for name in ("checkpoint", "train", "test"):
            if not getattr(self, name):
                raise ValueError(f"--{name} is required")
        if not self.label_field or len(set(self.label_field)) != len(self.label_field):
            raise ValueError(f"--label-field: give one or more distinct columns, got {self.label_field}")
        if self.features not in ("auto", *FEATURES):
            raise ValueError(f"--features must be one of auto, {', '.join(FEATURES)}, got {self.features!r}")
        if self.layer.strip() != "all":
            parse_layers(self.layer, 1 << 30)  # the spelling; the range is checked against the model
        if not 0.0 < self.val_fraction < 1.0:
            raise ValueError(f"--val-fraction must be in (0, 1), got {self.val_fraction}")
        if not self.finetune_lr > 0:
            raise ValueError(f"--finetune-lr must be > 0, got {self.finetune_lr}")
        if self.finetune_from_scratch and self.finetune_epochs == 0:
            raise ValueError("--finetune-from-scratch needs --finetune-epochs >= 1")
        for name in ("top_k", "batch_tokens", "finetune_rows"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        if self.heatmap_texts < 0:
            raise ValueError(f"--heatmap-texts must be >= 0, got {self.heatmap_texts}")
        if self.device not in ("auto", "cpu", "cuda"):
            raise ValueError(f"--device must be auto, cpu or cuda, got {self.device!r}")
