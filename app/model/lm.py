"""The language model as one torch module: every single-process use (training at P = 1 and ZeRO-2/3,
evaluation, generation, export) builds this class; `app.parallel.pipeline` builds the same layers as
DeepSpeed pipeline specs.

Layers are registered under their index: "0" embedding, "1".."L" recurrent, "L+1" the untied head (no
module when tied: the head is the embedding transposed). State-dict keys are "{i}.{name}", the same as
DeepSpeed's per-layer checkpoint files `layer_{i:02d}`; they are the checkpoint and export format, so
they do not change. Given `base_seed`, layer i is built right after `torch.manual_seed(base_seed + i)`,
exactly as DeepSpeed's `seed_layers` builds pipeline layers, so the weights do not depend on the layout.
"""

from __future__ import annotations

import torch
from torch import nn

from app.model.config import ModelConfig
from app.model.layers import Embedding, Head, RecurrentLayer

DEFAULT_SEED = 1234


def seed_layer(seed: int) -> None:
    """Seed the RNG before building one layer (also DeepSpeed's `seed_fn`)."""
    torch.manual_seed(seed)


class LanguageModel(nn.Module):
    """forward(ids (B, T)) -> logits (B, T, V), every row from a zero state."""

    def __init__(self, cfg: ModelConfig, base_seed: int | None = None) -> None:
        super().__init__()
        self.cfg = cfg
        builders = [
            lambda: Embedding(cfg),
            *(lambda i=i: RecurrentLayer(cfg, i) for i in range(cfg.num_layers)),
        ]
        if not cfg.tie_embeddings:
            builders.append(lambda: Head(cfg))
        for i, build in enumerate(builders):
            if base_seed is not None:
                seed_layer(base_seed + i)
            self.add_module(str(i), build())

    @property
    def embedding(self) -> Embedding:
        return getattr(self, "0")

    @property
    def recurrent(self) -> list[RecurrentLayer]:
        return [getattr(self, str(i + 1)) for i in range(self.cfg.num_layers)]

    def head(self, h: torch.Tensor) -> torch.Tensor:
        """(..., H) -> (..., V) logits."""
        if self.cfg.tie_embeddings:
            return self.embedding.logits(h)
        return getattr(self, str(self.cfg.num_layers + 1))(h)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embedding(ids)  # (B, T, E)
        for layer in self.recurrent:
            x = layer(x)  # (B, T, H)
        return self.head(x)  # (B, T, V)


InferenceModel = LanguageModel  # the name before the restructure (app.inference.InferenceModel)
