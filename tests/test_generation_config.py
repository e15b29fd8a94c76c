"""app/generation/config.py: the memory generation needs, against what it really takes."""

from __future__ import annotations

import pytest
from measured import check_estimate


# `long`: a child process measured against the estimate, seconds each (bench/memory.py measures the same
# works; the default run keeps the fine-tuning estimate's measurement, tests/test_probing_bounds.py); what
# only this test runs is the measurement of the generation estimate
@pytest.mark.long
def test_the_generation_estimate_holds_prefill_and_steps():
    """Many short prompts (the state, logits and sampling of every row through the steps) and fewer long
    ones (the prefill, a group at a time). Base 2652e8d took max(prefill, step) and a third of the prefill:
    101,049 prompts x 20 new tokens were admitted on 870 MiB and grew 2.6 GiB (0.55-0.6x here)."""
    check_estimate("generate", embed=64, hidden=256, rows=2000, prompt=20, new=20)
    check_estimate("generate", embed=64, hidden=256, layers=2, rows=100, prompt=400, new=20)
