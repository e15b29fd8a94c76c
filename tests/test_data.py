"""Bucketed batch planning: coverage, bucket purity, disjoint ranks, determinism, filler steps, collation."""

import numpy as np
import pytest
from datasets import Dataset, concatenate_datasets

from app.training.batching import IGNORE_INDEX, BucketSchedule, TokenStore, collate

BOUNDS = [4, 8, 16]


def make_split(n: int, seed: int = 0) -> Dataset:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 17, size=n)
    ids = [rng.integers(3, 50, size=k).astype(np.int32).tolist() for k in lengths]
    bucket = [int(np.searchsorted(BOUNDS, k)) for k in lengths]
    cols = {
        "input_ids": ids,
        "length": lengths.tolist(),
        "num_bytes": (lengths * 2).tolist(),
        "bucket": bucket,
    }
    half = n // 2
    # Two Arrow chunks, as a split saved in several shards has.
    return concatenate_datasets(
        [
            Dataset.from_dict({k: v[:half] for k, v in cols.items()}),
            Dataset.from_dict({k: v[half:] for k, v in cols.items()}),
        ]
    )


@pytest.fixture(scope="module")
def split():
    return make_split(203)


def sched(store, **kw):
    args = dict(micro_batch=4, grad_accum=3, data_parallel=2, seed=7)
    args.update(kw)
    return BucketSchedule(store, BOUNDS, **args)


def test_store_reads_every_row_across_chunks(split):
    store = TokenStore(split)
    assert len(store.lengths) == 203
    for i in (0, 100, 101, 102, 202):
        assert store.ids(i).tolist() == split[i]["input_ids"]


@pytest.mark.parametrize("budget", [0, 32])
def test_epoch_covers_every_example_once_with_pure_buckets(split, budget):
    store = TokenStore(split)
    s = sched(store, tokens_per_micro_batch=budget)
    steps = s.epoch(0)
    assert len(steps) == s.steps_per_epoch
    seen = np.concatenate([mb.indices for step in steps for mb in step])
    assert sorted(seen.tolist()) == list(range(203))
    for step in steps:
        assert len(step) == 6
        for mb in step:
            if len(mb.indices):
                assert len(set(store.buckets[mb.indices].tolist())) == 1
                b = store.buckets[mb.indices[0]]
                cap = max(1, budget // BOUNDS[b]) if budget else 4
                assert len(mb.indices) <= cap
                assert mb.tokens == store.lengths[mb.indices].sum()


def test_ranks_disjoint_and_same_step_count(split):
    store = TokenStore(split)
    s = sched(store)
    for step in s.epoch(1):
        r0, r1 = s.for_rank(step, 0), s.for_rank(step, 1)
        assert len(r0) == len(r1) == 3
        a = set(np.concatenate([m.indices for m in r0]).tolist())
        b = set(np.concatenate([m.indices for m in r1]).tolist())
        assert not a & b


def test_deterministic_per_epoch_and_shuffled_between(split):
    store = TokenStore(split)
    e0 = [mb.indices.tolist() for st in sched(store).epoch(0) for mb in st]
    e0b = [mb.indices.tolist() for st in sched(store).epoch(0) for mb in st]
    e1 = [mb.indices.tolist() for st in sched(store).epoch(1) for mb in st]
    assert e0 == e0b and e0 != e1


def test_eval_order_is_unshuffled(split):
    store = TokenStore(split)
    s = sched(store, shuffle=False)
    first = [mb.indices.tolist() for st in s.epoch(0) for mb in st if len(mb.indices)]
    assert first == [mb.indices.tolist() for st in s.epoch(5) for mb in st if len(mb.indices)]


def test_collate_right_pads_and_shifts(split):
    store = TokenStore(split)
    mb = next(m for st in sched(store).epoch(0) for m in st if len(m.indices) > 1)
    x, y = collate(store, mb, bos_id=2, pad_id=0)
    assert x.shape == y.shape and x.dtype == y.dtype
    for r, i in enumerate(mb.indices):
        s = store.ids(int(i)).tolist()
        assert y[r, : len(s)].tolist() == s
        assert (y[r, len(s) :] == IGNORE_INDEX).all()
        assert x[r, 0] == 2 and x[r, 1 : len(s)].tolist() == s[:-1]
        assert (x[r, len(s) :] == 0).all()
    assert int((y != IGNORE_INDEX).sum()) == mb.tokens


def test_filler_micro_batch_has_no_targets(split):
    store = TokenStore(split)
    steps = sched(store, micro_batch=64).epoch(0)
    fillers = [mb for st in steps for mb in st if len(mb.indices) == 0]
    assert fillers, "203 examples in micro-batches of 64 cannot fill 6 per step"
    _, y = collate(store, fillers[0], bos_id=2, pad_id=0)
    assert (y == IGNORE_INDEX).all() and fillers[0].tokens == 0
