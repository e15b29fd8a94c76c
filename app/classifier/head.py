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
validation: app.probing.scores.best_thresholds).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

TOP_NEURONS_KEPT = 32  # feature columns kept by |weight| (mlstm-classify --top-neurons reads up to this)


@dataclass(frozen=True, slots=True)
class Head:
    method: str  # "probe" | "finetune"
    multi_label: bool
    labels: list[str]  # class names (single-label) or label names (multi-label), in output order
    feature: str  # the feature kind read (app.classifier.spec.FEATURES); "mean_hidden" for finetune
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
