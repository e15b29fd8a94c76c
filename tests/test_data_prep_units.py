"""Fast unit checks: bucket boundaries, split assignment, segment splits."""

from __future__ import annotations

import numpy as np
import pytest

from data_prep import buckets, splits
from data_prep.encode import segment_codes


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


def test_split_assignment_is_pure():
    u = np.random.default_rng(0).random(1000)
    codes = splits.assign(u, 0.1, 0.1)
    assert abs((codes == 1).mean() - 0.1) < 0.03 and abs((codes == 2).mean() - 0.1) < 0.03
    assert codes.tolist() == [splits.code_of(x, 0.1, 0.1) for x in u]
    more = splits.assign(np.concatenate([u, np.random.default_rng(1).random(500)]), 0.1, 0.1)
    assert (more[:1000] == codes).all()


@pytest.mark.parametrize("val,test", [(0.05, 0.05), (0.1, 0.0), (0.3, 0.3)])
def test_segment_codes_are_contiguous_runs(val, test):
    n_chunks = np.array([1, 2, 3, 7, 20, 400])
    codes = segment_codes(n_chunks, val, test)
    assert len(codes) == n_chunks.sum()
    for doc in np.split(codes, np.cumsum(n_chunks)[:-1]):
        assert (np.diff(doc) >= 0).all() and doc[0] == 0  # train, then validation, then test
        n = len(doc)
        if n >= 3:
            assert ((doc == 1).sum() >= 1) == (val > 0) and ((doc == 2).sum() >= 1) == (test > 0)
            assert abs((doc == 1).sum() - val * n) <= 1 and abs((doc == 2).sum() - test * n) <= 1
        else:
            assert (doc == 0).all()
