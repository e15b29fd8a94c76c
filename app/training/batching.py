"""Bucketed batches over a data_prep split: deterministic, resumable, disjoint across data-parallel ranks.

A *step* is `grad_accum * data_parallel` micro-batches. Micro-batch `j` of rank `r` in a step is entry
`j * data_parallel + r` of the step's list, so every rank can compute the whole step's token count (the
loss normaliser) without communication. Every micro-batch holds sequences of one length bucket. The last
step of an epoch is filled up with empty micro-batches so all ranks run the same number of steps.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from app.model.loss import IGNORE_INDEX


@dataclass(frozen=True, slots=True)
class MicroBatch:
    indices: np.ndarray  # example indices into the split; empty for a filler micro-batch
    tokens: int  # real target tokens
    num_bytes: int  # UTF-8 bytes those tokens decode to
    padded: int  # positions computed after right-padding (batch * longest)


class TokenStore:
    """Zero-copy access to a split's `input_ids` (memory-mapped Arrow buffers) plus per-example stats."""

    def __init__(self, ds) -> None:
        if getattr(ds, "_indices", None) is not None:
            raise ValueError("TokenStore needs a split as saved by data_prep (no index mapping)")
        col = ds.data.column("input_ids")
        self._values: list[np.ndarray] = []
        self._offsets: list[np.ndarray] = []
        starts = [0]
        for chunk in col.chunks:
            self._offsets.append(chunk.offsets.to_numpy())
            self._values.append(chunk.values.to_numpy(zero_copy_only=False))
            starts.append(starts[-1] + len(chunk))
        self._starts = np.asarray(starts, dtype=np.int64)
        self.lengths = np.asarray(ds.data.column("length").to_numpy(), dtype=np.int64)
        self.num_bytes = np.asarray(ds.data.column("num_bytes").to_numpy(), dtype=np.int64)
        self.buckets = np.asarray(ds.data.column("bucket").to_numpy(), dtype=np.int64)

    def __len__(self) -> int:
        return len(self.lengths)

    def ids(self, i: int) -> np.ndarray:
        c = int(np.searchsorted(self._starts, i, side="right")) - 1
        j = i - self._starts[c]
        off = self._offsets[c]
        return self._values[c][off[j] : off[j + 1]]


class BucketSchedule:
    """Plans the micro-batches of every step of an epoch; a pure function of (seed, epoch)."""

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
    ) -> None:
        self.store = store
        self.bounds = list(bounds)
        self.micro_batch = micro_batch
        self.grad_accum = grad_accum
        self.data_parallel = data_parallel
        self.seed = seed
        self.tokens_per_micro_batch = tokens_per_micro_batch
        self.shuffle = shuffle
        self.per_step = grad_accum * data_parallel
        n_micro = sum(
            -(-int(np.sum(store.buckets == b)) // self._batch_size(b)) for b in range(len(self.bounds))
        )
        self.steps_per_epoch = max(1, -(-n_micro // self.per_step))

    def _batch_size(self, bucket: int) -> int:
        if self.tokens_per_micro_batch:
            return max(1, self.tokens_per_micro_batch // self.bounds[bucket])
        return self.micro_batch

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

    def epoch(self, epoch: int) -> list[list[MicroBatch]]:
        rng = np.random.default_rng([self.seed, epoch])
        micro: list[np.ndarray] = []
        for b in range(len(self.bounds)):
            idx = np.flatnonzero(self.store.buckets == b)
            if self.shuffle:
                idx = rng.permutation(idx)
            size = self._batch_size(b)
            micro.extend(idx[i : i + size] for i in range(0, len(idx), size))
        if self.shuffle:
            micro = [micro[i] for i in rng.permutation(len(micro))]
        empty = np.zeros(0, dtype=np.int64)
        micro.extend([empty] * (self.steps_per_epoch * self.per_step - len(micro)))
        lengths, nbytes = self.store.lengths, self.store.num_bytes
        mbs = [
            MicroBatch(
                m, int(lengths[m].sum()), int(nbytes[m].sum()), len(m) * int(lengths[m].max(initial=0))
            )
            for m in micro
        ]
        return [mbs[s * self.per_step : (s + 1) * self.per_step] for s in range(self.steps_per_epoch)]

    def for_rank(self, step: list[MicroBatch], dp_rank: int) -> list[MicroBatch]:
        return [step[j * self.data_parallel + dp_rank] for j in range(self.grad_accum)]


def collate(store: TokenStore, mb: MicroBatch, bos_id: int, pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded (inputs, targets), both (B, T) int64: inputs are [bos] + targets[:-1]."""
    if len(mb.indices) == 0:
        # A filler micro-batch: one pad position with no target contributes nothing to loss or gradient.
        return torch.full((1, 1), pad_id, dtype=torch.long), torch.full(
            (1, 1), IGNORE_INDEX, dtype=torch.long
        )
    seqs = [store.ids(int(i)) for i in mb.indices]
    T = max(len(s) for s in seqs)
    targets = np.full((len(seqs), T), IGNORE_INDEX, dtype=np.int64)
    inputs = np.full((len(seqs), T), pad_id, dtype=np.int64)
    for r, s in enumerate(seqs):
        targets[r, : len(s)] = s
        inputs[r, 0] = bos_id
        inputs[r, 1 : len(s)] = s[:-1]
    return torch.from_numpy(inputs), torch.from_numpy(targets)
