"""app/probing/features.py: the per-token neuron trace (the heatmap's values) is each prefix's feature, with
weight normalisation once per trace, not once per token (at 4096 wide it costs as much as a step: 148 s
against 11 s for app/transfer.py's four traces of an imported OpenAI-size model); a text longer than
--batch-tokens, read in pieces with the state carried, gives the features it gives read at once. The features
themselves are checked against a float64 reference through app/transfer.py (tests/test_transfer.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_checkpoints_consolidate import tiny

from app.classifier.features import batch_feature_sets
from app.classifier.spec import FEATURES
from app.model.config import debug_config
from app.model.lm import LanguageModel
from app.probing.features import featurize_sets, neuron_trace


@pytest.mark.parametrize("kind", ["final_cell", "final_hidden"])
def test_neuron_trace_is_the_prefix_features_with_weight_norm_once(kind, monkeypatch):
    model = tiny(weight_norm=True).eval()
    ids = np.random.default_rng(0).integers(3, 259, size=11)
    probed = model.recurrent[1]
    calls = []
    real = probed.weights
    monkeypatch.setattr(probed, "weights", lambda: calls.append(1) or real())  # counts, then the real one
    trace = neuron_trace(model, ids, kind, 1, 5)
    assert len(calls) == 1
    with torch.no_grad():
        for t in range(len(ids)):
            prefix = torch.as_tensor(ids[: t + 1])[None]
            want = batch_feature_sets(model, prefix, torch.tensor([t + 1]), [1])[kind][0, 5]
            assert trace[t] == pytest.approx(float(want), abs=1e-5)


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
