"""What app/transfer.py fitted, as the `Head` (app.classifier.head) it keeps in the classifier folder
(app.classifier.folder.write_classifier): a probe keeps its standardisation (mean, scale: float32) and its
weights and bias (float64, as fitted); a fine-tuned classifier its linear head (mean 0, scale 1); a
multi-label one its threshold per label; both the TOP_NEURONS_KEPT feature columns they weigh most.
"""

from __future__ import annotations

import numpy as np

from app.classifier.head import TOP_NEURONS_KEPT, Head, top_neurons


def probe_head(kind: str, layers: list[int], probe, mean, scale, labels: list[str], multi: bool) -> Head:
    """A fitted probe (Probe or MultiProbe) and its standardisation -> Head."""
    return Head(
        method="probe",
        multi_label=multi,
        labels=list(labels),
        feature=kind,
        layers=list(layers),
        mean=np.asarray(mean, dtype=np.float32),
        scale=np.asarray(scale, dtype=np.float32),
        weight=np.asarray(probe.coef, dtype=np.float64),
        bias=np.asarray(probe.intercept, dtype=np.float64),
        thresholds=np.asarray(probe.thresholds, dtype=np.float64) if multi else None,
        max_tokens=0,
        top_neurons=top_neurons(np.asarray(probe.coef), TOP_NEURONS_KEPT),
    )


def finetune_head(ft, layers: list[int], labels: list[str], multi: bool, max_tokens: int) -> Head:
    """A FineTuned's model head -> Head (its features: the layers' mean output, as fine-tuning read them)."""
    w = ft.classifier.head.weight.detach().float().cpu().numpy()
    width = w.shape[1]
    return Head(
        method="finetune",
        multi_label=multi,
        labels=list(labels),
        feature="mean_hidden",
        layers=list(layers),
        mean=np.zeros(width, dtype=np.float32),
        scale=np.ones(width, dtype=np.float32),
        weight=w,
        bias=ft.classifier.head.bias.detach().float().cpu().numpy(),
        thresholds=np.asarray(ft.thresholds, dtype=np.float64) if multi else None,
        max_tokens=max_tokens,
        top_neurons=top_neurons(w, TOP_NEURONS_KEPT),
    )
