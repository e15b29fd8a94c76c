"""app/evaluation/held_out.py: a full evaluation also gives the figure of a capped (periodic) one."""

import pytest
from test_batching_buckets import BOUNDS, make_split

from app.batching.buckets import BucketSchedule, TokenStore
from app.evaluation.held_out import evaluate


class CountingEngine:
    """An engine whose "loss" of a global batch is its number of real tokens (the labels' count), so a
    result's nats say exactly which batches it summed."""

    needs_data, dp_rank = True, 0

    def eval_step(self, batches, per_rank):
        assert len(batches) == per_rank
        return float(sum(int((y >= 0).sum()) for _, y in batches))


@pytest.mark.parametrize("head_steps", [0, 1, 3, 10_000])
def test_the_head_of_a_full_evaluation_is_the_capped_evaluation(head_steps):
    store = TokenStore(make_split(203))
    sched = BucketSchedule(store, BOUNDS, micro_batch=4, grad_accum=2, data_parallel=1, seed=0, shuffle=False)
    engine = CountingEngine()
    full, head = evaluate(engine, sched, store, 1, 0, 0, head_steps)
    assert full.tokens == sum(store.lengths) and full.nats == full.tokens
    capped, same = evaluate(engine, sched, store, 1, 0, head_steps)
    assert same == capped  # no head asked: the result itself
    assert head == capped  # nats, tokens and bytes over exactly the first head_steps batches
    assert (head == full) == (head_steps in (0, 10_000))
