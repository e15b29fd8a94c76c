"""The probe: standardisation that leaves near-constant features alone, a line per C, the chosen C refit."""

from __future__ import annotations

import numpy as np

from app.probing.probe import C_GRID, fit_probe


def test_a_saturated_feature_is_not_blown_up_and_every_c_is_a_line():
    """A max-pooled tanh unit that is 1.0 on every text but one: dividing by its own deviation + 1e-6 made
    that one value ~30 (thousands on real sets) and stalled liblinear for over 10 minutes at one C."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(1000, 8)).astype(np.float32)
    X[:, 3] = 1.0
    X[0, 3] = 0.999
    y = (X[:, 0] + 0.3 * rng.normal(size=1000) > 0).astype(np.int64)
    lines: list[str] = []
    split = ((X[:800], y[:800]), (X[800:900], y[800:900]), (X[900:], y[900:]))
    probe, mean, scale = fit_probe(*split, 3, 0, "max_hidden", lines.append)
    assert np.abs((X[:800] - mean) / scale)[:, 3].max() < 1
    assert len(lines) == len(C_GRID) + 1  # each C of the grid, then the refit at the chosen one
    assert lines[0].startswith("probe max_hidden: C 0.015625: validation accuracy ")
    assert all(" iterations, " in ln and (" converged, " in ln or "not converged" in ln) for ln in lines)
    assert lines[-1].startswith(f"probe max_hidden: C {probe.C:g}: refit on train + validation")
    assert set(probe.converged_by_C) == set(C_GRID) and probe.test_accuracy > 0.85
    assert probe.top[0]["neuron"] == 0 and probe.single["neuron"] == 0
