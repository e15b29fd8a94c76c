"""Token-weighted language-model loss, usable as a DeepSpeed PipelineModule `loss_fn`.

Goal: the optimiser sees the mean cross-entropy over ALL real (non-pad) tokens of the global batch,
whatever the split into micro-batches and data-parallel ranks. DeepSpeed instead averages per
micro-batch losses: it divides each micro-batch loss by grad_accum_steps and averages gradients over
the dp_world ranks, which over-weights tokens of short micro-batches.

So `token_loss` returns a SUM over real tokens times a scale the trainer supplies with the labels:

    scale = (grad_accum_steps * dp_world) / total_real_tokens_in_global_batch

After DeepSpeed's division by grad_accum_steps and its mean over dp_world ranks, the accumulated
gradient is exactly that of sum(all per-token CE) / total_real_tokens. With one micro-batch on one rank,
scale = 1 / tokens and the value is the plain mean CE.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

IGNORE_INDEX = -100
"""Target value of pad positions (skipped by the loss)."""


def token_loss(logits: torch.Tensor, labels: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """logits (B, T, V); labels = (targets (B, T) int64 with pad = -100, scale (1,) float32) -> scalar.

    Returns sum of per-token CE over real tokens * scale (see the module docstring for scale).
    """
    targets, scale = labels
    B, T, V = logits.shape
    ce_sum = F.cross_entropy(
        logits.reshape(B * T, V).float(), targets.reshape(B * T), ignore_index=IGNORE_INDEX, reduction="sum"
    )
    return ce_sum * scale.to(ce_sum.device, torch.float32).reshape(())


def loss_scale(real_tokens: int, grad_accum_steps: int = 1, dp_world: int = 1) -> torch.Tensor:
    """The `scale` for token_loss: (grad_accum_steps * dp_world) / real tokens of the global batch, (1,)."""
    if real_tokens < 1:
        raise ValueError(f"real_tokens must be >= 1, got {real_tokens}")
    return torch.tensor([grad_accum_steps * dp_world / real_tokens], dtype=torch.float32)
