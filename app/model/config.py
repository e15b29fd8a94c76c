"""Model configuration: one typed, validated dataclass plus the shared debug preset.

Every field carries a docstring (it becomes CLI help). `__post_init__` checks values once at start-up and
raises `ValueError`s that name the field and print the offending numbers.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass
from typing import Any, Literal

from app.common.numbers import check_numbers

Cell = Literal["mlstm", "lstm"]
Core = Literal["auto", "fused", "python"]
CELLS = typing.get_args(Cell)
CORES = typing.get_args(Core)
RUNTIME_FIELDS = ("core",)  # how the model runs, not what it computes: kept out of saved configs


@dataclass(kw_only=True, slots=True)
class ModelConfig:
    cell: Cell = "mlstm"
    """Recurrent cell: "mlstm" (multiplicative LSTM, Krause et al. 2016, fast custom core) or "lstm"
    (plain LSTM through torch's fused nn.LSTM, the baseline)."""

    vocab_size: int
    """Number of token ids (bytes: 256). Ids must lie in [0, vocab_size)."""

    embed_dim: int
    """Width of the token embedding, i.e. the input width of the first recurrent layer."""

    hidden_dim: int
    """Width of the recurrent state h, c (and of the multiplicative state m in the mLSTM)."""

    num_layers: int
    """Number of stacked recurrent layers."""

    dropout: float = 0.0
    """Dropout probability on each recurrent layer's output (between layers and before the head)."""

    weight_norm: bool = True
    """Weight-normalise the input and recurrent matrices per output row (w = g * v / ||v||), as the
    OpenAI and NVIDIA mLSTMs train. Gains g start at ||v||, so switching it on does not change the
    function at initialisation. mLSTM only: must be False with cell="lstm"."""

    tie_embeddings: bool = False
    """Share the embedding matrix with the output head (needs embed_dim == hidden_dim)."""

    residual: bool = False
    """Add each recurrent layer's input to its output where the widths match (all layers but the first
    when embed_dim != hidden_dim)."""

    forget_bias: float = 1.0
    """Initial bias of the forget gate; a positive value makes the cell remember by default at init."""

    init_range: float = 0.0
    """Recurrent weights start uniform in [-r, r]; 0 picks r = 1/sqrt(hidden_dim) like nn.LSTM."""

    embed_init_std: float = 0.02
    """Standard deviation of the normal init of the embedding (and of an untied head)."""

    core: Core = "auto"
    """mLSTM time loop (app/model/core.py): "fused" (the device's fused loop: a C++ op on CPU, built on
    first use; Triton kernels with CUDA-graph replay on CUDA, needs triton), "python" (portable core),
    "auto" (fused where it runs, else python; the choice is logged once). Same function and checkpoints
    either way; not saved with the model config."""

    def __post_init__(self) -> None:
        check_numbers(self, signed=("forget_bias",), name_of=lambda name: f"model.{name}")
        if self.cell not in CELLS:
            raise ValueError(f"cell must be one of {CELLS}, got {self.cell!r}")
        if self.core not in CORES:
            raise ValueError(f"core must be one of {CORES}, got {self.core!r}")
        for name in ("vocab_size", "embed_dim", "hidden_dim", "num_layers"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")
        if self.init_range < 0.0:
            raise ValueError(f"init_range must be >= 0 (0 = 1/sqrt(hidden_dim)), got {self.init_range}")
        if self.embed_init_std <= 0.0:
            raise ValueError(f"embed_init_std must be > 0, got {self.embed_init_std}")
        if self.cell == "lstm" and self.weight_norm:
            raise ValueError(
                "weight_norm is implemented for cell='mlstm' only (nn.LSTM keeps its own weights); "
                "set weight_norm=False with cell='lstm'"
            )
        if self.tie_embeddings and self.embed_dim != self.hidden_dim:
            raise ValueError(
                f"tie_embeddings needs embed_dim == hidden_dim, got embed_dim={self.embed_dim} "
                f"hidden_dim={self.hidden_dim}"
            )

    def to_dict(self) -> dict[str, Any]:
        """The saved form: run-time choices (RUNTIME_FIELDS) are left out, so checkpoints do not depend on them."""
        d = dataclasses.asdict(self)
        for name in RUNTIME_FIELDS:
            d.pop(name)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ModelConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"unknown ModelConfig keys {unknown}; known keys are {sorted(known)}")
        return cls(**d)


PRESETS: dict[str, dict] = {
    # Shared by tests, CI and launch/ smoke runs.
    "debug": dict(embed_dim=32, hidden_dim=64, num_layers=2),
    # The quickstart: trains visibly on 2 CPU processes in a few minutes.
    "small": dict(embed_dim=128, hidden_dim=256, num_layers=2),
    "medium": dict(embed_dim=256, hidden_dim=1024, num_layers=2),
    # The size of OpenAI's byte-level review model (Radford et al. 2017).
    "large": dict(embed_dim=64, hidden_dim=4096, num_layers=1),
}


def debug_config(vocab_size: int = 256, **overrides: Any) -> ModelConfig:
    """The tiny model shared by tests, CI and smoke runs (trains in seconds on a CPU)."""
    kw: dict[str, Any] = dict(vocab_size=vocab_size, **PRESETS["debug"])
    kw.update(overrides)
    return ModelConfig(**kw)


def recurrent_flops_per_token(cell: str, in_dim: int, hidden_dim: int) -> float:
    """Forward matmul FLOPs per token of one recurrent layer (2 per multiply-add)."""
    h = hidden_dim
    if cell == "mlstm":
        # input side [W_mx; W_x] (5h x in), recurrent W_mh (h x h) and W_m (4h x h)
        return 2.0 * (5 * h * in_dim + h * h + 4 * h * h)
    # nn.LSTM: W_ih (4h x in), W_hh (4h x h)
    return 2.0 * (4 * h * in_dim + 4 * h * h)


def matrix_parameters(cfg: ModelConfig) -> int:
    """The model's matrix parameters (embedding, recurrent matrices, untied head; biases and gains left out),
    in closed form: a config read from a handed-over file may state 10^12 layers, which no loop should meet."""
    e, h, layers = cfg.embed_dim, cfg.hidden_dim, cfg.num_layers
    per_in, per_h = (5 * h, 5 * h) if cfg.cell == "mlstm" else (4 * h, 4 * h)  # (input side, state side) rows
    recurrent = per_in * e + per_h * h + (layers - 1) * (per_in + per_h) * h
    return cfg.vocab_size * e + recurrent + (0 if cfg.tie_embeddings else h * cfg.vocab_size)


def head_flops_per_token(cfg: ModelConfig) -> float:
    """Forward matmul FLOPs per token of the output head."""
    return 2.0 * cfg.hidden_dim * cfg.vocab_size


def flops_per_token(cfg: ModelConfig) -> float:
    """Training FLOPs per token (forward + backward = 3x the forward matmul FLOPs), for MFU.

    The embedding is a lookup (no FLOPs); elementwise gate work is left out, as is customary.
    """
    fwd = head_flops_per_token(cfg)
    for layer in range(cfg.num_layers):
        in_dim = cfg.embed_dim if layer == 0 else cfg.hidden_dim
        fwd += recurrent_flops_per_token(cfg.cell, in_dim, cfg.hidden_dim)
    return 3.0 * fwd
