"""app/probing/scores.py: F1, Jaccard and the threshold choice against scikit-learn and a brute force, on
fresh random inputs."""

from __future__ import annotations

import numpy as np
import pytest
from test_classifier_head import fresh_rng

from app.probing.scores import THRESHOLDS, best_thresholds, f1_per_label, jaccard, multilabel_scores


def test_f1_and_jaccard_equal_scikit_learn():
    from sklearn.metrics import f1_score, jaccard_score

    rng, seed = fresh_rng()
    Y = (rng.uniform(size=(200, 5)) < 0.3).astype(np.int64)
    P = (rng.uniform(size=(200, 5)) < 0.35).astype(np.int64)
    Y[0], P[0] = 0, 0  # a text with no gold and no predicted label: Jaccard 1 (SemEval E-c)
    np.testing.assert_allclose(f1_per_label(Y, P), f1_score(Y, P, average=None), err_msg=f"seed {seed}")
    assert jaccard(Y, P) == pytest.approx(jaccard_score(Y, P, average="samples", zero_division=1.0))
    s = multilabel_scores(Y, P, list("abcde"))
    assert s["micro_f1"] == pytest.approx(f1_score(Y, P, average="micro"))
    assert s["macro_f1"] == pytest.approx(f1_score(Y, P, average="macro"))
    assert f1_per_label(np.zeros((3, 1), np.int64), np.zeros((3, 1), np.int64))[0] == 1.0  # nothing to find


def test_the_threshold_is_the_best_f1_of_the_grid_nearest_one_half_on_ties():
    rng, seed = fresh_rng()
    probs = rng.uniform(size=(300, 3))
    Y = (probs + rng.normal(0, 0.3, size=probs.shape) > 0.6).astype(np.int64)
    thr, f1 = best_thresholds(probs, Y)
    for k in range(3):
        scores = [
            f1_per_label(Y[:, k : k + 1], (probs[:, k : k + 1] >= t).astype(np.int64))[0] for t in THRESHOLDS
        ]
        best = max(scores)
        ties = [t for t, s in zip(THRESHOLDS, scores) if s == best]
        assert f1[k] == best and thr[k] == min(ties, key=lambda t: abs(t - 0.5)), f"seed {seed}"
