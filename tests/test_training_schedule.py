import itertools
import math

import pytest

from app.training.schedule import lr_multiplier


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
