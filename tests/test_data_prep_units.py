"""Fast unit checks: bucket boundaries, split assignment, segment splits, shard files from pieces."""

from __future__ import annotations

import numpy as np
import pytest

from data_prep import buckets, pieces, shards, splits
from data_prep.encode import Block, EncodeFn, segment_codes
from data_prep.format import SPLITS, shard_features
from data_prep.tokenizer import ByteTokenizer


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


def _distribution(kind: str, rng: np.random.Generator) -> np.ndarray:
    if kind == "short_sentences":  # one review/sentence per example: a log-normal around 20 tokens
        return np.clip(rng.lognormal(3.0, 0.6, 40_000).astype(int), 1, 256)
    if kind == "code_files":  # heavy-tailed file sizes, long ones cut at max_seq_len
        return np.clip((rng.pareto(1.2, 30_000) * 30 + 1).astype(int), 1, 256)
    if kind == "mixed":
        return np.concatenate([np.full(20_000, 256), rng.integers(1, 257, 20_000)])
    return np.concatenate([np.full(50_000, 256), rng.integers(1, 256, 2_000)])  # long documents


@pytest.mark.parametrize("kind", ["short_sentences", "code_files", "mixed", "long_documents"])
@pytest.mark.parametrize("seed", [0, 1])
def test_adaptive_buckets_reach_target(kind, seed):
    rng = np.random.default_rng(seed)
    lengths = _distribution(kind, rng)
    bounds = buckets.choose_boundaries(lengths, max_buckets=64, batch_size=16)
    b = buckets.assign(lengths, bounds)
    eff = buckets.padding_efficiency(lengths, b, 16, seed)
    assert eff >= 0.98, (kind, len(bounds), eff)
    assert np.bincount(b).min() >= 16  # every bucket fills a batch
    # the closed-form estimate the choice is made with agrees with simulated batches
    values, counts = np.unique(lengths, return_counts=True)
    assert abs(buckets.expected_efficiency(values, counts, bounds, 16) - eff) < 0.01


def test_expected_batch_max_matches_enumeration():
    """E[max of B draws] from the histogram formula vs. all B-tuples enumerated, float64, random cases."""
    import itertools

    rng = np.random.default_rng(7)
    for _ in range(20):
        values = np.sort(rng.choice(np.arange(1, 40), size=int(rng.integers(1, 6)), replace=False))
        counts = rng.integers(1, 9, size=len(values))
        batch = int(rng.integers(1, 5))
        pool = np.repeat(values, counts).astype(np.float64)
        exact = np.mean([max(t) for t in itertools.product(pool, repeat=batch)])
        cost = buckets._segment_costs(values.astype(np.float64), counts, batch)
        assert np.isclose(cost[0, -1], counts.sum() * exact, rtol=1e-12)


def test_boundaries_from_histogram_match_brute_force():
    """The DP's best 2- and 3-bucket splits equal exhaustive search over all boundaries (small cases)."""
    import itertools

    rng = np.random.default_rng(3)
    for _ in range(10):
        values = np.sort(rng.choice(np.arange(1, 60), size=8, replace=False)).astype(np.float64)
        counts = rng.integers(1, 50, size=8)
        cost = buckets._segment_costs(values, counts, 8)
        sols = buckets._dp(cost, 3)
        for k in (2, 3):
            best = min(
                sum(cost[a + 1 if i else 0, b] for i, (a, b) in enumerate(zip((-1, *cuts), (*cuts, 7))))
                for cuts in itertools.combinations(range(7), k - 1)
            )
            tops = sols[k - 1]
            got = sum(cost[a + 1, b] for a, b in zip((-1, *tops[:-1]), tops))
            assert np.isclose(got, best)


@pytest.mark.parametrize("copy_file_range", [True, False])
def test_pieces_make_the_stream_pyarrow_writes(tmp_path, monkeypatch, copy_file_range):
    """Blocks appended as pieces (in memory, or spilled by a worker and copied back) make, byte for byte,
    the Arrow stream that one pyarrow writer makes of the same tables; also without copy_file_range."""
    import pyarrow as pa

    if not copy_file_range:
        monkeypatch.delattr("os.copy_file_range", raising=False)  # the portable fallback
    rng = np.random.default_rng(0)
    words = ["a", "bb", "ccc \u00e9", "\u4e2d\u6587", "\n"]
    blocks = [
        Block(
            ["".join(rng.choice(words, rng.integers(1, 300))) for _ in range(40)], [True] * 40, [False] * 40
        )
        for _ in range(4)
    ]
    fn = EncodeFn(
        ByteTokenizer(), 32, seed=1, text_field="text", fractions=(0.2, 0.2), moves={}, segments=False
    )
    encoded = [fn(b) for b in blocks]
    manifest = {"groups": []}
    writer = shards.GroupWriter(tmp_path, manifest, 1 << 40, 32)
    for i, enc in enumerate(encoded):
        piece = pieces.from_encoded(enc)
        if i % 2:  # what a worker hands back
            piece = pieces.spill(piece, tmp_path / f"spool-{i}")
        writer.add(piece, i + 1)
        pieces.release(piece)
    writer.close(len(blocks))
    assert not list(tmp_path.glob("spool-*"))
    schema = shard_features().arrow_schema
    for c, name in enumerate(SPLITS):
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, schema) as w:
            for enc in encoded:
                if len(enc.tables[c]):
                    w.write_table(enc.tables[c].cast(schema))
        assert (tmp_path / name / "00000.arrow").read_bytes() == sink.getvalue().to_pybytes()
        stats = manifest["groups"][0]["stats"][name]
        assert stats["examples"] == sum(len(e.tables[c]) for e in encoded) > 0
