"""app/probing/features.py's per-token neuron trace (the heatmap's values): each value is the feature of the
text's prefix, and weight normalisation runs once per trace, not once per token (at 4096 wide it costs as
much as a step: 148 s against 11 s for app/transfer.py's four traces of an imported OpenAI-size model).
The features themselves are tested through app/transfer.py (tests/test_transfer.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_checkpoints_consolidate import tiny

from app.probing.features import batch_feature_sets, neuron_trace


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
