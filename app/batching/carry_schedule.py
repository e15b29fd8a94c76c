"""--carry-state: an epoch's micro-batches when the recurrent state is carried from a chunk into the next.

data_prep writes a document of more than `max_seq_len` tokens as consecutive examples of one split, in
order, sharing its `doc_id`, only the last ending with EOS (`chains`). Here such documents are laid end to
end into *streams*, and each stream is one row of one *slot* (micro-batch `j` of data-parallel rank `r`,
i.e. position `j * dp + r` of every step): stream micro-batch `p` of a slot holds chunk `p` of each of its
streams, so row `b` of the slot's next stream micro-batch is the next chunk of the same document (its state
carried) or the first chunk of the stream's next document (`carry` False: a zero state). Every rank and
stage computes the same plan from (seed, epoch), so nothing is sent between stages to agree on it.

Documents of one chunk are bucketed and shuffled exactly as without the flag (`BucketSchedule`), and
fill the slots' other positions. A document of more chunks than an even share of the streams is cut into
segments of that share (a segment starts from a zero state), so the epoch is not as long as the longest
book. Streams are balanced once (longest documents first, each to the
shortest stream), so the epoch's length does not depend on the epoch; each epoch draws which slot gets
which group of streams, the order of documents within each stream, and the steps at which a slot's
stream micro-batches run (in order). A slot's streams are its rows longest first, so a stream that has
ended leaves the last row: rows of a slot only ever go away, and row `b` always means the same stream.
"""

from __future__ import annotations

import heapq

import numpy as np

from app.batching.buckets import BucketSchedule, EpochPlan, TokenStore


def chains(store: TokenStore, eos_id: int) -> np.ndarray:
    """(n,) bool: example i is the chunk after example i - 1 of the same document."""
    last = store.last_ids()
    cont = np.zeros(len(store), dtype=bool)
    cont[1:] = (store.doc_ids[1:] == store.doc_ids[:-1]) & (last[:-1] != eos_id)
    return cont


def _balance(lengths: np.ndarray, streams: int) -> list[list[int]]:
    """Documents (by chunk count) into `streams` lists of document indices: longest first, to the shortest."""
    heap = [(0, s) for s in range(streams)]
    out: list[list[int]] = [[] for _ in range(streams)]
    for d in np.argsort(-lengths, kind="stable").tolist():
        total, s = heapq.heappop(heap)
        out[s].append(d)
        heapq.heappush(heap, (total + int(lengths[d]), s))
    return out


def _segments(starts: np.ndarray, n_chunks: np.ndarray, cap: int) -> tuple[np.ndarray, np.ndarray]:
    """Documents (first example, chunks) cut into runs of at most `cap` chunks."""
    pieces = -(-n_chunks // cap)
    k = np.arange(int(pieces.sum())) - np.repeat(np.cumsum(pieces) - pieces, pieces)  # piece index in its doc
    seg_starts = np.repeat(starts, pieces) + k * cap
    seg_chunks = np.minimum(cap, np.repeat(n_chunks, pieces) - k * cap)
    return seg_starts, seg_chunks


class CarrySchedule(BucketSchedule):
    """`BucketSchedule` plus streams of long documents whose rows carry their state (module docstring)."""

    def __init__(self, store: TokenStore, bounds: list[int], *, eos_id: int, **kwargs) -> None:
        self.cont = chains(store, eos_id)
        starts = np.flatnonzero(~self.cont)  # first chunk of every document
        n_chunks = np.diff(np.append(starts, len(store)))
        long = n_chunks >= 2
        super().__init__(store, bounds, exclude=np.repeat(long, n_chunks), **kwargs)
        tpmb = self.tokens_per_micro_batch
        self.stream_rows = max(1, tpmb // max(self.bounds)) if tpmb else self.micro_batch
        n_streams = self.per_step * self.stream_rows
        # A document longer than an even share of the streams is cut into segments of that share, each from a
        # zero state: else one book would make the epoch as many steps as it has chunks, the rest fillers.
        cap = max(2, -(-int(n_chunks[long].sum()) // n_streams))
        self.doc_starts, self.doc_chunks = _segments(starts[long], n_chunks[long], cap)  # (D,) 2+ chunks each
        self.cont[self.doc_starts] = False  # a segment's first chunk starts from zero
        streams = _balance(self.doc_chunks, n_streams)
        totals = np.array([int(self.doc_chunks[s].sum()) if s else 0 for s in streams], dtype=np.int64)
        by_length = np.argsort(-totals, kind="stable")
        # group g: streams by_length[g::per_step], longest first; its stream micro-batches: its longest stream
        self.groups = [
            [streams[i] for i in by_length[g :: self.per_step] if totals[i]] for g in range(self.per_step)
        ]
        self.group_len = np.array([int(totals[by_length[g]]) for g in range(self.per_step)], dtype=np.int64)
        total_mbs = self._n_micro + int(self.group_len.sum())
        self.steps_per_epoch = max(1, -(-total_mbs // self.per_step), int(self.group_len.max(initial=0)))

    def fingerprint(self) -> dict:
        return {**super().fingerprint(), "carry_state": True}

    def _group_matrix(self, group: list[list[int]], rng: np.random.Generator) -> np.ndarray:
        """(rows, group length) example index of each row's chunk p (-1 after the stream ends)."""
        width = int(sum(self.doc_chunks[group[0]])) if group else 0
        mat = np.full((len(group), width), -1, dtype=np.int64)
        for r, docs in enumerate(group):
            docs = np.asarray(docs)[rng.permutation(len(docs))]
            rows = [
                np.arange(a, a + n) for a, n in zip(self.doc_starts[docs], self.doc_chunks[docs], strict=True)
            ]
            ids = np.concatenate(rows)
            mat[r, : len(ids)] = ids
        return mat

    def epoch(self, epoch: int) -> EpochPlan:
        rng = np.random.default_rng([self.seed, epoch])
        order, start, size, tokens, nbytes, padded = self._micro_batches(rng)
        steps, per_step = self.steps_per_epoch, self.per_step
        M = steps * per_step
        cols = {k: np.zeros(M, np.int64) for k in ("start", "size", "tokens", "nbytes", "padded")}
        is_stream = np.zeros(M, dtype=bool)
        s_order, s_carry = [], []
        at = len(order)  # stream examples follow the bucketed ones in the plan's `order`
        lengths, nb = self.store.lengths, self.store.num_bytes
        for q, g in enumerate(rng.permutation(per_step).tolist()):
            mat = self._group_matrix(self.groups[g], rng)  # (rows, n_g)
            when = np.sort(rng.choice(steps, mat.shape[1], replace=False))  # the slot's steps, in order
            for p, t in enumerate(when.tolist()):
                ids = mat[:, p][mat[:, p] >= 0]  # (k,) a prefix of the rows
                m = t * per_step + q
                is_stream[m] = True
                lens = lengths[ids]
                cols["start"][m], cols["size"][m] = at, len(ids)
                cols["tokens"][m], cols["nbytes"][m] = lens.sum(), nb[ids].sum()
                cols["padded"][m] = len(ids) * lens.max()
                s_order.append(ids)
                s_carry.append(self.cont[ids])
                at += len(ids)
        free = np.flatnonzero(~is_stream)[
            : len(start)
        ]  # bucketed micro-batches in the free positions, in order
        for k, a in zip(cols, (start, size, tokens, nbytes, padded), strict=True):
            cols[k][free] = a
        order = np.concatenate([order.astype(np.int64), *s_order])
        carry = np.concatenate([np.zeros(at - sum(map(len, s_order)), dtype=bool), *s_carry])
        return EpochPlan(order, *cols.values(), per_step, carry=(is_stream, carry))
