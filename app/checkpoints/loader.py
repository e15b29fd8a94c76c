"""`--checkpoint PATH`: a training checkpoint (run dir, checkpoints/ dir or tag dir) or an export dir.

`open_source` reads only JSON here; the weights are converted on demand (`Source.state_dict`), always
through safe loaders (`app.checkpoints.consolidate.safe_load`, safetensors).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from app.checkpoints.consolidate import StateDict, check_shapes, checkpoint_state_dict
from app.checkpoints.dir_kind import check_not_prepared_data
from app.checkpoints.export_format import (
    TOKENIZER_FILE,
    WEIGHTS_FILE,
    is_export_dir,
    read_export_config,
    read_weights,
    weight_shapes,
)
from app.checkpoints.training import read_app_state, resolve_checkpoint_dir
from app.common import handed
from app.common.errors import UserError
from app.common.files import check_tree_inside
from app.common.resources import available_memory, fmt_bytes
from app.model.config import ModelConfig, matrix_parameters
from app.model.lm import LanguageModel


@dataclass(frozen=True, slots=True)
class Source:
    path: Path  # the checkpoint tag folder or the export folder
    kind: str  # "checkpoint" | "export"
    model_cfg: ModelConfig
    tokenizer_meta: dict
    step: int | None
    trained_layout: dict | None
    zero_stage: int = 0

    @property
    def tokenizer_path(self) -> Path | None:
        p = self.path / TOKENIZER_FILE
        return p if self.tokenizer_meta.get("type") == "sentencepiece" else None

    def tokenizer(self):
        from data_prep.tokenizer import load_tokenizer

        try:
            return load_tokenizer(self.tokenizer_meta, self.tokenizer_path)
        except (OSError, ValueError, RuntimeError) as e:
            raise UserError(f"--checkpoint {self.path}: cannot load its tokenizer ({e})") from None

    def state_dict(self) -> StateDict:
        """Full float32 weights with LanguageModel keys (see app.checkpoints.consolidate)."""
        if self.kind == "export":
            return read_weights(self.path, self.model_cfg)
        return checkpoint_state_dict(self.path, self.model_cfg, self.zero_stage)

    def load_model(self, device: str | torch.device = "cpu", state: StateDict | None = None) -> LanguageModel:
        """The model in eval mode with these weights (built on the meta device: no throwaway init); `state`:
        what `state_dict()` already gave (its tensors become the model's), else it is read now."""
        with torch.device("meta"):
            model = LanguageModel(self.model_cfg)
        model.load_state_dict(self.state_dict() if state is None else state, strict=True, assign=True)
        return model.to(device).eval()

    def describe(self) -> str:
        step = f" step {self.step}" if self.step is not None else ""
        lay = self.trained_layout
        trained = (
            f", trained with P={lay['stages']} x DP={lay['data_parallel']} ZeRO-{lay['zero_stage']} {lay['precision']}"
            if lay
            else ""
        )
        return f"{self.kind} {self.path}{step}{trained}"


def _model_cfg(d: object, where: Path) -> ModelConfig:
    if not isinstance(d, dict):
        raise UserError(f"{where}: no model_config")
    try:
        return ModelConfig.from_dict(d)
    except (TypeError, ValueError) as e:
        raise UserError(f"{where}: invalid model_config ({e})") from None


MAX_LAYERS = 4096  # recurrent layers a handed-over config may state (the presets have 1 or 2)
MAX_WIDTH = 1 << 20  # embed_dim and hidden_dim a handed-over config may state (OpenAI's model: 4096)


def check_dimensions(cfg: ModelConfig, file: Path) -> None:
    """The model's dimensions as `file` states them, each within its bound, before anything (a meta tensor
    included: torch refuses to size hidden 10^9) is built from them."""
    handed.count(cfg.num_layers, file, "model_config.num_layers", 1, MAX_LAYERS)
    for name in ("embed_dim", "hidden_dim"):
        handed.count(getattr(cfg, name), file, f"model_config.{name}", 1, MAX_WIDTH)


def check_memory(cfg: ModelConfig, file: Path) -> None:
    """The float32 weights `file`'s model config states fit in the memory this process may use."""
    need, free = 4 * matrix_parameters(cfg), available_memory()
    if free is not None and need > free:
        raise handed.refuse(
            file,
            "model_config",
            f"(vocab {cfg.vocab_size:,}, embed {cfg.embed_dim:,}, hidden {cfg.hidden_dim:,}, "
            f"{cfg.num_layers:,} layers) needs {fmt_bytes(need)} for its float32 weights alone, and "
            f"{fmt_bytes(free)} of memory is available",
        )


def check_sizes(src: Source, file: Path) -> Source:
    """The sizes `file` (the folder's JSON) states, before anything is built from them (app.common.handed):
    the vocabulary against the tokenizer file and the model's, the model's dimensions against the weights:
    an export's against the shapes its safetensors header declares, a checkpoint's against the bytes its
    files hold (at least 2 a matrix parameter, bf16; its DeepSpeed files are pickles, read only on use)."""
    vocab = handed.check_vocab(src.tokenizer_meta, src.path / TOKENIZER_FILE, file)
    cfg = src.model_cfg
    if cfg.vocab_size != vocab:
        raise handed.refuse(
            file, "model_config.vocab_size", f"is {cfg.vocab_size:,}, the tokenizer's {vocab:,}"
        )
    check_dimensions(cfg, file)
    if src.kind == "export":
        check_shapes(weight_shapes(src.path), cfg, f"{src.path / WEIGHTS_FILE} (against {file})")
        check_memory(cfg, file)
        return src
    need = 2 * matrix_parameters(cfg)
    have = sum(f.stat().st_size for f in src.path.rglob("*") if f.is_file())
    if need > have:
        raise handed.refuse(
            file,
            "model_config",
            f"(vocab {cfg.vocab_size:,}, embed {cfg.embed_dim:,}, hidden {cfg.hidden_dim:,}, "
            f"{cfg.num_layers:,} layers) needs at least {fmt_bytes(need)} of weights (2 bytes a parameter); "
            f"the files of {src.path} hold {fmt_bytes(have)}",
        )
    check_memory(cfg, file)
    return src


def open_source(path: str | Path) -> Source:
    p = Path(path)
    check_not_prepared_data(p, "--checkpoint")
    if is_export_dir(p):
        check_tree_inside(p, p, "--checkpoint")  # weights and tokenizer: inside the folder handed to us
        cfg = read_export_config(p)
        src = Source(
            path=p,
            kind="export",
            model_cfg=_model_cfg(cfg.get("model_config"), p / "config.json"),
            tokenizer_meta=cfg["tokenizer"],
            step=cfg.get("step"),
            trained_layout=cfg.get("trained_layout"),
        )
        return check_sizes(src, p / "config.json")
    d = resolve_checkpoint_dir(p)
    check_tree_inside(d, p if p.exists() else p.parent, "--checkpoint")  # <run>/best names no folder
    state = read_app_state(d)
    tok = state.get("tokenizer")
    if not isinstance(tok, dict):
        raise UserError(f"{d / 'app_state.json'}: no tokenizer entry")
    layout = state.get("layout") or {}
    src = Source(
        path=d,
        kind="checkpoint",
        model_cfg=_model_cfg(state.get("model_config"), d / "app_state.json"),
        tokenizer_meta=tok,
        step=state.get("step"),
        trained_layout=layout or None,
        zero_stage=int(layout.get("zero_stage", 0)),
    )
    return check_sizes(src, d / "app_state.json")
