"""What transfer's flags may ask of the machine (app.common.resources' rule): counts larger than useful are
capped with a line, batches that cannot fit in memory are refused before they are built.

Bytes of a batch, estimated from the model's widths (app.model.memory): featurizing holds, one layer at a
time, a layer's input, projections, gates, states and output (2 in + 21 H floats per padded token); a text
longer than --batch-tokens is read in pieces of that many tokens with the state carried, so featurizing
needs the memory of one budget whatever the texts. Fine-tuning keeps every layer's activations for the
backward pass and their gradients, beside the trained copy of the model, its gradients, Adam's moments and
the best epoch's copy. Each is checked against the memory the work really takes (bench/memory.py, and
tests/test_probing_bounds.py at the small end): between 1x and 2x of it.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from app.classifier.features import length_batches
from app.common.resources import cap, check_fits
from app.model.first_call import first_call_bytes, op_paths_bytes
from app.model.memory import activation_floats_per_token, prefill_floats_per_token, step_bytes, weight_bytes
from app.probing.config import TransferConfig

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


def largest_batch(
    seqs: list[np.ndarray], batch_tokens: int, max_rows: int | None = None, piece: int | None = None
) -> tuple[int, int]:
    """(padded tokens, time steps) of the largest batch `length_batches` makes of `seqs`; with `piece`, a
    text longer than it is read in pieces of that many tokens (featurizing: `chunked_feature_sets`)."""
    lengths = np.asarray([len(s) for s in seqs], dtype=np.int64)
    sizes = [(len(b), int(lengths[b].max())) for b in length_batches(lengths, batch_tokens, max_rows)]
    sizes = [(rows, min(steps, piece) if piece and rows == 1 else steps) for rows, steps in sizes]
    rows, steps = max(sizes, key=lambda rs: rs[0] * rs[1])
    return rows * steps, max(steps for _, steps in sizes)


def featurize_bytes(seqs: list[np.ndarray], batch_tokens: int, model_cfg, layers: int, device=None) -> int:
    """Memory featurizing `seqs` through the first `layers` recurrent layers takes (app.model.memory): the
    largest batch under `batch_tokens`, a longer text read in pieces of that many tokens."""
    tokens, steps = largest_batch(seqs, batch_tokens, piece=batch_tokens)
    rows = max(1, tokens // max(1, steps))  # the GPU core's first call at that batch's bucket, where it runs
    first = first_call_bytes(model_cfg, rows, device, backward=False)
    return (
        tokens * 4 * prefill_floats_per_token(model_cfg, layers)
        + steps * step_bytes(model_cfg, device)
        + first
    )


FINETUNE_COPIES = 5  # the trained copy of the model, its gradients, Adam's two moments, the best epoch's copy


def finetune_bytes(
    seqs: list[np.ndarray], batch_tokens: int, rows: int, model_cfg, layers: int, device=None
) -> int:
    """Memory fine-tuning the first `layers` recurrent layers on `seqs` takes (app.model.memory): the largest
    batch's activations (at most `rows` texts, `batch_tokens` padded tokens, a longer text alone) and the
    model's trained copies."""
    tokens, steps = largest_batch(seqs, batch_tokens, rows)
    acts = tokens * 4 * activation_floats_per_token(model_cfg, layers, True) + steps * step_bytes(
        model_cfg, device
    )
    first = first_call_bytes(model_cfg, max(1, tokens // max(1, steps)), device, backward=True)  # (GPU core)
    first += op_paths_bytes(model_cfg, tokens, device)  # (its other paths)
    return acts + FINETUNE_COPIES * weight_bytes(model_cfg) + first


def check_batches(
    what: str, seqs: list[np.ndarray], cfg: TransferConfig, model_cfg, layers: int, training: bool, model=None
) -> None:
    """Refuse (one line) featurizing (or, `training`, fine-tuning) the first `layers` recurrent layers on
    `seqs` when it cannot fit in the memory free where `model` runs (the machine's, or its CUDA device's)."""
    device = next(model.parameters()).device if model is not None else None
    if training:
        need = finetune_bytes(seqs, cfg.batch_tokens, cfg.finetune_rows, model_cfg, layers, device)
    else:
        need = featurize_bytes(seqs, cfg.batch_tokens, model_cfg, layers, device)
    tokens, _ = largest_batch(seqs, cfg.batch_tokens, cfg.finetune_rows if training else None,
                              None if training else cfg.batch_tokens)  # fmt: skip
    longest = max(len(s) for s in seqs)
    hint = "lower --batch-tokens" + (" or --finetune-max-tokens" if training else "")
    if training and tokens == longest and longest > cfg.batch_tokens:
        hint = f"a text of {longest:,} tokens is a batch of its own; give --finetune-max-tokens"
    check_fits(f"{what}: a batch of {tokens:,} padded tokens", need, hint, device)
