"""--carry-state's plan (app/batching/carry_schedule.py) and its numerics (app/model/carry.py,
app/training/carry_state.py, `collate` of a continuing row).

- On a real data_prep output: `chains` finds each long document's chunks in order; every example is planned
  once; every chunk of a document lands in the same (rank, slot, row) as the chunk before it, in the slot's
  next stream micro-batch, carrying; a new document's first chunk starts from zero.
- In float64: training forwards over the whole plan, state carried from slot to slot as the trainer hands
  it, give each document the loss of ONE forward pass of LanguageModel over the whole document; without
  carried state (BucketSchedule) the figure differs.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from datasets import Dataset

from app.batching.buckets import BucketSchedule, TokenStore, collate
from app.batching.carry_schedule import CarrySchedule, chains
from app.model.config import debug_config
from app.model.lm import LanguageModel
from app.model.loss import IGNORE_INDEX
from app.training import carry_state
from data_prep.format import load_prepared

BOS, EOS, PAD = 1, 2, 0


def walk(sched, epoch: int):
    """Yield (step, rank, slot j, micro-batch) over the epoch's plan."""
    dp = sched.data_parallel
    for t, step in enumerate(sched.epoch(epoch)):
        for r in range(dp):
            for j, mb in enumerate(sched.for_rank(step, r)):
                yield t, r, j, mb


@pytest.mark.parametrize(
    "layout",
    [dict(micro_batch=4, grad_accum=2, data_parallel=2), dict(micro_batch=3, grad_accum=1, data_parallel=1)],
)
def test_every_chunk_follows_its_predecessor_in_the_same_row_of_the_same_slot(prepared_byte_dir, layout):
    data = load_prepared(prepared_byte_dir)
    store = TokenStore(data.split("train"))
    L, eos = data.meta["max_seq_len"], data.meta["tokenizer"]["eos_id"]
    cont = chains(store, eos)
    starts = np.flatnonzero(~cont)
    n_chunks = np.diff(np.append(starts, len(store)))
    assert (n_chunks >= 3).sum() >= 5, "the fixture should hold long documents"
    for a, n in zip(starts, n_chunks, strict=True):  # as data_prep wrote them
        assert len(set(store.doc_ids[a : a + n].tolist())) == 1
        assert (store.lengths[a : a + n - 1] == L).all()
        assert all(store.ids(int(i))[-1] != eos for i in range(a, a + n - 1))
    sched = CarrySchedule(store, data.meta["buckets"], eos_id=eos, seed=5, **layout)
    seen = np.zeros(len(store), int)
    last: dict[tuple[int, int], np.ndarray] = {}  # (rank, slot) -> example of each row in its last stream mb
    for _, r, j, mb in walk(sched, 1):
        seen[mb.indices] += 1
        if mb.carry is None:
            assert (
                not cont[mb.indices].any()
                and not (n_chunks[np.searchsorted(starts, mb.indices, "right") - 1] > 1).any()
            )
            continue
        prev = last.get((r, j), np.full(0, -1))
        assert len(mb.indices) <= max(len(prev), sched.stream_rows)
        for b, i in enumerate(mb.indices.tolist()):
            # a long document may be cut into segments (each from zero): carry only within a chain, never at its start
            assert mb.carry[b] == sched.cont[i] and (cont[i] or not mb.carry[b])
            if mb.carry[b]:  # the document's chunk before ran in this row of this slot's previous stream mb
                assert b < len(prev) and prev[b] == i - 1
            else:  # a first chunk: a new document (the row's previous one ended there)
                ended = b >= len(prev) or prev[b] + 1 == len(store) or not sched.cont[prev[b] + 1]
                assert ended
        last[(r, j)] = mb.indices
    assert (seen == 1).all()
    assert len(sched.epoch(1)) == sched.steps_per_epoch == len(sched.epoch(2))
    eff = sum(mb.tokens for *_, mb in walk(sched, 0)) / sum(mb.padded for *_, mb in walk(sched, 0))
    print(f"carry plan padding efficiency {eff:.4f}")


def chunked_split(docs: list[np.ndarray], L: int) -> Dataset:
    """Documents (targets, EOS last) cut into L-token chunks, consecutive rows, as data_prep writes them."""
    rows = [(d[a : a + L], k) for k, d in enumerate(docs) for a in range(0, len(d), L)]
    lengths = [len(r) for r, _ in rows]
    return Dataset.from_dict(
        {
            "input_ids": [r.astype(np.int32).tolist() for r, _ in rows],
            "length": lengths,
            "num_bytes": lengths,
            "doc_id": [1000 + k for _, k in rows],
            "bucket": [int(np.searchsorted([4, 8, L], n)) for n in lengths],
        }
    )


def per_example_nats(model, sched, store, epoch: int) -> np.ndarray:
    """Summed cross-entropy of every example over a plan's training forwards, one model per rank."""
    out = np.zeros(len(store))
    for r in range(sched.data_parallel):
        replica = LanguageModel(model.cfg).double().train()
        replica.load_state_dict(model.state_dict())
        layers = carry_state.attach(replica) if isinstance(sched, CarrySchedule) else []
        for step in sched.epoch(epoch):
            mine = sched.for_rank(step, r)
            if layers:
                carry_state.begin_step(layers, mine, torch.device("cpu"))
            for mb in mine:
                x, y = collate(store, mb, BOS, PAD)
                logits = replica(x)  # (B, T, V)
                nats = F.cross_entropy(logits.transpose(1, 2), y, ignore_index=IGNORE_INDEX, reduction="none")
                out[mb.indices] += nats.sum(1).detach().numpy()[: len(mb.indices)]
    return out


def test_carried_chunks_score_like_one_pass_over_each_document():
    rng = np.random.default_rng(0)
    L = 16
    docs = [np.append(rng.integers(3, 40, size=n), EOS) for n in (70, 5, 33, 16, 47, 9, 15, 31, 90, 2)]
    store = TokenStore(chunked_split(docs, L))
    torch.manual_seed(0)
    model = LanguageModel(debug_config(vocab_size=40, dropout=0.0)).double()
    with torch.no_grad():  # larger recurrent weights than the init's: a state that carries what it read
        for layer in model.recurrent:
            for p in layer.parameters():
                p.mul_(3.0)
    layout = dict(micro_batch=2, grad_accum=2, data_parallel=1, seed=3)  # 2 slots x 2 rows: no document cut
    sched = CarrySchedule(store, [4, 8, L], eos_id=EOS, **layout)
    assert len(sched.doc_starts) == sum(len(d) > L for d in docs)
    got = per_example_nats(model, sched, store, 0)
    chunked = per_example_nats(model, BucketSchedule(store, [4, 8, L], **layout), store, 0)
    model.eval()
    row = 0
    for d in docs:
        n = -(-len(d) // L)
        with torch.no_grad():
            inp = torch.as_tensor(np.concatenate([[BOS], d[:-1]]))[None]
            ref = float(F.cross_entropy(model(inp)[0], torch.as_tensor(d), reduction="sum"))
        assert got[row : row + n].sum() == pytest.approx(ref, rel=1e-12)
        if n > 1:
            assert abs(chunked[row : row + n].sum() - ref) > 1e-6 * ref
        row += n
