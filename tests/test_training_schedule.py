import itertools
import math

import pytest

from app.training.schedule import budget_lr_multiplier, lr_multiplier


@pytest.mark.parametrize("decay", ["cosine", "linear"])
def test_warmup_then_decay_to_floor(decay):
    kw = dict(warmup=10, total=110, decay=decay, min_ratio=0.1)
    lrs = [lr_multiplier(s, **kw) for s in range(120)]
    assert lrs[0] == pytest.approx(0.1) and lrs[9] == pytest.approx(1.0)
    assert all(a <= b for a, b in itertools.pairwise(lrs[:10]))
    assert all(a >= b for a, b in itertools.pairwise(lrs[10:]))
    assert lrs[110] == pytest.approx(0.1) and lrs[119] == pytest.approx(0.1)
    mid = lrs[60]
    assert mid == pytest.approx(
        0.55 if decay == "linear" else 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5))
    )


def test_constant():
    assert lr_multiplier(500, warmup=10, total=100, decay="constant", min_ratio=0.1) == 1.0


@pytest.mark.parametrize("decay", ["cosine", "linear", "constant"])
def test_budget_schedule_warms_up_by_steps_then_decays_over_the_budget_fraction(decay):
    kw = dict(warmup=5, decay=decay, min_ratio=0.1)
    # warmup: steps, whatever the clock says
    assert [budget_lr_multiplier(s, 0.9, 0.0, **kw) for s in range(5)] == pytest.approx(
        [0.2, 0.4, 0.6, 0.8, 1.0]
    )
    decay_from = 0.2  # the fraction at which the warmup ended
    fractions = [decay_from + (1 - decay_from) * i / 40 for i in range(41)]
    lrs = [budget_lr_multiplier(100, f, decay_from, **kw) for f in fractions]
    assert lrs[0] == pytest.approx(1.0)
    assert all(a >= b for a, b in itertools.pairwise(lrs))
    assert budget_lr_multiplier(100, 1.5, decay_from, **kw) == pytest.approx(lrs[-1])  # clamped past the end
    # the same curve as the step schedule, with progress = the decay's share of the remaining time
    for f, lr in zip(fractions, lrs):
        progress = (f - decay_from) / (1 - decay_from)
        steps_kw = dict(warmup=0, total=1000, decay=decay, min_ratio=0.1)
        assert lr == pytest.approx(lr_multiplier(round(progress * 1000), **steps_kw), abs=2e-3)
    if decay != "constant":
        assert lrs[-1] == pytest.approx(0.1) and lrs[20] == pytest.approx(
            0.55 if decay == "linear" else 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5))
        )
    # a warmup that used the whole budget leaves the floor, not a division by zero
    assert budget_lr_multiplier(100, 1.0, 1.0, **kw) == pytest.approx(1.0 if decay == "constant" else 0.1)
