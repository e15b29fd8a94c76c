"""Fast unit checks: bucket boundaries and split assignment."""

from __future__ import annotations

import numpy as np
import pytest

from data_prep import buckets, splits


@pytest.mark.parametrize("seed", range(5))
def test_bucket_invariants(seed):
    rng = np.random.default_rng(seed)
    lengths = np.concatenate(
        [np.full(int(rng.integers(0, 2000)), 256), rng.integers(1, 257, int(rng.integers(1, 3000)))]
    )
    bounds = buckets.choose_boundaries(lengths, max_buckets=16, batch_size=16)
    assert bounds == sorted(set(bounds)) and bounds[-1] >= lengths.max() and len(bounds) <= 16
    b = buckets.assign(lengths, bounds)
    assert (lengths <= np.asarray(bounds)[b]).all()
    assert ((b == 0) | (lengths > np.asarray(bounds)[np.maximum(b - 1, 0)])).all()
    counts = np.bincount(b, minlength=len(bounds))
    assert len(bounds) == 1 or counts.min() >= 16  # every bucket can fill a batch
    eff = buckets.padding_efficiency(lengths, b, 16, seed)
    assert eff >= buckets.padding_efficiency(lengths, None, 16, seed) and eff > 0.9


def test_split_assignment_is_pure_and_rescues_tiny_corpora():
    u = np.random.default_rng(0).random(1000)
    codes, notes = splits.assign(u, 0.1, 0.1)
    assert notes == [] and abs((codes == 1).mean() - 0.1) < 0.03 and abs((codes == 2).mean() - 0.1) < 0.03
    more, _ = splits.assign(np.concatenate([u, np.random.default_rng(1).random(500)]), 0.1, 0.1)
    assert (more[:1000] == codes).all()
    tiny, notes = splits.assign(np.array([0.5, 0.6, 0.7, 0.8]), 0.05, 0.05)
    assert sorted(tiny.tolist()) == [0, 0, 1, 2] and len(notes) == 2
