"""The Bayesian mixture of K sequential predictors, from each one's total code length on the text.

Each token predicted by the K predictors weighted by prior 1/K times the probability each gave the text
before it: the product of these predictions telescopes to Σ_k (1/K) exp(-L_k), so the mixture's code
length is -ln of that, with L_k predictor k's nats on the whole text. It lies within ln K nats of the best
predictor's, which is chosen as the text is read, never after it. A predictor whose code length is not
finite (it diverged: NaN) gave the text probability 0 and gets no weight.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def _finite(nats: Sequence[float]) -> list[float]:
    return [n if math.isfinite(n) else math.inf for n in nats]


def mixture_nats(nats: Sequence[float]) -> float:
    """-ln Σ_k (1/K) exp(-L_k) (one predictor: its own nats; all diverged: inf)."""
    finite = _finite(nats)
    best = min(finite)
    if best == math.inf:
        return math.inf
    return best - math.log(sum(math.exp(best - n) for n in finite) / len(finite))


def posterior(nats: Sequence[float]) -> tuple[float, ...]:
    """Each predictor's weight in the mixture after the whole text (proportional to exp(-L_k))."""
    finite = _finite(nats)
    best = min(finite)
    if best == math.inf:
        return tuple(0.0 for _ in finite)
    w = [math.exp(best - n) for n in finite]
    total = sum(w)
    return tuple(x / total for x in w)
