"""data_prep/bounds.py: a worker's memory for a block, estimated with the tokens its tokenizer makes of
the input, against what encoding the block really takes."""

from __future__ import annotations

import pytest
from measured import check_estimate


# `long`: a child process measured against the estimate, seconds each (bench/memory.py measures the same
# works; the default run keeps the fine-tuning estimate's measurement, tests/test_probing_bounds.py); what
# only this test runs is the measurement of a data prep worker's block estimate
@pytest.mark.long
def test_the_block_estimate_holds_what_a_worker_takes():
    """A block of bytes (a token a byte: 24 bytes a byte of text measured, where base 2652e8d counted 11 for
    any tokenizer) and of a 4096-piece SentencePiece (a quarter of the tokens: 10.5 bytes a byte)."""
    check_estimate("prep_block", block_mb=4, tokenizer="byte")
    check_estimate("prep_block", block_mb=6, tokenizer="sentencepiece")
