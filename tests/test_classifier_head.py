"""app/classifier/head.py: a kept classifier's logits, probabilities and decisions against a float64
reference on fresh random inputs."""

from __future__ import annotations

import os

import numpy as np
import pytest

from app.classifier.head import Head
from app.probing.l1_path import Fit


def fresh_rng() -> tuple[np.random.Generator, int]:
    seed = int.from_bytes(os.urandom(4), "little")
    return np.random.default_rng(seed), seed


def head(method: str, multi: bool, rows: int, d: int, rng, labels: list[str]) -> Head:
    dt = np.float32 if method == "finetune" else np.float64
    return Head(
        method=method,
        multi_label=multi,
        labels=labels,
        feature="mean_hidden",
        layers=[0],
        mean=rng.normal(size=d).astype(np.float32) if method == "probe" else np.zeros(d, np.float32),
        scale=rng.uniform(0.5, 2, d).astype(np.float32) if method == "probe" else np.ones(d, np.float32),
        weight=rng.normal(size=(rows, d)).astype(dt),
        bias=rng.normal(size=rows).astype(dt),
        thresholds=rng.uniform(0.1, 0.9, rows) if multi else None,
        max_tokens=0,
        top_neurons=[0],
    )


@pytest.mark.parametrize(
    ("method", "multi", "rows", "labels"),
    [
        ("probe", False, 1, ["neg", "pos"]),  # a two-class probe: one weight row
        ("probe", False, 3, ["a", "b", "c"]),
        ("finetune", False, 2, ["neg", "pos"]),
        ("probe", True, 4, ["w", "x", "y", "z"]),
        ("finetune", True, 3, ["x", "y", "z"]),
    ],
)
def test_probabilities_and_decisions_match_a_float64_reference(method, multi, rows, labels):
    rng, seed = fresh_rng()
    d, n = 17, 50
    h = head(method, multi, rows, d, rng, labels)
    X = rng.normal(size=(n, d)).astype(np.float32)
    Z = h.logits(X)
    ref = ((X.astype(np.float64) - h.mean) / h.scale) @ h.weight.astype(np.float64).T + h.bias
    # float32 features and standardisation (as the probe was fitted), float64 weights: float32's precision
    np.testing.assert_allclose(Z, ref, rtol=1e-4, atol=1e-5, err_msg=f"seed {seed}")
    P = h.probabilities(Z)
    if multi:
        want = 1 / (1 + np.exp(-ref))
        np.testing.assert_allclose(P, want, rtol=1e-5, atol=1e-7, err_msg=f"seed {seed}")
        np.testing.assert_array_equal(h.decide(Z), (h.thresholds <= P).astype(np.int64))
        return
    full = np.concatenate([np.zeros((n, 1)), ref], 1) if rows == 1 else ref
    want = np.exp(full - full.max(1, keepdims=True))
    want /= want.sum(1, keepdims=True)
    np.testing.assert_allclose(P, want, rtol=1e-5, atol=1e-7, err_msg=f"seed {seed}")
    np.testing.assert_allclose(P.sum(1), 1.0, rtol=1e-12)
    np.testing.assert_array_equal(h.decide(Z), full.argmax(1))


def test_a_probe_head_decides_exactly_as_the_fit_it_was_kept_from():
    """The accuracy transfer.json reports (Fit.predict on standardised features) and the kept head's
    decisions are the same arithmetic: equal on every row, not just close."""
    rng, seed = fresh_rng()
    d = 12
    X = rng.normal(size=(500, d)).astype(np.float32)
    mean, scale = X.mean(0), np.maximum(X.std(0), 0.1)
    for k in (1, 3):
        fit = Fit(1.0, rng.normal(size=(k, d)), rng.normal(size=k), 1, True, 0.0)
        h = Head("probe", False, [str(i) for i in range(max(k, 2))], "final_cell", [0], mean, scale,
                 fit.coef, fit.intercept, None, 0, [0])  # fmt: skip
        np.testing.assert_array_equal(
            h.decide(h.logits(X)), fit.predict((X - mean) / scale), err_msg=f"{seed}"
        )
