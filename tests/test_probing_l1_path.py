"""The L1 path: scikit-learn's objective, reached from a warm start, within a bound on the iterations."""

from __future__ import annotations

import os

import numpy as np
import pytest

from app.probing.l1_path import l1_path


def _objective(X, y, coef, intercept, C) -> float:
    """sum of the losses + |W|_1 / C: scikit-learn's L1 objective divided by C (the intercept unpenalised)."""
    Z = X @ coef.T + intercept
    if coef.shape[0] == 1:
        loss = np.logaddexp(0.0, -(2 * y - 1) * Z[:, 0]).sum()
    else:
        loss = (np.logaddexp.reduce(Z, axis=1) - Z[np.arange(len(y)), y]).sum()
    return float(loss + np.abs(coef).sum() / C)


@pytest.mark.parametrize("classes", [2, 3])
def test_the_path_reaches_the_optimum_scikit_learn_reaches(classes):
    """The oracle: scikit-learn's saga run to a tight tolerance (it also leaves the intercept unpenalised)."""
    from sklearn.linear_model import LogisticRegression

    rng = np.random.default_rng(0)
    X = rng.normal(size=(300, 6))
    w = rng.normal(size=(6, classes))
    y = (X @ w + rng.normal(scale=0.5, size=(300, classes))).argmax(1)
    for fit in l1_path(X, y, classes, (0.05, 0.5, 5.0), max_iter=20000, tol=1e-3):
        assert fit.converged
        pen = (
            {"l1_ratio": 1.0}
            if tuple(map(int, __import__("sklearn").__version__.split(".")[:2])) >= (1, 8)
            else {"penalty": "l1"}
        )
        ref = LogisticRegression(C=fit.C, solver="saga", tol=1e-10, max_iter=100_000, **pen).fit(X, y)
        ours = _objective(X, y, fit.coef, fit.intercept, fit.C)
        theirs = _objective(X, y, ref.coef_, ref.intercept_, fit.C)
        assert ours <= theirs * (1 + 1e-4), (fit.C, ours, theirs)
        assert (fit.predict(X) == ref.predict(X)).mean() > 0.98


def test_every_c_stops_at_its_iteration_bound_and_says_so():
    rng = np.random.default_rng(1)
    X = rng.normal(size=(200, 5))
    X[:, 1] = X[:, 0] + 1e-3 * rng.normal(size=200)  # nearly collinear: slow to converge
    y = (X[:, 0] > 0).astype(np.int64)
    seen = []
    fits = l1_path(X, y, 2, (16.0, 1.0), seen.append, max_iter=3)
    assert [f.C for f in fits] == [16.0, 1.0] and [f.C for f in seen] == [1.0, 16.0]  # solved small C first
    assert all(f.iterations == 3 and not f.converged for f in fits)
    warm = l1_path(X, y, 2, (1.0,), start=l1_path(X, y, 2, (1.0,), max_iter=5000)[0], max_iter=5000)[0]
    assert warm.converged and warm.iterations < 50  # started at its own solution


def test_one_vs_rest_labels_on_one_path_each_reach_their_own_optimum():
    """Multi-label: a 0/1 matrix of labels solved as one path (app/probing/multilabel.py) gives each label
    the objective its own binary path reaches: the sum over labels is separable."""
    rng = np.random.default_rng(int.from_bytes(os.urandom(4), "little"))
    X = rng.normal(size=(300, 6))
    Y = (X @ rng.normal(size=(6, 3)) + rng.normal(scale=0.7, size=(300, 3)) > 0.3).astype(np.int64)
    joint = l1_path(X, Y, 2, (0.05, 0.5, 5.0), max_iter=20000, tol=1e-3)
    for fit in joint:
        assert fit.converged and fit.coef.shape == (3, 6)
        for k in range(3):
            alone = l1_path(X, Y[:, k], 2, (fit.C,), max_iter=20000, tol=1e-3)[0]
            ours = _objective(X, Y[:, k], fit.coef[k : k + 1], fit.intercept[k : k + 1], fit.C)
            theirs = _objective(X, Y[:, k], alone.coef, alone.intercept, fit.C)
            assert ours == pytest.approx(theirs, rel=1e-4), (fit.C, k)
