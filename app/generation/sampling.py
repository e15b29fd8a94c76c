"""Next-token sampling: temperature, top-k, top-p (nucleus); deterministic given a torch.Generator."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from app.common.numbers import check_numbers


@dataclass(frozen=True, slots=True)
class SamplingConfig:
    temperature: float = 1.0  # 0: greedy
    top_k: int = 0  # 0: off
    top_p: float = 1.0  # 1: off

    def __post_init__(self) -> None:
        check_numbers(self)
        if self.temperature < 0:
            raise ValueError(f"--temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"--top-k must be >= 0 (0 = off), got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"--top-p must be in (0, 1] (1 = off), got {self.top_p}")


def sample_next(
    logits: torch.Tensor, cfg: SamplingConfig, gen: torch.Generator | None, banned: list[int] = ()
) -> torch.Tensor:
    """logits (B, V) -> token ids (B,). `banned` ids (pad, bos) are never produced."""
    logits = logits.float().clone()
    if banned:
        logits[:, list(banned)] = float("-inf")
    if cfg.temperature == 0.0:
        return logits.argmax(dim=-1)
    logits /= cfg.temperature
    if cfg.top_k and cfg.top_k < logits.shape[-1]:
        kth = torch.topk(logits, cfg.top_k, dim=-1).values[:, -1:]  # (B, 1)
        logits[logits < kth] = float("-inf")
    if cfg.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        cum = torch.softmax(sorted_logits, dim=-1).cumsum(dim=-1)  # (B, V)
        drop = cum - torch.softmax(sorted_logits, dim=-1) >= cfg.top_p  # mass before a token already >= p
        sorted_logits[drop] = float("-inf")
        logits = torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_logits)
    probs = torch.softmax(logits, dim=-1)
    return torch.multinomial(probs.cpu(), 1, generator=gen).squeeze(1).to(logits.device)
