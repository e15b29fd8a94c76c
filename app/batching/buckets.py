"""Bucketed batches over a data_prep split: deterministic, resumable, disjoint across data-parallel ranks.

A *step* is `grad_accum * data_parallel` micro-batches. Micro-batch `j` of rank `r` in a step is entry
`j * data_parallel + r` of the step's list, so every rank can compute the whole step's token count (the
loss normaliser) without communication. Every micro-batch holds sequences of one length bucket. The last
step of an epoch is filled up with empty micro-batches so all ranks run the same number of steps.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from app.model.loss import IGNORE_INDEX
from data_prep import arrow_numpy


@dataclass(frozen=True, slots=True)
class MicroBatch:
    indices: np.ndarray  # example indices into the split; empty for a filler micro-batch
    tokens: int  # real target tokens
    num_bytes: int  # UTF-8 bytes those tokens decode to
    padded: int  # positions computed after right-padding (batch * longest)
    carry: np.ndarray | None = (
        None  # --carry-state: per row, continues its slot's row (None: every row fresh)
    )


class TokenStore:
    """Zero-copy access to a split's `input_ids` (memory-mapped Arrow buffers) plus per-example stats."""

    def __init__(self, ds) -> None:
        """`ds`: a split's `pyarrow.Table` (PreparedData.table, what runs read) or its `datasets.Dataset`."""
        if getattr(ds, "_indices", None) is not None:
            raise ValueError("TokenStore needs a split as saved by data_prep (no index mapping)")
        table = getattr(ds, "data", ds)
        col = table.column("input_ids")
        self._values: list[np.ndarray] = []
        self._offsets: list[np.ndarray] = []
        starts = [0]
        for chunk in col.chunks:
            self._offsets.append(arrow_numpy.view(chunk.offsets))
            self._values.append(arrow_numpy.view(chunk.values))
            starts.append(starts[-1] + len(chunk))
        self._starts = np.asarray(starts, dtype=np.int64)
        self.lengths = np.asarray(arrow_numpy.view(table.column("length")), dtype=np.int64)
        self.num_bytes = np.asarray(arrow_numpy.view(table.column("num_bytes")), dtype=np.int64)
        self.buckets = np.asarray(arrow_numpy.view(table.column("bucket")), dtype=np.int64)
        names = table.column_names  # a split built by hand may lack doc_id: every example its own document
        docs = arrow_numpy.view(table.column("doc_id")) if "doc_id" in names else np.arange(len(self.lengths))
        self.doc_ids = np.asarray(docs, dtype=np.int64)

    def last_ids(self) -> np.ndarray:
        """(n,) the last token of every example (EOS where it ends a document)."""
        parts = [v[off[1:] - 1] for v, off in zip(self._values, self._offsets, strict=True)]
        return np.concatenate([*parts, np.zeros(0, np.int32)]).astype(np.int64)

    def __len__(self) -> int:
        return len(self.lengths)

    def ids(self, i: int) -> np.ndarray:
        c = int(np.searchsorted(self._starts, i, side="right")) - 1
        j = i - self._starts[c]
        off = self._offsets[c]
        return self._values[c][off[j] : off[j + 1]]


class EpochPlan:
    """One epoch's micro-batches as flat arrays; `MicroBatch` objects are made only for the steps asked for.

    `order` is the split's examples grouped by bucket, each bucket shuffled; micro-batch `m` of the epoch
    is `order[starts[m] : starts[m] + sizes[m]]` (fillers at the end have size 0). Keeping the grouped
    order, rather than rewriting it micro-batch after micro-batch, saves a gather over every example.
    Indexing by step `k` gives that step's `per_step` micro-batches; slicing gives a plan over those steps
    that shares the arrays.
    """

    __slots__ = ("carry", "num_bytes", "order", "padded", "per_step", "sizes", "starts", "steps", "tokens")

    def __init__(
        self,
        order: np.ndarray,
        starts: np.ndarray,
        sizes: np.ndarray,
        tokens: np.ndarray,
        num_bytes: np.ndarray,
        padded: np.ndarray,
        per_step: int,
        steps: range | None = None,
        carry: tuple[np.ndarray, np.ndarray] | None = None,
    ) -> None:
        self.order = order  # (n,) example indices, by bucket
        # --carry-state: ((M,) bool the micro-batch is a stream one, (n,) bool the row at this position of
        # `order` continues the same row of its slot's previous stream micro-batch); None: no carried state
        self.carry = carry
        self.starts = starts  # (M,) first position in `order` of each micro-batch, in epoch order
        self.sizes = sizes  # (M,) sequences per micro-batch
        self.tokens = tokens  # (M,) real target tokens per micro-batch
        self.num_bytes = num_bytes  # (M,) UTF-8 bytes per micro-batch
        self.padded = padded  # (M,) sequences * longest per micro-batch
        self.per_step = per_step
        self.steps = range(len(starts) // per_step) if steps is None else steps

    @property
    def nbytes(self) -> int:
        """Bytes held by the plan's arrays."""
        arrays = (self.order, self.starts, self.sizes, self.tokens, self.num_bytes, self.padded)
        return sum(a.nbytes for a in arrays)

    def micro_batch(self, m: int) -> MicroBatch:
        a, b = int(self.starts[m]), int(self.starts[m]) + int(self.sizes[m])
        carry = None if self.carry is None or not self.carry[0][m] else self.carry[1][a:b].copy()
        return MicroBatch(
            self.order[a:b].astype(np.int64),
            int(self.tokens[m]),
            int(self.num_bytes[m]),
            int(self.padded[m]),
            carry,
        )

    def __len__(self) -> int:
        return len(self.steps)

    def __getitem__(self, k):
        if isinstance(k, slice):
            arrays = (self.order, self.starts, self.sizes, self.tokens, self.num_bytes, self.padded)
            return EpochPlan(*arrays, self.per_step, self.steps[k], self.carry)
        s = self.steps[k]
        return [self.micro_batch(m) for m in range(s * self.per_step, (s + 1) * self.per_step)]

    def __iter__(self):
        return (self[k] for k in range(len(self)))


def batch_size(bound: int, micro_batch: int, tokens_per_micro_batch: int) -> int:
    """Sequences per micro-batch of a bucket of sequences of up to `bound` tokens: as many as the token
    budget holds (at least one) when there is one, else the micro-batch."""
    if tokens_per_micro_batch:
        return max(1, tokens_per_micro_batch // bound)
    return micro_batch


def bucket_counts(store: TokenStore, n_buckets: int) -> np.ndarray:
    """(n_buckets,) examples of each bucket (rows of no bucket left out, as the schedules leave them)."""
    b = store.buckets
    return np.bincount(b[(b >= 0) & (b < n_buckets)], minlength=n_buckets)[:n_buckets]


def _index_dtype(n: int) -> type:
    """int32 indexes up to 2**31 - 1 items and halves the plan's memory; int64 beyond."""
    return np.int32 if n < 2**31 else np.int64


def _compact(a: np.ndarray) -> np.ndarray:
    """`a` as int32 when every value fits, else unchanged (int64)."""
    if len(a) == 0 or (a.max() < 2**31 and a.min() >= -(2**31)):
        return a.astype(np.int32)
    return a


class BucketSchedule:
    """Plans the micro-batches of every step of an epoch; a pure function of (seed, epoch).

    The plan of an epoch draws, from `default_rng([seed, epoch])`, one permutation of each bucket's
    examples (buckets in order, ascending example index before shuffling), cuts each bucket into
    micro-batches, then draws one permutation of the list of micro-batches. Checkpoints written by
    earlier versions resume onto the same batches only while this order of draws stays as it is.
    """

    def __init__(
        self,
        store: TokenStore,
        bounds: list[int],
        *,
        micro_batch: int,
        grad_accum: int,
        data_parallel: int,
        seed: int,
        tokens_per_micro_batch: int = 0,
        shuffle: bool = True,
        exclude: np.ndarray | None = None,
    ) -> None:
        """`exclude` (n,) bool: examples planned elsewhere (a subclass's), in no bucketed micro-batch."""
        self.store = store
        self.bounds = list(bounds)
        self.micro_batch = micro_batch
        self.grad_accum = grad_accum
        self.data_parallel = data_parallel
        self.seed = seed
        self.tokens_per_micro_batch = tokens_per_micro_batch
        self.shuffle = shuffle
        self.per_step = grad_accum * data_parallel
        # Examples grouped by bucket, ascending index within a bucket (what flatnonzero(buckets == b)
        # gives per bucket), and each bucket's range in that array. Rows whose bucket is not one of
        # `bounds` are in no micro-batch. A narrow key lets numpy's stable sort use radix sort.
        nb = len(self.bounds)
        buckets = store.buckets
        key = np.full(len(buckets), nb, dtype=np.int8 if nb < 127 else np.int16 if nb < 32767 else np.int64)
        keep = (buckets >= 0) & (buckets < nb)
        np.copyto(key, buckets, casting="unsafe", where=keep if exclude is None else keep & ~exclude)
        counts = np.bincount(key, minlength=nb + 1)[:nb]
        self._bucket_starts = np.concatenate([[0], np.cumsum(counts)])  # (nb + 1,)
        grouped = np.argsort(key, kind="stable")[: int(self._bucket_starts[-1])]
        self._grouped = grouped.astype(_index_dtype(len(store)))  # (n_kept,)
        sizes = np.array([self._batch_size(b) for b in range(nb)], dtype=np.int64)
        self._n_micro = int(np.sum(-(-counts // sizes))) if nb else 0
        self.steps_per_epoch = max(1, -(-self._n_micro // self.per_step))

    stats_block = 1 << 20
    """Examples per block when the plan sums per-micro-batch statistics (bounds the temporary memory)."""

    def _batch_size(self, bucket: int) -> int:
        return batch_size(self.bounds[bucket], self.micro_batch, self.tokens_per_micro_batch)

    def fingerprint(self) -> dict:
        """What must match for a resumed run to see the same batches."""
        return {
            "examples": len(self.store),
            "steps_per_epoch": self.steps_per_epoch,
            "micro_batch": self.micro_batch,
            "grad_accum": self.grad_accum,
            "data_parallel": self.data_parallel,
            "tokens_per_micro_batch": self.tokens_per_micro_batch,
            "seed": self.seed,
        }

    def epoch(self, epoch: int) -> EpochPlan:
        order, start, size, tokens, nbytes, padded = self._micro_batches(
            np.random.default_rng([self.seed, epoch])
        )
        fill = self.steps_per_epoch * self.per_step - len(start)  # empty micro-batches ending the epoch

        def with_fillers(a: np.ndarray) -> np.ndarray:
            return np.concatenate([a, np.zeros(fill, a.dtype)])

        idx = order.dtype.type
        return EpochPlan(
            order,
            with_fillers(start.astype(idx)),
            with_fillers(size.astype(idx)),
            with_fillers(tokens),
            with_fillers(nbytes),
            with_fillers(padded),
            self.per_step,
        )

    def _micro_batches(self, rng: np.random.Generator):
        """(order, start, size, tokens, bytes, padded) of the epoch's bucketed micro-batches, shuffled."""
        order = self._grouped.copy() if self.shuffle else self._grouped
        starts, sizes = [], []
        for b in range(len(self.bounds)):
            lo, hi = int(self._bucket_starts[b]), int(self._bucket_starts[b + 1])
            if self.shuffle:
                # In place on the bucket's range: the same draws, and result, as rng.permutation of it.
                rng.shuffle(order[lo:hi])
            s = np.arange(lo, hi, self._batch_size(b), dtype=np.int64)
            starts.append(s)
            sizes.append(np.minimum(s + self._batch_size(b), hi) - s)
        # Micro-batches before the shuffle tile `order`: micro-batch i is order[start[i] : start[i + 1]].
        start = np.concatenate([*starts, np.zeros(0, np.int64)])  # (M_real,)
        size = np.concatenate([*sizes, np.zeros(0, np.int64)])  # (M_real,)
        # Statistics while the micro-batches still tile `order` (reduceat over contiguous ranges), then
        # everything is permuted together.
        tokens, nbytes, padded = self._stats(order, start, size)
        if self.shuffle:
            perm = rng.permutation(len(start))
            start, size, tokens, nbytes, padded = (a[perm] for a in (start, size, tokens, nbytes, padded))
        return order, start, size, tokens, nbytes, padded

    def _stats(self, order: np.ndarray, start: np.ndarray, size: np.ndarray):
        """tokens, bytes, padded positions of tiling micro-batches; a block of examples at a time, so the
        per-example gathers stay small whatever the split's size."""
        tokens, nbytes, padded = (np.zeros(len(start), np.int64) for _ in range(3))
        block = self.stats_block
        # The first micro-batch starting at or after each block boundary; a micro-batch that straddles a
        # boundary belongs to the block it starts in.
        edges = np.searchsorted(start, np.arange(0, len(order), block)).tolist()
        ends = [*edges[1:], len(start)] if edges else []
        for i, j in zip(edges, ends, strict=True):
            if i == j:  # no micro-batch starts in this block
                continue
            a, b = int(start[i]), int(start[j - 1] + size[j - 1])
            rel = start[i:j] - a  # (mbs,) positions in the block
            rows = order[a:b]  # (examples,)
            lengths = self.store.lengths[rows]
            tokens[i:j] = np.add.reduceat(lengths, rel)
            padded[i:j] = size[i:j] * np.maximum.reduceat(lengths, rel)
            nbytes[i:j] = np.add.reduceat(self.store.num_bytes[rows], rel)
        return _compact(tokens), _compact(nbytes), _compact(padded)

    def for_rank(self, step: list[MicroBatch], dp_rank: int) -> list[MicroBatch]:
        return [step[j * self.data_parallel + dp_rank] for j in range(self.grad_accum)]


def collate(store: TokenStore, mb: MicroBatch, bos_id: int, pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded (inputs, targets), both (B, T) int64: inputs are [bos] + targets[:-1], except that a row
    continuing its document's previous chunk (`mb.carry`) reads that chunk's last token instead of bos."""
    if len(mb.indices) == 0:
        # A filler micro-batch: one pad position with no target contributes nothing to loss or gradient.
        return torch.full((1, 1), pad_id, dtype=torch.long), torch.full(
            (1, 1), IGNORE_INDEX, dtype=torch.long
        )
    inputs, targets = shifted_batch([store.ids(int(i)) for i in mb.indices], bos_id, pad_id)
    if mb.carry is not None:
        for r in np.flatnonzero(mb.carry):  # the chunk before is the example before (data_prep's row order)
            inputs[r, 0] = int(store.ids(int(mb.indices[r]) - 1)[-1])
    return inputs, targets


def shifted_batch(seqs: Sequence, bos_id: int, pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token sequences as right-padded (inputs, targets), both (B, T) int64: each row's inputs are
    [bos] + its targets[:-1]; pad positions carry no target."""
    T = max(len(s) for s in seqs)
    targets = np.full((len(seqs), T), IGNORE_INDEX, dtype=np.int64)
    inputs = np.full((len(seqs), T), pad_id, dtype=np.int64)
    for r, s in enumerate(seqs):
        targets[r, : len(s)] = s
        inputs[r, 0] = bos_id
        inputs[r, 1 : len(s)] = s[:-1]
    return torch.from_numpy(inputs), torch.from_numpy(targets)
