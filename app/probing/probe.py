"""The probe: L1-regularised logistic regression on LM features, C chosen on validation, and the single
neuron that carries most of the label (Radford et al. 2017).

Features are standardised with the training rows' mean and deviation, so |weight| ranks neurons on one
scale and the solver converges (liblinear for two classes, saga's multinomial fit for more).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np

C_GRID = tuple(float(c) for c in 2.0 ** np.arange(-6, 5))  # 0.016 .. 16


def _logreg(C: float, l1: bool, seed: int, binary: bool):
    import sklearn
    from sklearn.linear_model import LogisticRegression

    major_minor = tuple(int(v) for v in sklearn.__version__.split(".")[:2])
    # scikit-learn 1.8 deprecated `penalty`: L1 is l1_ratio=1 there; older releases need penalty="l1"
    pen = ({"l1_ratio": 1.0} if major_minor >= (1, 8) else {"penalty": "l1"}) if l1 else {}
    # liblinear solves binary L1 exactly and fast; multi-class (multinomial) needs saga
    solver = "liblinear" if binary else "saga"
    return LogisticRegression(C=C, solver=solver, max_iter=1000, tol=1e-3, random_state=seed, **pen)


def _fit(X: np.ndarray, y: np.ndarray, C: float, l1: bool, seed: int):
    from sklearn.exceptions import ConvergenceWarning

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ConvergenceWarning)
        model = _logreg(C, l1, seed, binary=len(np.unique(y)) <= 2).fit(X, y)
    return model, not any(issubclass(w.category, ConvergenceWarning) for w in caught)


@dataclass(frozen=True, slots=True)
class Probe:
    C: float
    val_accuracy: dict[float, float]  # per C tried
    train_accuracy: float
    test_accuracy: float
    nonzero: int  # neurons with a non-zero weight for some class
    top: list[dict]  # [{"neuron", "weight" (per class for multi-class)}], by |weight|
    single: dict  # the top neuron alone: {"neuron", "test_accuracy", "train_accuracy", "thresholds"}
    converged: bool
    test_pred: np.ndarray


def _single_neuron(neuron: int, tr: tuple, te: tuple, seed: int) -> dict:
    """Accuracy of one neuron alone: a 1-feature logistic regression (thresholds fitted on train)."""
    (Xtr, ytr), (Xte, yte) = tr, te
    model, _ = _fit(Xtr[:, [neuron]], ytr, 1e4, l1=False, seed=seed)  # ~unregularised
    w, b = model.coef_[:, 0], model.intercept_
    # binary: the decision is w x + b = 0, i.e. one threshold on the neuron's (standardised) value
    thresholds = [float(-b[0] / w[0])] if len(w) == 1 and w[0] != 0 else None
    return {
        "neuron": int(neuron),
        "train_accuracy": float(model.score(Xtr[:, [neuron]], ytr)),
        "test_accuracy": float(model.score(Xte[:, [neuron]], yte)),
        "threshold_standardised": thresholds,
    }


def fit_probe(
    train: tuple, val: tuple, test: tuple, top_k: int, seed: int
) -> tuple[Probe, np.ndarray, np.ndarray]:
    """(X, y) triples, raw features -> (Probe, feature mean, feature std) (standardised with train's stats)."""
    mean, std = train[0].mean(0), train[0].std(0) + 1e-6
    Xtr, Xva, Xte = ((X - mean) / std for X in (train[0], val[0], test[0]))
    ytr, yva, yte = train[1], val[1], test[1]
    val_acc = {C: float(_fit(Xtr, ytr, C, True, seed)[0].score(Xva, yva)) for C in C_GRID}
    best_C = max(C_GRID, key=lambda C: (val_acc[C], -C))  # ties: the sparser (smaller C) model
    # refit on train + validation rows with the chosen C, as is usual once C is fixed
    model, converged = _fit(np.concatenate([Xtr, Xva]), np.concatenate([ytr, yva]), best_C, True, seed)
    coef = model.coef_  # (1 or K, H)
    strength = np.abs(coef).max(0)  # (H,)
    order = np.argsort(-strength, kind="stable")[:top_k]
    top = [
        {"neuron": int(n), "weight": float(coef[0, n]) if len(coef) == 1 else [float(v) for v in coef[:, n]]}
        for n in order
        if strength[n] > 0
    ]
    single = _single_neuron(int(order[0]), (Xtr, ytr), (Xte, yte), seed)
    n, thr = single["neuron"], single.pop("threshold_standardised")
    single["threshold"] = [float(t * std[n] + mean[n]) for t in thr] if thr else None  # raw neuron value
    probe = Probe(
        C=best_C,
        val_accuracy=val_acc,
        train_accuracy=float(model.score(Xtr, ytr)),
        test_accuracy=float(model.score(Xte, yte)),
        nonzero=int((strength > 0).sum()),
        top=top,
        single=single,
        converged=converged,
        test_pred=model.predict(Xte),
    )
    return probe, mean, std
