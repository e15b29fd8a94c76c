"""What transfer's flags may ask of the machine (app.common.resources' rule): counts larger than useful are
capped with a line, batches that cannot fit in memory are refused before they are built.

Bytes per padded token of a batch, estimated from the model's widths: featurizing holds the embedding and,
one layer at a time, its input projections, gates and output (about 10 H floats); fine-tuning keeps every
layer's activations for the backward pass and their gradients (about 32 H floats a layer, 2 E for the
embedding). Estimates, checked only against the memory the machine has free: they stop a batch of 10^9
tokens, not a tight one.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from app.common.resources import cap, check_fits
from app.model.memory import activation_floats_per_token
from app.probing.config import TransferConfig
from app.probing.features import length_batches

MAX_HEATMAP_TEXTS = 32  # rows of the per-character figure: more are not readable (each is a stepped trace)


def cap_counts(
    cfg: TransferConfig, width: int, rows: dict[str, int], say: Callable[[str], None]
) -> TransferConfig:
    """--top-k at the features' columns, --heatmap-texts at --test's rows and a readable figure,
    --finetune-rows at the training rows: each cap one line."""
    cfg.top_k = cap("--top-k", cfg.top_k, [(width, f"the features have {width} columns")], say)
    test, train = rows["test"], rows["train"]
    cfg.heatmap_texts = cap(
        "--heatmap-texts",
        cfg.heatmap_texts,
        [(test, f"--test has {test} rows"), (MAX_HEATMAP_TEXTS, "a figure of more texts is not readable")],
        say,
    )
    cfg.finetune_rows = cap("--finetune-rows", cfg.finetune_rows, [(train, f"--train has {train} rows")], say)
    return cfg


def largest_batch(seqs: list[np.ndarray], batch_tokens: int, max_rows: int | None = None) -> int:
    """Padded tokens (rows x longest) of the largest batch `length_batches` makes of `seqs`."""
    lengths = np.asarray([len(s) for s in seqs], dtype=np.int64)
    return max(len(b) * int(lengths[b].max()) for b in length_batches(lengths, batch_tokens, max_rows))


def check_batches(
    what: str, seqs: list[np.ndarray], cfg: TransferConfig, model_cfg, layers: int, training: bool, model=None
) -> None:
    """Refuse (one line) batches of `seqs` that cannot fit in the memory free where `model` runs (the
    machine's, or its CUDA device's)."""
    per_token = 4 * activation_floats_per_token(model_cfg, layers, training)
    rows = cfg.finetune_rows if training else None
    tokens = largest_batch(seqs, cfg.batch_tokens, rows)
    longest = max(len(s) for s in seqs)
    hint = "lower --batch-tokens" + (" or --finetune-max-tokens" if training else "")
    if tokens == longest and longest > cfg.batch_tokens:
        hint = f"a text of {longest:,} tokens is a batch of its own; " + (
            "give --finetune-max-tokens" if training else "shorten the longest texts"
        )
    device = next(model.parameters()).device if model is not None else None
    check_fits(f"{what}: a batch of {tokens:,} padded tokens", tokens * per_token, hint, device)
