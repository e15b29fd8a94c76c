"""The classifier folder: what app/transfer.py keeps (<out>/classifier/) and app/classify.py reads, written
and read (every field checked) here only.

One folder that loads three ways: with app/classify.py (labels for new text), as a --checkpoint of every
command (its language model: the fine-tuned one for a fine-tuned classifier), and with `transformers`
(AutoModelForSequenceClassification and pipeline("text-classification"), trust_remote_code):

    config.json          {"format": "mlstm-ds-classifier", "version": 1, "model_config", "tokenizer",
                          "classifier": {method, task, labels, feature, layers, thresholds, ...},
                          and transformers' keys (hf_format.hf_classifier_config)}
    model.safetensors    the language model's weights (keys "{i}.{name}", as an export's) and the head's:
                         classifier.mean (d,) float32, classifier.scale (d,) float32,
                         classifier.weight (K', d), classifier.bias (K',)
    tokenizer.model      the SentencePiece model (absent for the byte tokenizer)
    (config.json's "feature_preprocess", as an import's export has it: how a text is prepared before its
    features are read; the tokenizer config carries it too, so transformers prepares texts alike)
    configuration_mlstm.py, modeling_mlstm.py, tokenization_mlstm.py, tokenizer_config.json,
    generation_config.json, README.md    as an export's (app.checkpoints.hf_format)

The language model is copied in, not referenced: a fine-tuned classifier's weights exist nowhere else,
and a folder that holds everything can be moved, shared and loaded by transformers alone. Where it came
from is kept beside it: classifier.lm.source and classifier.lm.sha256, the digest of the files it was read
from (app.probing.features.checkpoint_digest, the feature cache's key).

Reading follows the handed-folder rules (app.common.handed): nothing outside the folder, the vocabulary and
the language model's shapes checked (app.checkpoints.loader.open_source), the head's shapes read from the
safetensors header and checked before a tensor is loaded, then every field of config.json's "classifier"
entry against the folder's model and the head's tensors; each problem one line naming the file and the
field. A probe keeps its standardisation (mean, scale: float32), its weights and bias (float64, as
fitted), the feature kind and layers, its C and labels; a fine-tuned classifier keeps its head (mean 0,
scale 1) and its language model, fine-tuned; a multi-label one its threshold per label.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from app.checkpoints.export_format import (
    CLASSIFIER_FORMAT,
    EXPORT_VERSION,
    FEATURE_PREPROCESS_KEY,
    HEAD_PREFIX,
    WEIGHTS_FILE,
    read_export_config,
    weight_shapes,
    write_export,
)
from app.checkpoints.hf_format import hf_classifier_config, hf_files
from app.checkpoints.loader import Source, open_source
from app.classifier.head import Head
from app.classifier.spec import FEATURES
from app.common import handed
from app.common.errors import UserError

HEAD_TENSORS = ("mean", "scale", "weight", "bias")


@dataclass(frozen=True, slots=True)
class KeptClassifier:
    src: Source  # the language model inside the folder
    head: Head  # every field checked
    meta: dict  # config.json's "classifier" entry (the head's fields and what transfer said of it)
    config_file: Path


def write_classifier(
    out: Path,
    src: Source,
    tok_meta: dict,
    lm_state: dict[str, torch.Tensor],
    head: Head,
    about: dict,
    preprocess: str = "none",
) -> Path:
    """Write (or replace) the classifier folder `out`: `lm_state` (the language model's weights, keys as an
    export's), the head; `about` (C, the language model's source and digest, the validation and test
    figures) goes into config.json's "classifier" beside the head's fields; `preprocess`: how the features
    read a text (the source's `feature_preprocess`, kept for app/classify.py and transformers' tokenizer)."""
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
    arrays = {"mean": head.mean, "scale": head.scale, "weight": head.weight, "bias": head.bias}
    tensors = {k: v.detach().float().cpu() for k, v in lm_state.items()}
    tensors |= {HEAD_PREFIX + k: torch.from_numpy(np.ascontiguousarray(arrays[k])) for k in HEAD_TENSORS}
    config = {
        "format": CLASSIFIER_FORMAT,
        "version": EXPORT_VERSION,
        "model_config": src.model_cfg.to_dict(),
        "tokenizer": tok_meta,
        "classifier": meta,
        **hf_classifier_config(src.model_cfg, tok_meta, meta, int(head.weight.shape[0])),
        **({FEATURE_PREPROCESS_KEY: preprocess} if preprocess != "none" else {}),
    }
    files = {**hf_files(tok_meta, preprocess), "README.md": _card(meta).encode()}
    write_export(out, tensors, config, src.tokenizer_path, files, program="mlstm-transfer")
    return out


def read_classifier(path: str | Path, flag: str = "--classifier") -> KeptClassifier:
    """The folder's language model (checked as an export is) and its head (the tensors' shapes checked from
    the header first, then loaded: safetensors, nothing executed; then every field of the head)."""
    d = Path(path)
    if not (d / "config.json").is_file() or not (d / WEIGHTS_FILE).is_file():
        raise UserError(f"{flag} {d}: not a classifier folder (no config.json + {WEIGHTS_FILE})")
    config_file = d / "config.json"
    src = open_source(d)  # inside the folder only; vocabulary and the language model's shapes checked
    cfg = read_export_config(d)
    if cfg.get("format") != CLASSIFIER_FORMAT:
        raise UserError(
            f"{flag} {d}: a language model's export, not a classifier (app/transfer.py --out DIR writes "
            "DIR/classifier)"
        )
    meta = cfg.get("classifier")
    if not isinstance(meta, dict):
        raise handed.refuse(config_file, "classifier", f"must be an object, got {meta!r}")
    shapes = weight_shapes(d, head=True)
    missing = [HEAD_PREFIX + k for k in HEAD_TENSORS if HEAD_PREFIX + k not in shapes]
    extra = sorted(set(shapes) - {HEAD_PREFIX + k for k in HEAD_TENSORS})
    if missing or extra:
        raise UserError(
            f"{d / WEIGHTS_FILE}: the head's tensors are not a classifier's (missing {missing or 'none'}, "
            f"unexpected {extra or 'none'})"
        )
    _check_head_shapes({k: shapes[HEAD_PREFIX + k] for k in HEAD_TENSORS}, d / WEIGHTS_FILE)
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(d / WEIGHTS_FILE), framework="np") as f:
            head = {k: f.get_tensor(HEAD_PREFIX + k) for k in HEAD_TENSORS}
    except (SafetensorError, OSError, ValueError, TypeError) as e:
        raise UserError(f"{d / WEIGHTS_FILE}: unreadable or corrupt safetensors file ({e})") from None
    return KeptClassifier(src, _head(meta, head, config_file, src.model_cfg), meta, config_file)


def _check_head_shapes(shapes: dict[str, tuple[int, ...]], file: Path) -> None:
    """mean and scale (d,), weight (K', d), bias (K',): one line naming the tensor otherwise."""
    w = shapes["weight"]
    if len(w) != 2 or w[0] < 1 or w[1] < 1:
        raise UserError(f"{file}: {HEAD_PREFIX}weight has shape {w}, not (outputs, features)")
    want = {"mean": (w[1],), "scale": (w[1],), "bias": (w[0],)}
    bad = [f"{HEAD_PREFIX}{k} {shapes[k]} != {s}" for k, s in want.items() if shapes[k] != s]
    if bad:
        raise UserError(f"{file}: the head's shapes do not fit together: {'; '.join(bad)}")


def _head(meta: dict, t: dict[str, np.ndarray], file: Path, cfg) -> Head:
    """config.json's "classifier" entry and the head's tensors -> Head, every field checked against the
    folder's model (`cfg`) and the tensors."""

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
    return Head(
        method, multi, labels, feature, layers, t["mean"], t["scale"], t["weight"], t["bias"], thresholds,
        max_tokens, top,
    )  # fmt: skip


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


def _card(meta: dict) -> str:
    """README.md: what the classifier is, in a few lines."""
    task = "multi-label (a threshold per label)" if meta.get("task") == "multi_label" else "single-label"
    how = (
        "a fine-tuned language model with a linear head"
        if meta.get("method") == "finetune"
        else (f"an L1 logistic regression probe on the language model's {meta.get('feature')} features")
    )
    labels = ", ".join(str(v) for v in meta.get("labels", []))
    return (
        "# mlstm-ds text classifier\n\n"
        f"A {task} classifier: {how} (layers {meta.get('layers')}), labels: {labels}.\n"
        f"Validation: {meta.get('validation')}; test: {meta.get('test')}.\n\n"
        "```bash\nmlstm-classify --classifier THIS_FOLDER --input texts.csv --output labels.csv\n```\n\n"
        "```python\nfrom transformers import pipeline\n"
        'clf = pipeline("text-classification", model="THIS_FOLDER", trust_remote_code=True)\n```\n'
    )
