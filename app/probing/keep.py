"""The classifier app/transfer.py's validation split chose, kept as a folder (app.checkpoints.classifier_format)
and read back as a `Head` (app/probing/head.py) for app/classify.py.

A probe keeps its standardisation (mean, scale: float32), its weights and bias (float64, as fitted), the
feature kind and layers, its C and labels; a fine-tuned classifier keeps its head (mean 0, scale 1) and
its language model, fine-tuned; a multi-label one its threshold per label. Reading checks every field of
config.json's "classifier" entry against the folder's model and the head's tensors, each problem one line
naming the file and the field.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from app.checkpoints.classifier_format import KeptClassifier, read_classifier, write_classifier
from app.checkpoints.loader import Source
from app.common import handed
from app.probing.features import FEATURES
from app.probing.head import Head, top_neurons

TOP_NEURONS_KEPT = 32  # feature columns kept by |weight| (mlstm-classify --top-neurons reads up to this)


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


def keep(
    out: Path, src: Source, tok_meta: dict, lm_state: dict, head: Head, about: dict, preprocess: str = "none"
) -> Path:
    """Write the classifier folder `out`; `about`: C, the language model's source and digest, and the
    validation and test figures (config.json's "classifier" gets them beside the head's fields);
    `preprocess`: the source's feature_preprocess (how texts were prepared for the features)."""
    meta = {
        "method": head.method,
        "task": "multi_label" if head.multi_label else "single_label",
        "labels": head.labels,
        "feature": head.feature,
        "layers": head.layers,
        "max_tokens": head.max_tokens,
        "thresholds": None if head.thresholds is None else [float(t) for t in head.thresholds],
        "top_neurons": head.top_neurons,
        **about,
    }
    tensors = {"mean": head.mean, "scale": head.scale, "weight": head.weight, "bias": head.bias}
    return write_classifier(out, lm_state, src, tok_meta, tensors, meta, preprocess)


def load_head(path: str | Path, flag: str = "--classifier") -> tuple[KeptClassifier, Head]:
    """The classifier folder `path` -> (its parts, its Head), every field checked."""
    kept = read_classifier(path, flag)
    meta, file, t = kept.meta, kept.config_file, kept.head
    cfg = kept.src.model_cfg

    def field(name: str, ok: bool, want: str):
        if not ok:
            raise handed.refuse(file, f"classifier.{name}", f"must be {want}, got {meta.get(name)!r}")
        return meta.get(name)

    method = field("method", meta.get("method") in ("probe", "finetune"), "probe or finetune")
    task = field("task", meta.get("task") in ("single_label", "multi_label"), "single_label or multi_label")
    multi = task == "multi_label"
    labels = meta.get("labels")
    field(
        "labels",
        isinstance(labels, list)
        and all(isinstance(v, str) and v for v in labels)
        and len(set(labels)) == len(labels)
        and len(labels) >= (1 if multi else 2),
        "a list of distinct label names (two or more for a single-label classifier)",
    )
    feature = field("feature", meta.get("feature") in FEATURES, "one of " + ", ".join(FEATURES))
    layers = meta.get("layers")
    field(
        "layers",
        isinstance(layers, list)
        and layers
        and all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < cfg.num_layers for i in layers)
        and len(set(layers)) == len(layers),
        f"a list of distinct layer indices in [0, {cfg.num_layers})",
    )
    max_tokens = handed.count(meta.get("max_tokens"), file, "classifier.max_tokens", 0)
    _check_tensors(t, file, cfg.hidden_dim * len(layers), len(labels), multi, method)
    thresholds = _thresholds(meta, file, len(labels)) if multi else None
    width = t["weight"].shape[1]
    top = meta.get("top_neurons")
    field(
        "top_neurons",
        isinstance(top, list)
        and all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < width for i in top),
        f"a list of feature columns in [0, {width})",
    )
    head = Head(
        method, multi, labels, feature, layers, t["mean"], t["scale"], t["weight"], t["bias"], thresholds,
        max_tokens, top,
    )  # fmt: skip
    return kept, head


def _check_tensors(t: dict, file: Path, width: int, n_labels: int, multi: bool, method: str) -> None:
    rows = t["weight"].shape[0]
    fits = rows == n_labels or (rows == 1 and n_labels == 2 and not multi and method == "probe")
    if t["weight"].shape[1] != width or not fits:
        raise handed.refuse(
            file,
            "classifier",
            f"describes a head of {n_labels} labels on {width} features (the layers' width), but the weights "
            f"are {tuple(t['weight'].shape)}",
        )
    weight_types = (np.float32,) if method == "finetune" else (np.float32, np.float64)
    ok = t["mean"].dtype == np.float32 and t["scale"].dtype == np.float32
    if not ok or t["weight"].dtype not in weight_types or t["bias"].dtype != t["weight"].dtype:
        raise handed.refuse(
            file,
            "classifier",
            "needs float32 mean and scale, and weight and bias of one float dtype (float32 for a fine-tuned "
            f"head), got {', '.join(f'{k} {v.dtype}' for k, v in t.items())}",
        )
    if not all(np.isfinite(t[k]).all() for k in t) or not (t["scale"] > 0).all():
        raise handed.refuse(file, "classifier", "has non-finite head weights or a scale <= 0")


def _thresholds(meta: dict, file: Path, n: int) -> np.ndarray:
    thr = meta.get("thresholds")
    ok = isinstance(thr, list) and len(thr) == n
    ok = ok and all(isinstance(v, int | float) and not isinstance(v, bool) and 0 <= v <= 1 for v in thr)
    if not ok:
        raise handed.refuse(file, "classifier.thresholds", f"must be {n} numbers in [0, 1], got {thr!r}")
    return np.asarray(thr, dtype=np.float64)
