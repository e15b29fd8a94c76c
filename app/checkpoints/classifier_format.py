"""The classifier folder: what app/transfer.py keeps (<out>/classifier/) and app/classify.py reads.

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
safetensors header and checked before a tensor is loaded; the head's JSON fields are checked by its user
(app.probing.keep).
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
from app.common import handed
from app.common.errors import UserError

HEAD_TENSORS = ("mean", "scale", "weight", "bias")


@dataclass(frozen=True, slots=True)
class KeptClassifier:
    src: Source  # the language model inside the folder
    meta: dict  # config.json's "classifier" entry (checked by app.probing.keep)
    head: dict[str, np.ndarray]  # mean, scale, weight, bias
    config_file: Path


def write_classifier(
    out: Path,
    lm_state: dict[str, torch.Tensor],
    src: Source,
    tok_meta: dict,
    head: dict[str, np.ndarray],
    meta: dict,
    preprocess: str = "none",
) -> Path:
    """Write (or replace) the classifier folder `out`: `lm_state` (the language model's weights, keys as an
    export's), the head's tensors and `meta` (config.json's "classifier"); `preprocess`: how the features
    read a text (the source's `feature_preprocess`, kept for app/classify.py and transformers' tokenizer)."""
    tensors = {k: v.detach().float().cpu() for k, v in lm_state.items()}
    tensors |= {HEAD_PREFIX + k: torch.from_numpy(np.ascontiguousarray(head[k])) for k in HEAD_TENSORS}
    config = {
        "format": CLASSIFIER_FORMAT,
        "version": EXPORT_VERSION,
        "model_config": src.model_cfg.to_dict(),
        "tokenizer": tok_meta,
        "classifier": meta,
        **hf_classifier_config(src.model_cfg, tok_meta, meta, int(head["weight"].shape[0])),
        **({FEATURE_PREPROCESS_KEY: preprocess} if preprocess != "none" else {}),
    }
    files = {**hf_files(tok_meta, preprocess), "README.md": _card(meta).encode()}
    write_export(out, tensors, config, src.tokenizer_path, files, program="mlstm-transfer")
    return out


def read_classifier(path: str | Path, flag: str = "--classifier") -> KeptClassifier:
    """The folder's language model (checked as an export is) and its head's tensors (shapes checked from
    the header first, then loaded: safetensors, nothing executed)."""
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
    return KeptClassifier(src, meta, head, config_file)


def _check_head_shapes(shapes: dict[str, tuple[int, ...]], file: Path) -> None:
    """mean and scale (d,), weight (K', d), bias (K',): one line naming the tensor otherwise."""
    w = shapes["weight"]
    if len(w) != 2 or w[0] < 1 or w[1] < 1:
        raise UserError(f"{file}: {HEAD_PREFIX}weight has shape {w}, not (outputs, features)")
    want = {"mean": (w[1],), "scale": (w[1],), "bias": (w[0],)}
    bad = [f"{HEAD_PREFIX}{k} {shapes[k]} != {s}" for k, s in want.items() if shapes[k] != s]
    if bad:
        raise UserError(f"{file}: the head's shapes do not fit together: {'; '.join(bad)}")


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
