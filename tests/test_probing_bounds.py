"""Transfer's counts: capped at what is useful in one line; a batch that cannot fit refused before it exists."""

from __future__ import annotations

import numpy as np
import pytest
from measured import check_estimate

from app.common.errors import UserError
from app.common.resources import available_memory
from app.model.config import debug_config
from app.model.memory import activation_floats_per_token
from app.probing.bounds import cap_counts, check_batches, featurize_bytes
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
    per_token = 4 * activation_floats_per_token(model_cfg, 2, True)
    seqs = [np.zeros(8, np.int64)] * 10 + [np.zeros(2 * free // per_token, np.int64)]
    with pytest.raises(UserError) as e:
        check_batches("fine-tuning on --train", seqs, cfg, model_cfg, 2, training=True)
    assert str(e.value).startswith(
        f"fine-tuning on --train: a batch of {len(seqs[-1]):,} padded tokens needs about"
    )
    assert "is a batch of its own; give --finetune-max-tokens" in str(e.value)
    check_batches("fine-tuning on --train", seqs[:10], cfg, model_cfg, 2, training=True)  # these fit


def test_featurizing_a_text_of_any_length_needs_the_memory_of_one_budget():
    """A text longer than the free memory could featurize at once (base 2652e8d refused it, after admitting
    texts whose real need was twice its estimate) is read in pieces of --batch-tokens with the state carried:
    its estimate is the budget's, and it is admitted."""
    free = available_memory()
    model_cfg = debug_config(vocab_size=259)
    cfg = TransferConfig(checkpoint="c", train="t", test="t")
    seqs = [np.zeros(8, np.int64), np.broadcast_to(np.int64(0), (free // 16,))]  # a length, no memory
    assert featurize_bytes(seqs, cfg.batch_tokens, model_cfg, 2) == featurize_bytes(
        [np.zeros(cfg.batch_tokens, np.int64)], cfg.batch_tokens, model_cfg, 2
    )
    check_batches("featurizing --train", seqs, cfg, model_cfg, 2, training=False)  # admitted


# `long`: a child process measured against the estimate, seconds each (bench/memory.py measures the same
# works; the default run keeps the fine-tuning estimate's measurement, tests/test_probing_bounds.py); what
# only this test runs is the measurement of the featurizing estimate
@pytest.mark.long
def test_the_featurizing_estimate_holds_what_featurizing_takes():
    """Measured in a child process (tests/measured.py): one long text read in pieces, and 200 texts of
    50-1200 tokens in length-sorted batches (their changing shapes held ~1.6x a batch's memory on glibc's
    heap before `steady_heap`; base 2652e8d's estimate was 0.31-0.58x of what these took)."""
    check_estimate("featurize", embed=64, hidden=256, rows=1, length=20000)
    check_estimate("featurize", embed=64, hidden=256, rows=200, length=[50, 1200], batch_tokens=8192)


def test_the_finetuning_estimate_holds_what_an_epoch_takes():
    check_estimate("finetune", embed=64, hidden=256, rows=8, length=1000, batch_tokens=8192)
