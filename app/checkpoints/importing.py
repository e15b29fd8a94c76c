"""The field's released mLSTM weights as an ordinary export (`app.checkpoints.export_format`): the part of
`mlstm-import` that does not depend on where the weights came from.

A reader (`import_openai`, `import_sentiment_discovery`) turns its source's tensors into `Imported`: our
layer layout (rows [W_mx; W_x] in gate order i, f, o, u, weight norm per output row) and the source's
own byte-id table. `to_model` maps that table onto our byte tokenizer (data_prep.tokenizer.ByteTokenizer:
pad 0, bos 1, eos 2, byte b at b + 3):

- byte b: the source's row of byte b (its id b + byte_offset), in the embedding and in the head;
- BOS (every text we read starts with it) and EOS as an input: the embedding of the byte "\\n". Both
  sources trained on texts padded "\\n " + text + " " and read back to back, so a text starts after a
  newline: [BOS] + " " + text + " " is their "\\n " + text + " " step for step (`feature_preprocess`);
- EOS as a target: the head row of "\\n" (where the next text would begin), so evaluation's EOS targets
  and generation's stop cost what a newline does; the bytes' logits are the source's exactly;
- BOS (and pad, where the source has none) as a target: weight 0 and bias NEVER, never predicted.
- pad: the source's pad row where it has one (sentiment-discovery's id 0), else zeros (never read).

`write_import` writes the folder: safetensors + config.json (with the transformers keys, as app/export.py
writes them) + the remote code + a model card, and `feature_preprocess`, the text preparation that
app/transfer.py applies before featurizing (`app.checkpoints.export_format.feature_preprocess`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from app.checkpoints.consolidate import StateDict, check_state_dict
from app.checkpoints.export_format import FEATURE_PREPROCESS_KEY, write_export
from app.checkpoints.hf_format import hf_config, hf_files
from app.checkpoints.model_card import model_card
from app.checkpoints.run_info import RunInfo
from app.common.errors import UserError
from app.model.config import ModelConfig

NEWLINE = 10  # the byte "\n": what BOS and EOS stand for
NEVER = -1.0e4  # the head bias of ids a source never predicts (exp(-1e4) is 0 in float32)


@dataclass(frozen=True, slots=True)
class ImportedLayer:
    """One mLSTM layer in our layout (H = hidden, in = input width), float64 or float32 tensors."""

    w_in: torch.Tensor  # (5H, in) rows [W_mx (H); W_x (4H) in gate order i, f, o, u]
    w_mh: torch.Tensor  # (H, H)
    w_m: torch.Tensor  # (4H, H), gate order i, f, o, u
    bias: torch.Tensor  # (4H,)
    gains: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None  # (5H,), (H,), (4H,); None: plain weights
    names: tuple[str, str, str]  # where w_in, w_mh, w_m came from (file: tensor), for refusals


@dataclass(frozen=True, slots=True)
class Imported:
    """A source's model, every tensor in our layout but the byte-id tables."""

    kind: str  # "openai" | "sentiment-discovery"
    source: str  # what was read: the folder or file name (no machine path)
    embedding: torch.Tensor  # (V_src, E) by the source's ids
    head_weight: torch.Tensor  # (V_src, H)
    head_bias: torch.Tensor  # (V_src,)
    byte_offset: int  # the source's id of byte b is b + byte_offset
    pad_row: int | None  # the source's pad id, mapped onto ours; None when it has none
    layers: list[ImportedLayer]
    notes: list[str] = field(default_factory=list)  # lines for the model card: what the mapping did


def check_tensor(t: torch.Tensor, want: tuple[int, ...], where: str) -> torch.Tensor:
    """`t` (from `where`: "FILE: tensor NAME") of shape `want` with finite values, else one line."""
    if tuple(t.shape) != tuple(want):
        raise UserError(f"{where} has shape {tuple(t.shape)}, expected {tuple(want)}")
    if not t.is_floating_point():
        raise UserError(f"{where} holds {t.dtype} values, expected floating point")
    if not bool(torch.isfinite(t).all()):
        raise UserError(f"{where} holds NaN or infinite values")
    return t


def _byte_table(src: torch.Tensor, imported: Imported, embedding: bool, fill: float) -> torch.Tensor:
    """(V_src, ...) rows by the source's ids -> (259, ...) by ours (bytes, pad, BOS/EOS as documented);
    `fill`: the rows of ids the source has no row for."""
    from data_prep.tokenizer import ByteTokenizer

    tok = ByteTokenizer()
    off = imported.byte_offset
    out = torch.full((tok.vocab_size, *src.shape[1:]), fill, dtype=src.dtype)
    out[tok.OFFSET :] = src[off : off + 256]
    newline = src[off + NEWLINE]
    out[tok.eos_id] = newline
    if embedding:  # BOS reads as "\n" too (as a target it is never predicted)
        out[tok.bos_id] = newline
    if imported.pad_row is not None:
        out[tok.pad_id] = src[imported.pad_row]
    return out


def model_config(imported: Imported) -> ModelConfig:
    first = imported.layers[0]
    return ModelConfig(
        vocab_size=259,
        embed_dim=int(imported.embedding.shape[1]),
        hidden_dim=int(first.w_mh.shape[0]),
        num_layers=len(imported.layers),
        weight_norm=first.gains is not None,
        tie_embeddings=False,  # a tied source's decoder has a bias; ours tied has none
    )


def _check_gains(layer: ImportedLayer) -> None:
    """Weight norm divides by each row's norm: a row of zeros has no direction (TF's l2_normalize and torch
    would give 0 and NaN); refuse it rather than export NaNs."""
    for v, where in zip((layer.w_in, layer.w_mh, layer.w_m), layer.names, strict=True):
        zero = torch.nonzero(v.double().norm(dim=1) == 0).flatten()
        if zero.numel():
            raise UserError(
                f"{where}: output unit {int(zero[0])} has an all-zero weight vector, which weight "
                "normalisation cannot divide by"
            )


def to_state_dict(imported: Imported) -> tuple[ModelConfig, StateDict]:
    """Our model config and float32 state dict (LanguageModel keys) of `imported`."""
    cfg = model_config(imported)
    if any((layer.gains is None) != (not cfg.weight_norm) for layer in imported.layers):
        raise UserError(f"{imported.source}: some layers are weight-normed and some are not")
    sd: StateDict = {"0.weight": _byte_table(imported.embedding, imported, True, 0.0)}
    for i, layer in enumerate(imported.layers, start=1):
        sd[f"{i}.weight_in"], sd[f"{i}.weight_mh"], sd[f"{i}.weight_m"] = layer.w_in, layer.w_mh, layer.w_m
        sd[f"{i}.bias"] = layer.bias
        if layer.gains is not None:
            _check_gains(layer)
            sd[f"{i}.gain_in"], sd[f"{i}.gain_mh"], sd[f"{i}.gain_m"] = layer.gains
    head = cfg.num_layers + 1
    sd[f"{head}.weight"] = _byte_table(imported.head_weight, imported, False, 0.0)
    sd[f"{head}.bias"] = _byte_table(imported.head_bias, imported, False, NEVER)
    sd = {k: v.to(torch.float32).contiguous() for k, v in sd.items()}
    check_state_dict(sd, cfg, imported.source)  # a mapping bug, not a user's: said the same way
    return cfg, sd


def _origin_section(imported: Imported, preprocess: str) -> str:
    names = {"openai": "OpenAI's byte mLSTM (generating-reviews-discovering-sentiment, encoder.py)"}
    what = names.get(imported.kind, "an NVIDIA sentiment-discovery RNNModel state dict (mLSTM)")
    lines = [
        f"Imported by `mlstm-import --from {imported.kind}` from {what}: `{imported.source}`.",
        "",
        *(f"- {n}" for n in imported.notes),
        "- bytes: the source's rows of byte b are this model's id b + 3; BOS (and EOS read as input) take "
        'the embedding of "\\n", EOS as a target the head row of "\\n"; BOS (and pad, where the source has '
        "no pad row) is never predicted",
        f"- feature_preprocess: `{preprocess}`"
        + (
            ' (app/transfer.py reads [BOS] + " " + text + " ", i.e. their "\\n " + text + " ")'
            if preprocess == "openai"
            else ""
        ),
    ]
    return "## Origin\n\n" + "\n".join(lines) + "\n"


def write_import(imported: Imported, out: Path, preprocess: str) -> tuple[ModelConfig, int]:
    """Write `imported` to the export folder `out` -> (its model config, its parameter count)."""
    from data_prep.tokenizer import ByteTokenizer

    cfg, sd = to_state_dict(imported)
    tok_meta = ByteTokenizer().meta()
    parameters = sum(v.numel() for v in sd.values())
    config = {
        "model_config": cfg.to_dict(),
        "tokenizer": tok_meta,
        "step": None,
        "trained_layout": None,
        "source": f"{imported.kind}:{imported.source}",
        "parameters": parameters,
        FEATURE_PREPROCESS_KEY: preprocess,
        **hf_config(cfg, tok_meta),
    }
    card = model_card(cfg, tok_meta, parameters, None, None, RunInfo(), out.name or ".")
    card += "\n" + _origin_section(imported, preprocess)
    files = {**hf_files(tok_meta), "README.md": card.encode()}
    write_export(out, sd, config, None, files, program="mlstm-import")
    return cfg, parameters
