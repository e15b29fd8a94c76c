"""Recurrent decoding that carries the state, so each new token costs one step per layer.

- `prefill(ids, lengths)`: the whole (right-padded) prompt in one sequence pass per layer, returning the
  logits after each row's last real token and the recurrent state there (`prefill_in_groups`: the same, a
  bounded number of tokens at a time);
- `step(ids, state)`: one token per row: the prompt is never re-read;
- `read(ids, state)`: every position's logits of full-width rows from `state`, and the state after them
  (a long text scored as one stream, a chunk at a time: `app.evaluation.stream`); `hidden(ids, state)`
  the top layer's outputs there (the neural cache's keys: `app.evaluation.cache`).
Weight normalisation is applied once when the Decoder is built, not once per token. The cell math is
the model's own (`RecurrentLayer.prefill/step` -> `app.model.mlstm_core`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from app.model import gpu_health
from app.model.config import ModelConfig
from app.model.lm import LanguageModel
from app.model.memory import prefill_floats_per_token

State = list[tuple[torch.Tensor, torch.Tensor]]  # per recurrent layer (h, c), each (B, H)
PREFILL_BYTES = (
    256 << 20
)  # a prefill group's activations (app.model.memory's estimate): prompts read together


def prefill_tokens(cfg: ModelConfig) -> int:
    """Padded tokens a prefill group reads at once: PREFILL_BYTES of activations (12,000 tokens of a model of
    hidden_dim 256, 780 of one of 4096), enough rows for the sequence loop to run wide."""
    return max(1, PREFILL_BYTES // (4 * prefill_floats_per_token(cfg, cfg.num_layers)))


class Decoder:
    """Prefill + per-token steps over a LanguageModel (eval mode, no grad, weights normalised once)."""

    def __init__(self, model: LanguageModel) -> None:
        self.model = model.eval()
        self.cfg = model.cfg
        with torch.no_grad():
            self._w = [
                tuple(w.detach() for w in layer.weights()) if layer.cell == "mlstm" else None
                for layer in model.recurrent
            ]

    @property
    def device(self) -> torch.device:
        return self.model.embedding.weight.device

    def _layers(
        self, ids: torch.Tensor, lengths: torch.Tensor, state: State | None
    ) -> tuple[torch.Tensor, State]:
        """Embedding and every recurrent layer over right-padded ids (B, T) -> (x (B, T, H), state after
        each row's lengths[b] tokens); read again where a GPU loop failed in it (app/model/gpu_health.py)."""
        return gpu_health.checked(self._read_layers, ids, lengths, state)

    def _read_layers(
        self, ids: torch.Tensor, lengths: torch.Tensor, state: State | None
    ) -> tuple[torch.Tensor, State]:
        x = self.model.embedding(ids.to(self.device))  # (B, T, E)
        start = state or [None] * len(self._w)
        new: State = []
        for layer, w, layer_state in zip(self.model.recurrent, self._w, start):
            x, layer_state = layer.prefill(x, lengths, w, layer_state)  # (B, T, H)
            new.append(layer_state)
        return x, new

    @torch.no_grad()
    def prefill(
        self, ids: torch.Tensor, lengths: torch.Tensor, state: State | None = None
    ) -> tuple[torch.Tensor, State]:
        """ids (B, T) right-padded, lengths (B,) >= 1, from `state` (zero when None: a new document)
        -> (logits (B, V) after each row's last token, state there)."""
        lengths = lengths.to(self.device)
        rows = torch.arange(ids.shape[0], device=self.device)
        x, new = self._layers(ids, lengths, state)  # (B, T, H)
        return self.model.head(x[rows, lengths - 1]), new  # head only where it is needed: (B, V)

    @torch.no_grad()
    def prefill_in_groups(
        self, ids: torch.Tensor, lengths: torch.Tensor, tokens: int
    ) -> tuple[torch.Tensor, State]:
        """`prefill(ids, lengths)` from a zero state, at most `tokens` padded tokens at a time: consecutive
        rows in groups (each padded to its own longest prompt), and a prompt longer than `tokens` alone, in
        pieces of that many with its state carried. The same logits and state as one prefill (rows are
        independent and the recurrence causal), in the memory of `tokens` tokens however many prompts."""
        lengths = lengths.cpu()
        logits, states, start = [], [], 0
        while start < ids.shape[0]:
            end, longest = start + 1, int(lengths[start])
            while end < ids.shape[0] and (end + 1 - start) * max(longest, int(lengths[end])) <= tokens:
                longest, end = max(longest, int(lengths[end])), end + 1
            state, step = (
                None,
                min(longest, tokens),
            )  # a group fits whole; a long prompt alone, piece by piece
            for a in range(0, longest, step):
                piece = lengths[start:end].clamp(max=a + step) - a
                logit, state = self.prefill(ids[start:end, a : a + step], piece, state)
            logits.append(logit)
            states.append(state)
            start = end
        joined = [
            tuple(torch.cat([st[i][k] for st in states]) for k in range(2)) for i in range(len(self._w))
        ]
        return torch.cat(logits), joined

    @torch.no_grad()
    def hidden(self, ids: torch.Tensor, state: State | None = None) -> tuple[torch.Tensor, State]:
        """ids (B, T), every position read, from `state` (zero when None) -> (the top recurrent layer's
        outputs (B, T, H), state after the T tokens)."""
        full = torch.full((ids.shape[0],), ids.shape[1], device=self.device)
        return self._layers(ids, full, state)

    @torch.no_grad()
    def read(self, ids: torch.Tensor, state: State | None = None) -> tuple[torch.Tensor, State]:
        """ids (B, T), every position read, from `state` (zero when None) -> (logits (B, T, V), state after
        the T tokens)."""
        x, new = self.hidden(ids, state)  # (B, T, H)
        return self.model.head(x), new  # (B, T, V)

    @torch.no_grad()
    def step(self, ids: torch.Tensor, state: State) -> tuple[torch.Tensor, State]:
        """ids (B,) -> (logits (B, V), new state): one recurrent step per layer."""
        x = F.embedding(ids.to(self.device), self.model.embedding.weight)  # (B, E)
        new: State = []
        for layer, w, layer_state in zip(self.model.recurrent, self._w, state):
            x, layer_state = layer.step(x, layer_state, w)  # (B, H)
            new.append(layer_state)
        return self.model.head(x), new
