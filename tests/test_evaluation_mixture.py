"""The Bayesian mixture of sequential predictors (app/evaluation/mixture.py), with which dynamic evaluation
scores its step sizes and the neural cache its grid.

Reference: the mixture run token by token in float64 on fresh random log-probabilities.
"""

from __future__ import annotations

import math
import random

import pytest
import torch

from app.evaluation.cache import CacheResult
from app.evaluation.dynamic import DynamicResult
from app.evaluation.mixture import mixture_nats, posterior


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
    mixed, weights = mixture_nats(totals), posterior(totals)
    assert mixed == pytest.approx(online_mixture(logp), rel=1e-12), f"seed {seed}"
    assert min(totals) <= mixed <= min(totals) + math.log(k)
    assert sum(weights) == pytest.approx(1.0) and max(weights) == weights[totals.index(min(totals))]
    assert mixture_nats(totals[:1]) == totals[0]
    assert mixture_nats((1e7, 1e7 + 1.0)) == pytest.approx(1e7 - math.log((1 + math.exp(-1)) / 2), rel=1e-15)
    # both users report this figure and these weights
    dyn = DynamicResult(0.0, (1e-4, 3e-4, 1e-3, 3e-3), totals, n, 0.0, 0.0)
    cache = CacheResult(((0.1, 0.3),) * k, totals, n, 0.0)
    assert dyn.dynamic_nats == cache.cache_nats == mixed and dyn.posterior() == weights


def test_a_diverged_learner_gets_no_weight():
    """A learner whose loss is NaN (it diverged) gave the text probability 0: the mixture is that of the
    others, each with its 1/K prior; with every learner diverged there is no finite code length."""
    nats = (math.nan, 100.0, 101.0)
    assert mixture_nats(nats) == pytest.approx(100.0 - math.log((1 + math.exp(-1)) / 3), rel=1e-15)
    assert posterior(nats)[0] == 0.0 and sum(posterior(nats)) == pytest.approx(1.0)
    assert mixture_nats((math.nan, math.inf)) == math.inf and posterior((math.nan, math.inf)) == (0.0, 0.0)
