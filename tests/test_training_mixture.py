"""The Bayesian mixture of sequential predictors (app/training/mixture.py), through DynamicResult, which
scores dynamic evaluation's step sizes with it (the neural cache's grid uses the same functions).

Reference: the mixture run token by token in float64 on fresh random log-probabilities.
"""

from __future__ import annotations

import math
import random

import pytest
import torch

from app.training.dynamic_eval import DynamicResult


def online_mixture(logp: torch.Tensor) -> float:
    """Reference in float64: K learners' log-probabilities of each realised token (K, N) mixed token by
    token, each weighted by its prior 1/K times the probability it gave the tokens before -> summed nats."""
    k = logp.shape[0]
    log_w, nats = torch.full((k,), -math.log(k), dtype=torch.float64), 0.0
    for t in range(logp.shape[1]):
        joint = log_w + logp[:, t]
        p = torch.logsumexp(joint, 0)
        nats -= float(p)
        log_w = joint - p  # the posterior after token t
    return nats


def test_mixture_figure_is_the_token_by_token_bayesian_mixture():
    """The figure computed from the learners' totals equals the mixture run token by token (fresh random
    log-probabilities), lies within ln K of the best learner, and is the learner itself when K = 1."""
    seed = random.randrange(1 << 30)
    g = torch.Generator().manual_seed(seed)
    k, n = 4, 400
    logp = torch.log_softmax(3 * torch.randn(k, n, 30, generator=g, dtype=torch.float64), -1)[..., 0]
    totals = tuple(float(-row.sum()) for row in logp)
    res = DynamicResult(0.0, (1e-4, 3e-4, 1e-3, 3e-3), totals, n, 0.0, 0.0)
    assert res.dynamic_nats == pytest.approx(online_mixture(logp), rel=1e-12), f"seed {seed}"
    assert min(totals) <= res.dynamic_nats <= min(totals) + math.log(k)
    assert (
        sum(res.posterior()) == pytest.approx(1.0)
        and max(res.posterior()) == res.posterior()[totals.index(min(totals))]
    )
    assert DynamicResult(0.0, (1e-3,), totals[:1], n, 0.0, 0.0).dynamic_nats == totals[0]
    far = DynamicResult(0.0, (1.0, 2.0), (1e7, 1e7 + 1.0), n, 0.0, 0.0)  # large totals: no overflow
    assert far.dynamic_nats == pytest.approx(1e7 - math.log((1 + math.exp(-1)) / 2), rel=1e-15)


def test_a_diverged_learner_gets_no_weight():
    """A learner whose loss is NaN (it diverged) gave the text probability 0: the mixture is that of the
    others, each with its 1/K prior; with every learner diverged there is no finite code length."""
    res = DynamicResult(0.0, (3e-3, 1e-3, 3e-4), (math.nan, 100.0, 101.0), 10, 0.0, 0.0)
    assert res.dynamic_nats == pytest.approx(100.0 - math.log((1 + math.exp(-1)) / 3), rel=1e-15)
    assert res.posterior()[0] == 0.0 and sum(res.posterior()) == pytest.approx(1.0)
    dead = DynamicResult(0.0, (1.0, 2.0), (math.nan, math.inf), 10, 0.0, 0.0)
    assert dead.dynamic_nats == math.inf and dead.posterior() == (0.0, 0.0)
