"""The model's layers. Each takes ONE tensor and returns ONE tensor, so they chain (and pipeline).

    Embedding       (B, T) int64 ids -> (B, T, E)
    RecurrentLayer  (B, T, in)       -> (B, T, H)   mLSTM (fast core) or LSTM (nn.LSTM)
    Head            (B, T, H)        -> (B, T, V)   logits

Every output is made contiguous because it may cross a pipeline-stage boundary. Parameter names are
part of the checkpoint format; do not rename them.

For generation, layers also run one token at a time: `Embedding.forward` and `Head.forward` accept
(B, 1) / (B, 1, H) as well, and `RecurrentLayer.step(x_t (B, in), state) -> (y_t (B, H), new_state)`
carries the recurrent state so each new token costs one step.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from app.model.carry import CarriedState
from app.model.config import ModelConfig
from app.model.core import mlstm_prefill, mlstm_sequence, mlstm_sequence_from
from app.model.mlstm_core import mlstm_step, state_dtype
from app.model.weight_norm import weight_normed

State = tuple[torch.Tensor, torch.Tensor]  # (h, c), each (B, H)
Weights = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # effective (w_in, w_mh, w_m)


# A model built on the meta device (to take a checkpoint's weights: evaluate, generate, classify, export)
# must not reach torch's Python meta kernels of `mul` or `norm`: they import torch._dynamo, ~2 s of every such
# process; nor its Python `randn` (`normal_` too), which imports sympy through FX's symbolic shapes, 0.7 s.
# Hence `mul_` on a fresh draw (the same values as `*`), _normal and _row_norms.


def _row_norms(w: torch.Tensor) -> torch.Tensor:
    """||w|| per row; on the meta device only the shape."""
    return torch.empty(w.shape[0]) if w.is_meta else w.detach().norm(dim=1)


def _normal(rows: int, cols: int, std: float) -> torch.Tensor:
    """(rows, cols) draws from N(0, std^2) on the default device; on the meta device only the shape."""
    if torch.get_default_device().type == "meta":
        return torch.empty(rows, cols)
    return torch.randn(rows, cols).mul_(std)


class Embedding(nn.Module):
    """Token embedding. Parameters: `weight` (V, E). Also serves as the tied output head (`logits`)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.weight = nn.Parameter(_normal(cfg.vocab_size, cfg.embed_dim, cfg.embed_init_std))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, self.weight)  # (B, T, E)

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """Tied head: (B, T, E) -> (B, T, V) with the embedding matrix transposed."""
        return F.linear(h, self.weight).contiguous()  # (B, T, V)


def tied_head_forward(embedding: Embedding, h: torch.Tensor) -> torch.Tensor:
    """Module-level so DeepSpeed's TiedLayerSpec(forward_fn=...) can pickle/name it."""
    return embedding.logits(h)


class Head(nn.Module):
    """Untied output head. Parameters: `weight` (V, H), `bias` (V)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.weight = nn.Parameter(_normal(cfg.vocab_size, cfg.hidden_dim, cfg.embed_init_std))
        self.bias = nn.Parameter(torch.zeros(cfg.vocab_size))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return F.linear(h, self.weight, self.bias).contiguous()  # (B, T, V)


class RecurrentLayer(nn.Module):
    """One recurrent layer, with its output dropout and (optional) residual connection.

    mLSTM parameters (H = hidden_dim, in = input width):
        weight_in (5H, in)  rows [W_mx (H); W_x (4H) in gate order i, f, o, u]
        weight_mh (H, H), weight_m (4H, H), bias (4H,)
        gain_in (5H,), gain_mh (H,), gain_m (4H,)   only with weight_norm (w = g * v / ||v|| per row)
    LSTM parameters: those of `lstm`, a one-layer batch-first nn.LSTM.
    """

    def __init__(self, cfg: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        self.cell = cfg.cell
        self.in_dim = cfg.embed_dim if layer_idx == 0 else cfg.hidden_dim
        self.hidden_dim = H = cfg.hidden_dim
        self.residual = cfg.residual and self.in_dim == H
        self.weight_norm = cfg.weight_norm
        self.core = cfg.core
        self.drop = nn.Dropout(cfg.dropout)
        self.carry: CarriedState | None = None  # --carry-state: set by the trainer (app.model.carry)
        r = cfg.init_range or 1.0 / math.sqrt(H)
        if self.cell == "lstm":
            self.lstm = nn.LSTM(self.in_dim, H, batch_first=True)
            for p in self.lstm.parameters():
                nn.init.uniform_(p, -r, r)
            with torch.no_grad():
                self.lstm.bias_ih_l0[H : 2 * H].fill_(cfg.forget_bias)  # nn.LSTM gate order i, f, g, o
                self.lstm.bias_hh_l0[H : 2 * H].zero_()
            return
        self.weight_in = nn.Parameter(torch.empty(5 * H, self.in_dim).uniform_(-r, r))
        self.weight_mh = nn.Parameter(torch.empty(H, H).uniform_(-r, r))
        self.weight_m = nn.Parameter(torch.empty(4 * H, H).uniform_(-r, r))
        bias = torch.zeros(4 * H)
        bias[H : 2 * H] = cfg.forget_bias  # gate order i, f, o, u
        self.bias = nn.Parameter(bias)
        if self.weight_norm:
            # g = ||v|| makes the initial function independent of the weight_norm switch.
            self.gain_in = nn.Parameter(_row_norms(self.weight_in))
            self.gain_mh = nn.Parameter(_row_norms(self.weight_mh))
            self.gain_m = nn.Parameter(_row_norms(self.weight_m))

    def weights(self) -> Weights:
        """Effective (w_in, w_mh, w_m), weight-normalised once per call when configured."""
        if not self.weight_norm:
            return self.weight_in, self.weight_mh, self.weight_m
        return (
            weight_normed(self.weight_in, self.gain_in),
            weight_normed(self.weight_mh, self.gain_mh),
            weight_normed(self.weight_m, self.gain_m),
        )

    def _finish(self, x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        h = self.drop(h)
        if self.residual:
            h = h + x
        return h

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (B, T, in) -> (B, T, H), every sequence from a zero state (in training with `self.carry` set,
        rows its mask marks start from the state the same slot's row ended with)."""
        if self.training and self.carry is not None:
            slot, mask = self.carry.next_slot()
            if mask is not None:
                return self._forward_carried(x, slot, mask)
        if self.cell == "lstm":
            h, _ = self.lstm(x)  # (B, T, H)
            return self._finish(x, h).contiguous()
        dev = x.device.type
        cdt = torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else x.dtype
        w_in, w_mh, w_m = self.weights()
        # The custom Function is not autocast-aware: cast the operands once here (not per step) and
        # keep autocast away from its internals.
        with torch.autocast(dev, enabled=False):
            h = mlstm_sequence(
                x.to(cdt), w_in.to(cdt), self.bias, w_mh.to(cdt), w_m.to(cdt), self.core
            )  # (B, T, H)
        return self._finish(x, h).contiguous()

    def _forward_carried(self, x: torch.Tensor, slot: int, mask: torch.Tensor) -> torch.Tensor:
        """Rows the mask marks start from the state the slot's row ended with, the others from zero."""
        zero = self.init_state(x.shape[0], x.device, state_dtype(x.dtype))
        y, state = self.forward_from(x, self.carry.initial(slot, mask, zero))
        self.carry.keep(slot, state)
        return y

    def forward_from(self, x: torch.Tensor, state: State) -> tuple[torch.Tensor, State]:
        """x (B, T, in) from `state` -> (y (B, T, H), state after T steps), with weight gradients (the state
        enters as a constant: truncated backpropagation, as dynamic evaluation uses it)."""
        state = tuple(s.detach() for s in state)
        if self.cell == "lstm":
            h, (h_n, c_n) = self.lstm(x, (state[0].unsqueeze(0), state[1].unsqueeze(0)))  # (B, T, H)
            return self._finish(x, h).contiguous(), (h_n[0].detach(), c_n[0].detach())
        dev = x.device.type
        cdt = torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else x.dtype
        w_in, w_mh, w_m = self.weights()
        with torch.autocast(dev, enabled=False):  # as `forward`: operands cast once, the core in cdt
            h, new_state = mlstm_sequence_from(
                x.to(cdt), state, w_in.to(cdt), self.bias, w_mh.to(cdt), w_m.to(cdt), self.core
            )  # (B, T, H)
        return self._finish(x, h).contiguous(), new_state

    def init_state(self, batch: int, device: torch.device | str, dtype: torch.dtype = torch.float32) -> State:
        """Zero (h, c), each (batch, H)."""
        z = torch.zeros(batch, self.hidden_dim, device=device, dtype=dtype)
        return z, z.clone()

    def prefill(
        self,
        x: torch.Tensor,
        lengths: torch.Tensor,
        weights: Weights | None = None,
        state: State | None = None,
    ) -> tuple[torch.Tensor, State]:
        """Inference: x (B, T, in) right-padded from `state` (zero when None) -> (y (B, T, H), state after
        row b's lengths[b] tokens).

        `weights` are `self.weights()` computed once by a caller that runs many calls (generation).
        """
        if self.cell == "lstm":
            packed = pack_padded_sequence(x, lengths.cpu(), batch_first=True, enforce_sorted=False)
            init = None if state is None else (state[0].unsqueeze(0), state[1].unsqueeze(0))
            out, (h_n, c_n) = self.lstm(packed, init)
            h, _ = pad_packed_sequence(out, batch_first=True, total_length=x.shape[1])  # (B, T, H)
            return self._finish(x, h), (h_n[0], c_n[0])
        w_in, w_mh, w_m = weights or self.weights()
        h, state = mlstm_prefill(x, lengths, w_in, self.bias, w_mh, w_m, state, self.core)  # (B, T, H)
        return self._finish(x, h), state

    def step(
        self, x_t: torch.Tensor, state: State, weights: Weights | None = None
    ) -> tuple[torch.Tensor, State]:
        """Inference: one token x_t (B, in) -> (y_t (B, H), new_state). Same function as `forward`, one step."""
        if self.cell == "lstm":
            h, c = state
            y, (h, c) = self.lstm(x_t.unsqueeze(1), (h.unsqueeze(0), c.unsqueeze(0)))  # (B, 1, H)
            return self._finish(x_t, y.squeeze(1)), (h.squeeze(0), c.squeeze(0))
        w_in, w_mh, w_m = weights or self.weights()
        h, new_state = mlstm_step(x_t, state, w_in, self.bias, w_mh, w_m)  # (B, H)
        return self._finish(x_t, h), new_state
