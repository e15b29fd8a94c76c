"""A kept classifier's arithmetic: features -> logits -> probabilities -> label(s), the one place that
turns them into decisions, for app/transfer.py's reported figures and app/classify.py alike.

Two methods (the validation split picks one in app/transfer.py):
- "probe": standardised features ((x - mean) / scale, float32, as the probe was fitted) times the L1
  logistic regression's weights (float64) plus its bias, exactly `l1_path.Fit.decision`;
- "finetune": the fine-tuned LM's pooled output through its linear head (float32, torch), exactly
  `finetune.Classifier`'s head (mean 0, scale 1).
Single-label: one weight row for two classes (logit z of the second: probabilities [1 - s(z), s(z)], the
label z > 0), one row per class for more (softmax, the label the largest logit). Multi-label: one row per
label, a label's probability s(z) and the label on when that probability reaches its threshold (chosen on
validation, `best_thresholds`). The multi-label figures beside it: F1 per label, macro F1, micro F1 and
Jaccard (SemEval 2018 E-c's: per text |gold & predicted| / |gold | predicted|, 1 when both are empty).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

THRESHOLDS = np.round(np.arange(1, 100) / 100, 2)  # the candidates a label's threshold is chosen from


@dataclass(frozen=True, slots=True)
class Head:
    method: str  # "probe" | "finetune"
    multi_label: bool
    labels: list[str]  # class names (single-label) or label names (multi-label), in output order
    feature: str  # the feature kind read (app.probing.features.FEATURES); "mean_hidden" for finetune
    layers: list[int]  # recurrent layers read, side by side in this order
    mean: np.ndarray  # (d,) float32
    scale: np.ndarray  # (d,) float32
    weight: np.ndarray  # (K', d): float64 (probe), float32 (finetune)
    bias: np.ndarray  # (K',)
    thresholds: np.ndarray | None  # (K,) multi-label only
    max_tokens: int  # texts read up to this many tokens, BOS included (0: whole); finetune's cut
    top_neurons: list[int]  # feature columns by |weight|, strongest first

    @property
    def width(self) -> int:
        return int(self.weight.shape[1])

    def logits(self, X: np.ndarray) -> np.ndarray:
        """X (n, d) float32 raw features -> (n, K') float64 (probe) or float32 (finetune) logits."""
        if self.method == "finetune":
            import torch
            import torch.nn.functional as F

            w, b = torch.from_numpy(self.weight), torch.from_numpy(self.bias)
            return F.linear(torch.from_numpy(np.ascontiguousarray(X)), w, b).numpy()
        Xs = (X - self.mean) / self.scale  # float32, as the probe was fitted and scored
        return Xs @ self.weight.T + self.bias

    def probabilities(self, Z: np.ndarray) -> np.ndarray:
        """Logits (n, K') -> (n, K) probabilities: K classes (rows sum to 1) or K labels (each in [0, 1])."""
        Z = np.asarray(Z, dtype=np.float64)
        if self.multi_label:
            return sigmoid(Z)
        if Z.shape[1] == 1:
            return np.concatenate([sigmoid(-Z), sigmoid(Z)], axis=1)
        P = np.exp(Z - Z.max(1, keepdims=True))
        return P / P.sum(1, keepdims=True)

    def decide(self, Z: np.ndarray) -> np.ndarray:
        """Logits (n, K') -> class indices (n,) (single-label) or a 0/1 matrix (n, K) (multi-label)."""
        if self.multi_label:
            return (self.probabilities(Z) >= self.thresholds).astype(np.int64)
        return (Z[:, 0] > 0).astype(np.int64) if Z.shape[1] == 1 else np.asarray(Z).argmax(1)


def sigmoid(Z: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * Z))  # no overflow warning at |z| > 709


def top_neurons(weight: np.ndarray, k: int) -> list[int]:
    """Feature columns by their largest |weight| over the rows, strongest first (non-zero ones only)."""
    strength = np.abs(weight).max(0)
    order = np.argsort(-strength, kind="stable")[:k]
    return [int(n) for n in order if strength[n] > 0]


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
