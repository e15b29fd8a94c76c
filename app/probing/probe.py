"""The probe: L1-regularised logistic regression on LM features, C chosen on validation, and the single
neuron that carries most of the label (Radford et al. 2017).

Features are standardised with the training rows' mean and deviation, so |weight| ranks neurons on one
scale and the solver converges. A column's deviation is floored at SCALE_FLOOR of the median column's:
max-pooled tanh outputs saturate, and dividing a near-constant column by its own tiny deviation (plus 1e-6,
as before) turned it into values in the thousands that dominated the fit and stalled liblinear for over
10 minutes. The C grid is one warm-started path with bounded iterations (app/probing/l1_path.py); each C
is one line (validation accuracy, non-zero weights, iterations, converged or not, seconds).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from app.probing.l1_path import l1_path

C_GRID = tuple(float(c) for c in 2.0 ** np.arange(-6, 5))  # 0.016 .. 16
SCALE_FLOOR = 0.1  # a column's deviation is at least this share of the median column's


def standardise(X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(mean, scale) of the training rows' columns, each scale floored at SCALE_FLOOR x the median one."""
    mean, std = X.mean(0), X.std(0)
    typical = float(np.median(std))
    return mean, np.maximum(std, SCALE_FLOOR * typical if typical > 0 else 1.0)


def _logreg(C: float, seed: int):
    from sklearn.linear_model import LogisticRegression

    # the single-neuron fit: one feature, L2, C large (about unregularised): exact and instant either way
    return LogisticRegression(C=C, solver="liblinear", max_iter=1000, tol=1e-3, random_state=seed)


def _fit(X: np.ndarray, y: np.ndarray, C: float, seed: int):
    from sklearn.exceptions import ConvergenceWarning

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        return _logreg(C, seed).fit(X, y) if len(np.unique(y)) <= 2 else _multi(C, seed).fit(X, y)


def _multi(C: float, seed: int):
    from sklearn.linear_model import LogisticRegression

    return LogisticRegression(C=C, solver="lbfgs", max_iter=1000, random_state=seed)


@dataclass(frozen=True, slots=True)
class Probe:
    C: float
    val_accuracy: dict[float, float]  # per C tried
    converged_by_C: dict[float, bool]  # per C tried: within its iteration bound
    train_accuracy: float
    test_accuracy: float
    nonzero: int  # neurons with a non-zero weight for some class
    top: list[dict]  # [{"neuron", "weight" (per class for multi-class)}], by |weight|
    single: dict  # the top neuron alone: {"neuron", "test_accuracy", "train_accuracy", "thresholds"}
    converged: bool  # the refit on train + validation at the chosen C
    test_pred: np.ndarray
    coef: np.ndarray  # (1 or K, d) float64: the refit's weights on standardised features (a kept head's)
    intercept: np.ndarray  # (1 or K,)


def balanced_accuracy(y: np.ndarray, pred: np.ndarray) -> float:
    """The mean over the classes present in `y` of the share of their rows predicted right: 0.5 for a
    constant guess however rare a class is (where plain accuracy is the majority's share)."""
    return float(np.mean([(pred[y == k] == k).mean() for k in np.unique(y)]))


def _single_neuron(neuron: int, tr: tuple, te: tuple, seed: int) -> dict:
    """Accuracy (and balanced accuracy) of one neuron alone: a 1-feature logistic regression (thresholds
    fitted on train)."""
    (Xtr, ytr), (Xte, yte) = tr, te
    model = _fit(Xtr[:, [neuron]], ytr, 1e4, seed)  # ~unregularised
    w, b = model.coef_[:, 0], model.intercept_
    # binary: the decision is w x + b = 0, i.e. one threshold on the neuron's (standardised) value
    thresholds = [float(-b[0] / w[0])] if len(w) == 1 and w[0] != 0 else None
    p_tr, p_te = model.predict(Xtr[:, [neuron]]), model.predict(Xte[:, [neuron]])
    return {
        "neuron": int(neuron),
        "train_accuracy": float((p_tr == ytr).mean()),
        "test_accuracy": float((p_te == yte).mean()),
        "train_balanced_accuracy": balanced_accuracy(ytr, p_tr),
        "test_balanced_accuracy": balanced_accuracy(yte, p_te),
        "threshold_standardised": thresholds,
    }


def _line(name: str, fit, val_acc: float | None = None) -> str:
    """One line per fit: what a user watching the probe sees (a C of the grid, or the refit)."""
    what = f"validation accuracy {val_acc:.4f}" if val_acc is not None else "refit on train + validation"
    state = "converged" if fit.converged else "not converged (iteration bound reached)"
    return (
        f"probe {name}: C {fit.C:g}: {what}, {int((fit.coef != 0).any(0).sum())} non-zero weights, "
        f"{fit.iterations} iterations, {state}, {fit.seconds:.1f} s"
    )


def fit_probe(
    train: tuple,
    val: tuple,
    test: tuple,
    top_k: int,
    seed: int,
    name: str = "features",
    log: Callable[[str], None] = lambda _: None,
) -> tuple[Probe, np.ndarray, np.ndarray]:
    """(X, y) triples, raw features -> (Probe, feature mean, feature scale) (standardised with train's
    statistics); `log` gets a line per C and for the refit."""
    mean, scale = standardise(train[0])
    Xtr, Xva, Xte = ((X - mean) / scale for X in (train[0], val[0], test[0]))
    ytr, yva, yte = train[1], val[1], test[1]
    k = int(max(ytr.max(), yva.max(), yte.max())) + 1

    def report(fit) -> None:
        val_acc[fit.C] = fit.score(Xva, yva)
        log(_line(name, fit, val_acc[fit.C]))

    val_acc: dict[float, float] = {}
    fits = {f.C: f for f in l1_path(Xtr, ytr, k, C_GRID, report)}
    best_C = max(C_GRID, key=lambda C: (val_acc[C], -C))  # ties: the sparser (smaller C) model
    # refit on train + validation rows with the chosen C, as is usual once C is fixed (from its path point)
    model = l1_path(np.concatenate([Xtr, Xva]), np.concatenate([ytr, yva]), k, (best_C,), start=fits[best_C])[
        0
    ]
    log(_line(name, model))
    coef = model.coef  # (1 or K, H)
    strength = np.abs(coef).max(0)  # (H,)
    order = np.argsort(-strength, kind="stable")[:top_k]
    top = [
        {"neuron": int(n), "weight": float(coef[0, n]) if len(coef) == 1 else [float(v) for v in coef[:, n]]}
        for n in order
        if strength[n] > 0
    ]
    single = _single_neuron(int(order[0]), (Xtr, ytr), (Xte, yte), seed)
    n, thr = single["neuron"], single.pop("threshold_standardised")
    single["threshold"] = [float(t * scale[n] + mean[n]) for t in thr] if thr else None  # raw neuron value
    probe = Probe(
        C=best_C,
        val_accuracy=val_acc,
        converged_by_C={C: f.converged for C, f in fits.items()},
        train_accuracy=model.score(Xtr, ytr),
        test_accuracy=model.score(Xte, yte),
        nonzero=int((strength > 0).sum()),
        top=top,
        single=single,
        converged=model.converged,
        test_pred=model.predict(Xte),
        coef=model.coef,
        intercept=model.intercept,
    )
    return probe, mean, scale
