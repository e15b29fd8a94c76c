"""Exact evaluation over a split: every real token counted once, pads excluded, the last batch included."""

from __future__ import annotations

import math
from dataclasses import dataclass

from app.batching.buckets import BucketSchedule, TokenStore, collate
from app.common.logs import Progress
from app.parallel.engine import Engine


@dataclass(frozen=True, slots=True)
class EvalResult:
    nats: float  # summed cross-entropy
    tokens: int
    num_bytes: int

    @property
    def loss(self) -> float:
        """Nats per token."""
        return self.nats / max(1, self.tokens)

    @property
    def perplexity(self) -> float:
        return math.exp(min(self.loss, 700.0))

    @property
    def bits_per_byte(self) -> float:
        return self.nats / math.log(2) / max(1, self.num_bytes)

    def as_dict(self, prefix: str) -> dict:
        return {
            f"{prefix}/loss": self.loss,
            f"{prefix}/ppl": self.perplexity,
            f"{prefix}/bpb": self.bits_per_byte,
            f"{prefix}/tokens": self.tokens,
            f"{prefix}/bytes": self.num_bytes,
        }


def evaluate(
    engine: Engine,
    sched: BucketSchedule,
    store: TokenStore,
    bos_id: int,
    pad_id: int,
    max_steps: int = 0,
    head_steps: int = 0,
    progress: Progress | None = None,
) -> tuple[EvalResult, EvalResult]:
    """Evaluate the split behind `sched` (built with shuffle=False); `max_steps` > 0 caps the work.
    Returns the result and the result over its first `head_steps` batches (all of them when 0): the
    figure a periodic evaluation capped at `head_steps` gives, so a full one compares with it.
    `progress` counts the global batches done."""
    steps = sched.epoch(0)
    if max_steps:
        steps = steps[:max_steps]
    nats, tokens, nbytes = 0.0, 0, 0
    head = None
    for i, step in enumerate(steps):
        if i == head_steps and head_steps:
            head = EvalResult(nats, tokens, nbytes)
        mine = sched.for_rank(step, engine.dp_rank)
        batches = [collate(store, mb, bos_id, pad_id) for mb in mine] if engine.needs_data else None
        nats += engine.eval_step(batches, per_rank=len(mine))
        tokens += sum(mb.tokens for mb in step)
        nbytes += sum(mb.num_bytes for mb in step)
        if progress is not None:
            progress.update()
    res = EvalResult(nats, tokens, nbytes)
    return res, head or res
