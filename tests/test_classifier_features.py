"""app/classifier/features.py: what a kept classifier reads, one text at a time or in pieces. A text longer
than the budget is read in pieces with every layer's state carried, on both paths (a probe's prefill, a
fine-tuned head's training path) and on both cores, and gives the features one pass gives (float64, fresh
random weights and texts); every piece says how many tokens it read, so a long text is never silent."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from app.classifier.features import batch_feature_sets, pooled, read_features
from app.model.config import debug_config
from app.model.lm import LanguageModel


@pytest.mark.parametrize("core", ["auto", "python"])
@pytest.mark.parametrize(
    ("method", "kind"), [("probe", "final_cell"), ("probe", "max_hidden"), ("finetune", "mean_hidden")]
)
def test_long_texts_in_pieces_give_the_features_of_one_pass(core, method, kind):
    seed = int.from_bytes(os.urandom(4), "little")
    torch.manual_seed(seed)
    model = LanguageModel(debug_config(vocab_size=259, core=core)).double().eval()  # 2 layers
    rng = np.random.default_rng(seed)
    ids = [rng.integers(3, 259, n).astype(np.int64) for n in (5, 300, 41, 17)]
    steps: list[int] = []
    got = read_features(model, ids, (method, kind, [1, 0]), 32, 0, steps.append)
    assert sum(steps) == sum(len(s) for s in ids) and len(steps) >= 300 // 32  # a step a piece
    for i, s in enumerate(ids):
        x, n = torch.from_numpy(s)[None], torch.tensor([len(s)])
        with torch.no_grad():
            if method == "finetune":
                want = pooled(model, x, n, [1, 0])
            else:
                want = batch_feature_sets(model, x, n, [1, 0])[kind]
        np.testing.assert_allclose(got[i], want[0].numpy(), rtol=1e-6, atol=1e-6, err_msg=f"seed {seed}")
