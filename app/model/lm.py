"""The model for inference with torch alone (no DeepSpeed), and recurrent decoding that carries the state.

`InferenceModel(cfg)` has exactly the state-dict keys of `app.parallel.pipeline.SequentialModel` ("{i}.{name}",
tied head without keys of its own), built from the same layer classes, so it loads any converted checkpoint
(`app.checkpoints.consolidate`) or export (`app.export`) with `load_state_dict(strict=True)`.

`Decoder(model)` is the generation path:
- `prefill(ids, lengths)`: the whole (right-padded) prompt in one sequence pass per layer, returning the
  logits after each row's last real token and the recurrent state there;
- `step(ids, state)`: one token per row, one recurrent step per layer: the prompt is never re-read.
Weight normalisation is applied once when the Decoder is built, not once per token.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from app.model.config import ModelConfig
from app.model.layers import Embedding, Head, RecurrentLayer
from app.model.matmul import linear

State = list[tuple[torch.Tensor, torch.Tensor]]  # per recurrent layer (h, c), each (B, H)


class InferenceModel(nn.Module):
    """[embedding, recurrent x L, head] registered as "0", "1".."L", "L+1" (absent when tied)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.add_module("0", Embedding(cfg))
        for i in range(cfg.num_layers):
            self.add_module(str(i + 1), RecurrentLayer(cfg, i))
        if not cfg.tie_embeddings:
            self.add_module(str(cfg.num_layers + 1), Head(cfg))

    @property
    def embedding(self) -> Embedding:
        return getattr(self, "0")

    @property
    def recurrent(self) -> list[RecurrentLayer]:
        return [getattr(self, str(i + 1)) for i in range(self.cfg.num_layers)]

    def head(self, h: torch.Tensor) -> torch.Tensor:
        if self.cfg.tie_embeddings:
            return self.embedding.logits(h)
        return getattr(self, str(self.cfg.num_layers + 1))(h)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """ids (B, T) -> logits (B, T, V), every row from a zero state (same as SequentialModel)."""
        x = self.embedding(ids)
        for layer in self.recurrent:
            x = layer(x)
        return self.head(x)


def _mlstm_prefill(
    x: torch.Tensor, lengths: torch.Tensor, w_in, bias, w_mh, w_m
) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """x (B, T, in) from a zero state -> (h (B, T, H), (h, c) after the first `lengths[b]` steps of row b).

    The same loop and kernels as `MLSTMFunction.forward` (one input projection for all steps, two
    recurrent products per step), without autograd, keeping every c_t so the state at each row's own
    end can be picked out of a right-padded batch.
    """
    B, T, D = x.shape
    H = w_mh.shape[0]
    xt = x.transpose(0, 1).contiguous()  # (T, B, D)
    proj = linear(xt.view(T * B, D), w_in).view(T, B, 5 * H)  # (T, B, 5H)
    pm, pg = proj[..., :H], proj[..., H:]  # (T, B, H), (T, B, 4H)
    pg += bias
    hs = torch.zeros(T + 1, B, H, dtype=x.dtype, device=x.device)  # h_0 .. h_T
    cs = torch.zeros(T + 1, B, H, dtype=x.dtype, device=x.device)  # c_0 .. c_T
    g = torch.empty(B, 4 * H, dtype=x.dtype, device=x.device)
    hs_u, cs_u, pm_u, pg_u = hs.unbind(0), cs.unbind(0), pm.unbind(0), pg.unbind(0)
    for t in range(T):
        m = pm_u[t] * linear(hs_u[t], w_mh)  # (B, H)
        torch.add(pg_u[t], linear(m, w_m), out=g)  # (B, 4H)
        i, f, o, u = g.split(H, dim=1)
        c = cs_u[t + 1]
        torch.mul(torch.sigmoid(f), cs_u[t], out=c)
        c.addcmul_(torch.sigmoid(i), torch.tanh(u))
        torch.mul(torch.sigmoid(o), torch.tanh(c), out=hs_u[t + 1])
    rows = torch.arange(B, device=x.device)
    return hs[1:].transpose(0, 1), (hs[lengths, rows], cs[lengths, rows])


class Decoder:
    """Prefill + per-token steps over an InferenceModel (eval mode, no grad, weights normalised once)."""

    def __init__(self, model: InferenceModel) -> None:
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

    @torch.no_grad()
    def prefill(self, ids: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, State]:
        """ids (B, T) right-padded, lengths (B,) >= 1 -> (logits (B, V) after each row's last token, state)."""
        lengths = lengths.to(self.device)
        last = lengths - 1
        rows = torch.arange(ids.shape[0], device=self.device)
        x = self.model.embedding(ids.to(self.device))  # (B, T, E)
        state: State = []
        for layer, w in zip(self.model.recurrent, self._w):
            if w is None:
                packed = pack_padded_sequence(x, lengths.cpu(), batch_first=True, enforce_sorted=False)
                out, (h_n, c_n) = layer.lstm(packed)
                h, _ = pad_packed_sequence(out, batch_first=True, total_length=x.shape[1])  # (B, T, H)
                state.append((h_n[0], c_n[0]))
            else:
                h, (h_last, c_last) = _mlstm_prefill(x, lengths, w[0], layer.bias, w[1], w[2])
                state.append((h_last, c_last))
            x = layer._finish(x, h)  # residual (and dropout, a no-op in eval mode)
        return self.model.head(x[rows, last]), state  # head only where it is needed: (B, V)

    @torch.no_grad()
    def step(self, ids: torch.Tensor, state: State) -> tuple[torch.Tensor, State]:
        """ids (B,) -> (logits (B, V), new state): one recurrent step per layer."""
        x = F.embedding(ids.to(self.device), self.model.embedding.weight)  # (B, E)
        new: State = []
        for layer, w, (h, c) in zip(self.model.recurrent, self._w, state):
            if w is None:
                _, (h, c) = layer.lstm(x.unsqueeze(1), (h.unsqueeze(0), c.unsqueeze(0)))
                h, c = h.squeeze(0), c.squeeze(0)
            else:
                w_in, w_mh, w_m = w
                H = w_mh.shape[0]
                p = linear(x, w_in)  # (B, 5H)
                z = p[:, H:] + linear(p[:, :H] * linear(h, w_mh), w_m) + layer.bias  # (B, 4H)
                i, f, o, u = z.split(H, dim=1)
                c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(u)
                h = torch.tanh(c) * torch.sigmoid(o)
            new.append((h, c))
            x = layer._finish(x, h)
        return self.model.head(x), new
