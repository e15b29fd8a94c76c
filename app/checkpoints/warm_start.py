"""`--init-from PATH`: start a run from an earlier model's weights, with a fresh optimizer, schedule and step.

PATH is anything `--checkpoint` takes (a run directory, its checkpoints/ or a tag folder, `<run>/best`, an
export folder, also the one transformers loads): whatever layout wrote it, `app.checkpoints.loader` reads
it into one full state dict, and `load_into` hands each rank the part its module holds (a pipeline stage,
or the whole model) before DeepSpeed builds the optimizer from those weights.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch

from app.checkpoints import training as ckpt
from app.checkpoints.consolidate import StateDict, expected_shapes, to_module_state
from app.checkpoints.dir_kind import check_not_prepared_data
from app.checkpoints.loader import Source, open_source
from app.checkpoints.resume import file_sha256
from app.common.errors import UserError
from app.model.config import ModelConfig


def _open(path: str) -> Source:
    check_not_prepared_data(path, "--init-from")
    try:
        return open_source(path)
    except UserError as e:
        raise UserError(f"--init-from {path}: {e}") from None


def _check_tokenizer(path: str, src: Source, tokenizer: dict, tokenizer_path: Path | None) -> None:
    """One line when PATH's tokenizer is not --data's, naming both and the data_prep command that fixes it."""
    theirs, ours = src.tokenizer_meta, tokenizer
    if theirs.get("type") != ours.get("type") or theirs.get("vocab_size") != ours.get("vocab_size"):
        how = (
            "--tokenizer byte"
            if theirs.get("type") == "byte"
            else f"--tokenizer-model {src.path}/tokenizer.model"
        )
        raise UserError(
            f"--init-from {path}: its tokenizer ({theirs.get('type')}, {theirs.get('vocab_size')} pieces) is not "
            f"--data's ({ours.get('type')}, {ours.get('vocab_size')} pieces); prepare the data with its "
            f"tokenizer (python -m data_prep {how} ...)"
        )
    if ours.get("type") == "sentencepiece" and file_sha256(src.tokenizer_path) != file_sha256(tokenizer_path):
        raise UserError(
            f"--init-from {path}: its SentencePiece model differs from --data's (same size, other pieces); "
            f"prepare the data with python -m data_prep --tokenizer-model {src.tokenizer_path} ..."
        )


def open_init_source(
    path: str, model_cfg: ModelConfig, tokenizer: dict, tokenizer_path: Path | None
) -> Source:
    """Open PATH (JSON only) and check that its weights fit this run's model and tokenizer: one line if not."""
    src = _open(path)
    _check_tokenizer(path, src, tokenizer, tokenizer_path)
    want, have = expected_shapes(model_cfg), expected_shapes(src.model_cfg)
    bad = [f"{k} {have.get(k)} != {s}" for k, s in want.items() if have.get(k) != s]
    if bad or set(have) != set(want):
        raise UserError(
            f"--init-from {path}: its model ({_shape_fields(src.model_cfg)}) does not fit this run's "
            f"({_shape_fields(model_cfg)}): {'; '.join(bad[:3]) or 'other layers'}; pass --model-config with "
            "its sizes, or none (its own are taken)"
        )
    return src


def init_model_fields(path: str, tokenizer: dict, tokenizer_path: Path | None) -> tuple[dict, str]:
    """The model config of the model `--init-from PATH` names, for a run that names no --model-config: (its
    fields, a line saying where the sizes came from). Its tokenizer is checked first (its vocabulary is one of
    those sizes: a model for other pieces is a tokenizer mismatch, not a model config one); its shapes are
    checked after, in `open_init_source`."""
    src = _open(path)
    _check_tokenizer(path, src, tokenizer, tokenizer_path)
    return (
        src.model_cfg.to_dict(),
        f"--init-from: the model's sizes from {src.path} ({_shape_fields(src.model_cfg)})",
    )


def resumed_model_fields(out: str, resume: str | None) -> tuple[dict, str] | None:
    """When --out holds the checkpoint a rerun resumes (`--resume TAG`, else the latest complete one): the
    model config it records and a line saying so, else None. A resume never reads --init-from's weights, so
    it must not need them (a scratch folder cleaned before a requeue); the checkpoint's own files are checked
    when the resume reads them."""
    root = Path(out) / "checkpoints"
    try:
        tag = ckpt.find_resume_tag(root, resume)
        fields = ckpt.read_app_state(root / tag).get("model_config") if tag else None
    except (UserError, OSError):
        return None  # the resume itself says what is wrong, in one line
    if not isinstance(fields, dict):
        return None
    return fields, f"--init-from: not read, --out resumes from {tag}: the model's sizes from it"


def _shape_fields(cfg: ModelConfig) -> str:
    d = cfg.to_dict()
    return ", ".join(f"{k} {d[k]}" for k in ("num_layers", "hidden_dim", "embed_dim", "vocab_size") if k in d)


def load_into(full: StateDict) -> Callable[[torch.nn.Module], None]:
    """What Engine calls on the module it built (one stage or the whole model), before DeepSpeed wraps it."""

    def load(module: torch.nn.Module) -> None:
        module.load_state_dict(to_module_state(full, module), strict=True)

    return load
