"""The multi-label figures transfer.json reports beside a kept classifier (app.classifier.head): F1 per
label, macro F1, micro F1 and Jaccard (SemEval 2018 E-c's: per text |gold & predicted| / |gold | predicted|,
1 when both are empty), and the threshold per label chosen on validation (`best_thresholds`)."""

from __future__ import annotations

import numpy as np

THRESHOLDS = np.round(np.arange(1, 100) / 100, 2)  # the candidates a label's threshold is chosen from


def f1_per_label(Y: np.ndarray, P: np.ndarray) -> np.ndarray:
    """Gold and predicted 0/1 matrices (n, K) -> F1 per label (K,); a label with no positives and no
    predictions scores 1 (nothing to find, nothing claimed)."""
    tp = (Y & P).sum(0).astype(np.float64)
    denom = Y.sum(0) + P.sum(0)
    return np.where(denom == 0, 1.0, 2 * tp / np.maximum(denom, 1))


def jaccard(Y: np.ndarray, P: np.ndarray) -> float:
    """SemEval 2018 E-c's multi-label accuracy: mean over texts of |gold & predicted| / |gold | predicted|
    (1 for a text with neither)."""
    inter, union = (Y & P).sum(1), (Y | P).sum(1)
    return float(np.where(union == 0, 1.0, inter / np.maximum(union, 1)).mean())


def multilabel_scores(Y: np.ndarray, P: np.ndarray, labels: list[str]) -> dict:
    """The figures transfer.json reports for one split's gold Y and predictions P (n, K) 0/1."""
    f1 = f1_per_label(Y, P)
    tp, denom = int((Y & P).sum()), int(Y.sum() + P.sum())
    return {
        "f1_by_label": {name: float(v) for name, v in zip(labels, f1)},
        "macro_f1": float(f1.mean()),
        "micro_f1": 1.0 if denom == 0 else 2 * tp / denom,
        "jaccard": jaccard(Y, P),
        "exact_match": float((Y == P).all(1).mean()),
    }


def best_thresholds(probs: np.ndarray, Y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Validation probabilities and gold (n, K) -> (the threshold per label with the best F1 from
    THRESHOLDS, ties to the one nearest 0.5; that F1 per label)."""
    f1 = np.stack([f1_per_label(Y, (probs >= t).astype(np.int64)) for t in THRESHOLDS])  # (T, K)
    near = -np.abs(THRESHOLDS - 0.5)
    best = np.lexsort((np.broadcast_to(near[:, None], f1.shape), f1), axis=0)[-1]  # (K,)
    return THRESHOLDS[best].copy(), f1[best, np.arange(f1.shape[1])]
