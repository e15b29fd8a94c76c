"""app/probing/features.py: a text longer than --batch-tokens, read in pieces with the state carried, gives
the features it gives read at once (tests/test_transfer.py checks the features against a float64 reference)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from app.model.config import debug_config
from app.model.lm import LanguageModel
from app.probing.features import FEATURES, batch_feature_sets, featurize_sets


@pytest.mark.parametrize("core", ["auto", "python"])
def test_a_long_text_in_pieces_gives_the_features_of_one_pass(core):
    torch.manual_seed(0)
    model = LanguageModel(debug_config(vocab_size=259, core=core)).double().eval()  # 2 layers
    rng = np.random.default_rng(0)
    ids = [rng.integers(3, 259, n).astype(np.int64) for n in (5, 37, 250, 9)]
    whole = {k: [] for k in FEATURES}
    for s in ids:
        got = batch_feature_sets(model, torch.from_numpy(s)[None], torch.tensor([len(s)]), [0, 1])
        for k in FEATURES:
            whole[k].append(got[k][0].numpy())
    pieces = featurize_sets(model, ids, [0, 1], 16, 0)  # 250 tokens: 16 pieces of 16
    for k in FEATURES:
        np.testing.assert_allclose(
            pieces.features[k], np.stack(whole[k]).astype(np.float32), rtol=1e-6, atol=1e-6
        )
