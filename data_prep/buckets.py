"""Length buckets: how many and where, chosen from the length distribution for the trainer's batches.

``boundaries`` is an ascending list of inclusive upper bounds; an example of length ``n`` belongs to
the smallest ``i`` with ``n <= boundaries[i]``. The trainer draws random batches of ``batch_size``
within a bucket and pads each to its longest example, so the cost of a bucket is its examples times
the expected maximum of ``batch_size`` draws from its lengths (computed exactly from its histogram).
That cost is additive over buckets, so dynamic programming over the distinct lengths finds the best
boundaries for every bucket count; the fewest buckets whose expected padding efficiency reaches
``TARGET`` (or is within a hair of the best possible) are kept, and a bucket too small to fill a batch
is merged into its neighbour. Everything works on a length histogram, which data prep accumulates
while streaming (bounded by ``max_seq_len``, whatever the corpus size).
"""

from __future__ import annotations

import numpy as np

TARGET = 0.985
MAX_DISTINCT = 512  # lengths beyond this many distinct values are grouped (keeps the DP O(512^2 k))


def _segment_costs(values: np.ndarray, counts: np.ndarray, batch: int) -> np.ndarray:
    """cost[i, j] = n(i..j) * E[max of `batch` draws from lengths values[i..j]] (inf for j < i)."""
    u = len(values)
    cost = np.full((u, u), np.inf)
    for i in range(u):
        c = np.cumsum(counts[i:]).astype(np.float64)  # (u-i,) counts of values[i..j]
        # F[j, v] = P(length <= values[v]) within segment i..j, for v <= j
        mask = np.tri(len(c), dtype=bool)  # v <= j
        Fb = np.where(mask, c[None, :] / c[:, None], 0.0) ** batch
        prev = np.concatenate([np.zeros((len(c), 1)), Fb[:, :-1]], axis=1)
        emax = (np.where(mask, Fb - prev, 0.0) * values[i:][None, :]).sum(axis=1)  # E[max] per segment end j
        cost[i, i:] = c * emax
    return cost


def _dp(cost: np.ndarray, k_max: int) -> list[list[int]]:
    """For k = 1..k_max buckets, the segment ends (indices) minimising the summed cost."""
    u = len(cost)
    best = cost[0].copy()  # best[j]: values[0..j] in one bucket
    back = [np.full(u, -1)]
    layers = [best]
    for _ in range(1, k_max):
        prev = layers[-1]
        # cand[i, j] = prev[i] + cost[i+1, j]  (previous buckets end at i, this one covers i+1..j)
        cand = prev[:-1, None] + cost[1:, :]
        arg = np.argmin(cand, axis=0)
        cur = cand[arg, np.arange(u)]
        cur[0] = np.inf
        layers.append(cur)
        back.append(arg)
    out = []
    for k in range(1, k_max + 1):
        tops, j = [u - 1], u - 1
        for layer in range(k - 1, 0, -1):
            j = int(back[layer][j])
            if j < 0:
                break
            tops.append(j)
        out.append(sorted(set(tops)))
    return out


def _group(values: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Merge distinct lengths into at most MAX_DISTINCT groups (each represented by its top)."""
    if len(values) <= MAX_DISTINCT:
        return values, counts
    tops = np.unique(np.linspace(0, len(values) - 1, MAX_DISTINCT).round().astype(int))
    group = np.searchsorted(tops, np.arange(len(values)), side="left")
    return values[tops], np.bincount(group, weights=counts, minlength=len(tops)).astype(np.int64)


def expected_efficiency(values: np.ndarray, counts: np.ndarray, bounds: list[int], batch: int) -> float:
    """Real tokens / padded tokens expected for random within-bucket batches (draws with replacement)."""
    b = assign(values, bounds)
    real = float((values * counts).sum())
    padded = 0.0
    for k in np.unique(b):
        v, c = values[b == k], counts[b == k].astype(np.float64)
        F = np.cumsum(c) / c.sum()
        Fb = F**batch
        padded += c.sum() * float(((Fb - np.concatenate([[0.0], Fb[:-1]])) * v).sum())
    return real / padded if padded else 1.0


def from_histogram(hist: np.ndarray, max_buckets: int, batch_size: int) -> list[int]:
    """Bucket bounds from ``hist[n]`` = number of examples of length n."""
    hist = np.asarray(hist, dtype=np.int64)
    values = np.flatnonzero(hist)
    if len(values) == 0:
        return [1]
    counts = hist[values]
    gv, gc = _group(values, counts)
    k_max = min(max_buckets, len(gv))
    solutions = [
        [int(gv[j]) for j in tops]
        for tops in _dp(_segment_costs(gv.astype(np.float64), gc, batch_size), k_max)
    ]
    solutions = [_merge_small(values, counts, b, batch_size) for b in solutions]
    effs = [expected_efficiency(values, counts, b, batch_size) for b in solutions]
    best = max(effs)
    return next(b for b, e in zip(solutions, effs) if e >= min(TARGET, best - 0.002))


def choose_boundaries(lengths: np.ndarray, max_buckets: int, batch_size: int) -> list[int]:
    lengths = np.asarray(lengths, dtype=np.int64)
    hist = np.bincount(lengths) if len(lengths) else np.zeros(1, np.int64)
    return from_histogram(hist, max_buckets, batch_size)


def _merge_small(values: np.ndarray, counts: np.ndarray, bounds: list[int], min_count: int) -> list[int]:
    bounds = list(bounds)
    while len(bounds) > 1:
        per = np.bincount(assign(values, bounds), weights=counts, minlength=len(bounds))
        small = [i for i, n in enumerate(per) if n < min_count]
        if not small:
            break
        i = small[0]
        del bounds[i if i < len(bounds) - 1 else i - 1]  # merge into the next bucket (top: into the previous)
    return bounds


def assign(lengths: np.ndarray, bounds: list[int]) -> np.ndarray:
    """Bucket index of each length: the smallest i with length <= bounds[i]."""
    return np.searchsorted(np.asarray(bounds), np.asarray(lengths), side="left").astype(np.int32)


def sample_lengths(hist: np.ndarray, limit: int, seed: int) -> np.ndarray:
    """The lengths a histogram counts (a seeded proportional sample of ``limit`` when there are more)."""
    hist = np.asarray(hist, dtype=np.int64)
    total = int(hist.sum())
    if total > limit:
        hist = np.random.default_rng(seed).multivariate_hypergeometric(hist, limit)
    return np.repeat(np.arange(len(hist)), hist)


def _batched_efficiency(groups: list[np.ndarray], batch_size: int, rng: np.random.Generator) -> float:
    real = padded = 0
    for group in groups:
        group = rng.permutation(group)
        n = len(group) // batch_size * batch_size
        full = group[:n].reshape(-1, batch_size)
        real += int(full.sum())
        padded += int(full.max(axis=1).sum()) * batch_size
        if n < len(group):
            rest = group[n:]
            real += int(rest.sum())
            padded += int(rest.max()) * len(rest)
    return real / padded if padded else 1.0


def padding_efficiency(lengths: np.ndarray, bucket: np.ndarray | None, batch_size: int, seed: int) -> float:
    """Real tokens / padded tokens for random batches (within buckets if ``bucket`` is given), padded to the batch max."""
    lengths = np.asarray(lengths, dtype=np.int64)
    rng = np.random.default_rng(seed)
    if bucket is None:
        return _batched_efficiency([lengths], batch_size, rng)
    return _batched_efficiency([lengths[bucket == b] for b in np.unique(bucket)], batch_size, rng)
