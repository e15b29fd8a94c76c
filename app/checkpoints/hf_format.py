"""The `transformers` side of an export: what makes the folder load with
`AutoModelForCausalLM.from_pretrained(dir, trust_remote_code=True)` and `AutoTokenizer.from_pretrained(...)`.

Every export carries it (nothing here needs transformers to write; it is a few KiB):
    config.json             mlstm-ds's keys plus model_type, auto_map and the model fields flat
    configuration_mlstm.py  modeling_mlstm.py  tokenization_mlstm.py   the remote code (app/checkpoints/hf_remote)
    tokenizer_config.json   the tokenizer kind and its auto_map
    generation_config.json  bos/eos/pad, and pad/bos suppressed as app/generate.py bans them
The weights are the same model.safetensors: the remote model's keys are mlstm-ds's own.
A classifier folder (app.classifier.folder) also loads with
`AutoModelForSequenceClassification` and `pipeline("text-classification")`: `hf_classifier_config`.
"""

from __future__ import annotations

import json
from pathlib import Path

from app.common.errors import UserError
from app.model.config import ModelConfig

REMOTE_DIR = Path(__file__).resolve().parent / "hf_remote"
REMOTE_FILES = ("configuration_mlstm.py", "modeling_mlstm.py", "tokenization_mlstm.py")
MODEL_TYPE = "multiplicative_lstm"
ARCHITECTURE = "MultiplicativeLSTMForCausalLM"
AUTO_MAP = {
    "AutoConfig": "configuration_mlstm.MultiplicativeLSTMConfig",
    "AutoModelForCausalLM": f"modeling_mlstm.{ARCHITECTURE}",
}
CLASSIFIER_ARCHITECTURE = "MultiplicativeLSTMForSequenceClassification"
TOKENIZER_AUTO_MAP = {"AutoTokenizer": ["tokenization_mlstm.MultiplicativeLSTMTokenizer", None]}
INSTALL_HINT = "pip install 'mlstm-ds[hf]' (in a checkout: pip install -e '.[hf]')"


def hf_config(model_cfg: ModelConfig, tok_meta: dict) -> dict:
    """The keys transformers reads from config.json (merged into the export's own config)."""
    return {
        "model_type": MODEL_TYPE,
        "architectures": [ARCHITECTURE],
        "auto_map": AUTO_MAP,
        **model_cfg.to_dict(),  # flat, under ModelConfig's names (the remote config takes them as they are)
        "bos_token_id": tok_meta["bos_id"],
        "eos_token_id": tok_meta["eos_id"],
        "pad_token_id": tok_meta["pad_id"],
        "dtype": "float32",
        "use_cache": True,
    }


def hf_classifier_config(model_cfg: ModelConfig, tok_meta: dict, meta: dict, outputs: int) -> dict:
    """transformers' keys of a classifier folder: the language model's, the sequence-classification class,
    the labels (id2label), the problem type and what the remote head reads (`classifier_*`)."""
    multi = meta["task"] == "multi_label"
    return {
        **hf_config(model_cfg, tok_meta),
        "architectures": [CLASSIFIER_ARCHITECTURE],
        "auto_map": {
            **AUTO_MAP,
            "AutoModelForSequenceClassification": f"modeling_mlstm.{CLASSIFIER_ARCHITECTURE}",
        },
        "id2label": {str(i): name for i, name in enumerate(meta["labels"])},
        "label2id": {name: i for i, name in enumerate(meta["labels"])},
        "problem_type": "multi_label_classification" if multi else "single_label_classification",
        "classifier_features": meta["feature"],
        "classifier_layers": meta["layers"],
        "classifier_outputs": outputs,
        "classifier_max_tokens": meta["max_tokens"],
        "classifier_thresholds": meta["thresholds"],
    }


def hf_files(tok_meta: dict, feature_preprocess: str = "none") -> dict[str, bytes]:
    """Remote code, tokenizer and generation configs: file name -> content. `feature_preprocess`: a
    classifier's (its tokenizer prepares each text as app/classifier/features.prepare_texts does)."""
    files = {name: (REMOTE_DIR / name).read_bytes() for name in REMOTE_FILES}
    tokenizer_config = {
        "tokenizer_class": "MultiplicativeLSTMTokenizer",
        "auto_map": TOKENIZER_AUTO_MAP,
        "tokenizer_type": tok_meta["type"],
        "byte_offset": tok_meta.get("byte_offset", 3),
        "padding_side": "left",  # batched generation: the recurrent state skips the pads in front
        "split_special_tokens": True,  # "<s>" in a text is text, as in mlstm-ds's own tokenizers
        "model_max_length": 10**9,  # a recurrent model has no context limit
        **({"feature_preprocess": feature_preprocess} if feature_preprocess != "none" else {}),
    }
    generation_config = {
        "bos_token_id": tok_meta["bos_id"],
        "eos_token_id": tok_meta["eos_id"],
        "pad_token_id": tok_meta["pad_id"],
        "suppress_tokens": sorted({tok_meta["pad_id"], tok_meta["bos_id"]}),  # never generated, as in ours
    }
    files["tokenizer_config.json"] = _json(tokenizer_config)
    files["generation_config.json"] = _json(generation_config)
    return files


def import_transformers(flag: str):
    """transformers, or one line naming the pip command (it is the optional extra `hf`)."""
    try:
        import transformers
    except ImportError:
        raise UserError(
            f"{flag} needs the transformers package (the optional extra hf): {INSTALL_HINT}"
        ) from None
    return transformers


def _json(obj: dict) -> bytes:
    return (json.dumps(obj, indent=1, sort_keys=True) + "\n").encode()
