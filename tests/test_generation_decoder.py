"""app/generation/decoder.py: prompts prefilled a group at a time (a long one in pieces, its state carried)
give the logits and states of one prefill of them all."""

from __future__ import annotations

import pytest
import torch

from app.generation.decoder import Decoder
from app.model.config import debug_config
from app.model.lm import LanguageModel


@pytest.mark.parametrize("budget", [1, 7, 40, 10_000])
def test_groups_and_pieces_give_one_prefills_logits_and_state(budget):
    torch.manual_seed(0)
    dec = Decoder(LanguageModel(debug_config(vocab_size=259)).double())
    lengths = torch.tensor([3, 17, 1, 9, 30, 2])
    ids = torch.randint(3, 259, (6, 30))
    want_logits, want_state = dec.prefill(ids, lengths)
    logits, state = dec.prefill_in_groups(ids, lengths, budget)
    torch.testing.assert_close(logits, want_logits, rtol=1e-10, atol=1e-10)
    for (h, c), (wh, wc) in zip(state, want_state, strict=True):
        torch.testing.assert_close(h, wh, rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(c, wc, rtol=1e-10, atol=1e-10)
