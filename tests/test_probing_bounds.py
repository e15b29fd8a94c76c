"""Transfer's counts: capped at what is useful in one line; a batch that cannot fit refused before it exists."""

from __future__ import annotations

import numpy as np
import pytest

from app.common.errors import UserError
from app.common.resources import available_memory
from app.model.config import debug_config
from app.probing.bounds import cap_counts, check_batches
from app.probing.config import TransferConfig


def test_counts_larger_than_useful_are_capped_in_one_line_each():
    cfg = TransferConfig(
        checkpoint="c", train="t", test="t", top_k=10**6, heatmap_texts=10**6, finetune_rows=10**9
    )
    lines: list[str] = []
    cap_counts(cfg, 64, {"train": 80, "test": 24}, lines.append)
    assert (cfg.top_k, cfg.heatmap_texts, cfg.finetune_rows) == (64, 24, 80)
    assert lines == [
        "--top-k 1000000 capped at 64: the features have 64 columns",
        "--heatmap-texts 1000000 capped at 24: --test has 24 rows",
        "--finetune-rows 1000000000 capped at 80: --train has 80 rows",
    ]
    cap_counts(cfg, 64, {"train": 80, "test": 2000}, lines.append)
    assert cfg.heatmap_texts == 24 and len(lines) == 3  # within the caps: nothing said


def test_a_batch_that_cannot_fit_is_refused_before_it_is_built():
    """--finetune-max-tokens 0 (whole texts) and one text longer than the free memory can train on: one line
    naming the flag to give, before any tensor of that size exists (the ids alone are a few MB here)."""
    free = available_memory()
    assert free is not None
    model_cfg = debug_config(vocab_size=259)
    cfg = TransferConfig(checkpoint="c", train="t", test="t", finetune_max_tokens=0)
    per_token = 4 * (2 * 32 + 32 * 64 * 2)  # bounds.check_batches' estimate for the debug model, 2 layers
    seqs = [np.zeros(8, np.int64)] * 10 + [np.zeros(2 * free // per_token, np.int64)]
    with pytest.raises(UserError) as e:
        check_batches("fine-tuning on --train", seqs, cfg, model_cfg, 2, training=True)
    assert str(e.value).startswith(
        f"fine-tuning on --train: a batch of {len(seqs[-1]):,} padded tokens needs about"
    )
    assert "is a batch of its own; give --finetune-max-tokens" in str(e.value)
    check_batches("fine-tuning on --train", seqs[:10], cfg, model_cfg, 2, training=True)  # these fit
