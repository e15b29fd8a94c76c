"""Length buckets: boundaries chosen from the length distribution to minimise padding.

``boundaries`` is an ascending list of inclusive upper bounds; an example of length ``n`` belongs to
the smallest ``i`` with ``n <= boundaries[i]``. The boundaries minimise the padding needed to pad
every example up to its bucket's bound (an upper bound on the padding of any batch drawn within a
bucket), found exactly by dynamic programming over the distinct lengths. The fewest buckets within
half a percentage point of the best ``max_buckets`` solution are kept, and buckets with fewer
examples than one batch are merged upward (the top one downward) so every bucket can fill batches.
"""

from __future__ import annotations

import numpy as np


def _pad_to_bound_dp(values: np.ndarray, counts: np.ndarray, k_max: int) -> list[list[int]]:
    """For k = 1..k_max, the optimal bucket tops (as indices into ``values``)."""
    u = len(values)
    c = np.concatenate([[0], np.cumsum(counts)]).astype(np.float64)
    s = np.concatenate([[0], np.cumsum(counts * values)]).astype(np.float64)
    # cost(i, j): values[i..j] (inclusive) padded to values[j]
    inf = np.inf
    best = np.full(u, inf)
    for j in range(u):
        best[j] = (c[j + 1] - c[0]) * values[j] - (s[j + 1] - s[0])
    back: list[np.ndarray] = [np.full(u, -1)]
    layers = [best]
    for _ in range(1, k_max):
        prev = layers[-1]
        cur = np.full(u, inf)
        arg = np.full(u, -1)
        for j in range(1, u):
            i = np.arange(j)  # previous bucket ends at i, this one covers i+1..j
            cand = prev[i] + (c[j + 1] - c[i + 1]) * values[j] - (s[j + 1] - s[i + 1])
            a = int(np.argmin(cand))
            cur[j], arg[j] = cand[a], a
        layers.append(cur)
        back.append(arg)
    solutions = []
    for k in range(1, k_max + 1):
        tops, j = [], u - 1
        for layer in range(k - 1, -1, -1):
            if j < 0:
                break
            tops.append(j)
            j = back[layer][j] if layer > 0 else -1
        solutions.append(sorted(set(tops)))
    return solutions


def _bound_efficiency(lengths: np.ndarray, bounds: list[int]) -> float:
    padded = np.asarray(bounds)[assign(lengths, bounds)]
    return float(lengths.sum() / max(1, padded.sum()))


def choose_boundaries(lengths: np.ndarray, max_buckets: int, batch_size: int) -> list[int]:
    lengths = np.asarray(lengths, dtype=np.int64)
    if len(lengths) == 0:
        return [1]
    values, counts = np.unique(lengths, return_counts=True)
    k_max = min(max_buckets, len(values))
    solutions = [[int(values[j]) for j in tops] for tops in _pad_to_bound_dp(values, counts, k_max)]
    effs = [_bound_efficiency(lengths, b) for b in solutions]
    bounds = next(b for b, e in zip(solutions, effs) if e >= effs[-1] - 0.005)
    return _merge_small(lengths, bounds, batch_size)


def _merge_small(lengths: np.ndarray, bounds: list[int], min_count: int) -> list[int]:
    bounds = list(bounds)
    while len(bounds) > 1:
        counts = np.bincount(assign(lengths, bounds), minlength=len(bounds))
        small = [i for i, n in enumerate(counts) if n < min_count]
        if not small:
            break
        i = small[0]
        del bounds[i if i < len(bounds) - 1 else i - 1]  # merge into the next bucket (top: into the previous)
    return bounds


def assign(lengths: np.ndarray, bounds: list[int]) -> np.ndarray:
    """Bucket index of each length: the smallest i with length <= bounds[i]."""
    return np.searchsorted(np.asarray(bounds), np.asarray(lengths), side="left").astype(np.int32)


def _batched_efficiency(groups: list[np.ndarray], batch_size: int, rng: np.random.Generator) -> float:
    real = padded = 0
    for group in groups:
        group = rng.permutation(group)
        for start in range(0, len(group), batch_size):
            batch = group[start : start + batch_size]
            real += int(batch.sum())
            padded += int(batch.max()) * len(batch)
    return real / padded if padded else 1.0


def padding_efficiency(lengths: np.ndarray, bucket: np.ndarray | None, batch_size: int, seed: int) -> float:
    """Real tokens / padded tokens for random batches (within buckets if ``bucket`` is given), padded to the batch max."""
    lengths = np.asarray(lengths, dtype=np.int64)
    rng = np.random.default_rng(seed)
    if bucket is None:
        return _batched_efficiency([lengths], batch_size, rng)
    return _batched_efficiency([lengths[bucket == b] for b in np.unique(bucket)], batch_size, rng)
