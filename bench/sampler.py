"""Epoch-plan build: the flat-array planner against the list-of-MicroBatch planner it replaced. JSON line last.

    python bench/sampler.py [--sizes 1000000 10000000] [--rounds 2] [--micro-batch 8] [--grad-accum 2]
                            [--data-parallel 2]

For each size a split of that many short random rows (1..16 tokens, 8 buckets) is written with
`save_to_disk` into a temporary directory and opened as training opens one (`load_from_disk`, then
`TokenStore`: memory-mapped, timed). Both planners then build epoch 0 from that store, interleaved for
`--rounds` rounds so machine noise hits both alike; per contender: build seconds (median), peak RSS above
the RSS before the build (VmHWM reset through /proc/self/clear_refs, else "unavailable") and RSS still
held by the result. speedup = old seconds / new seconds. A sample of steps is checked to be identical.
`held_per_rank_bytes` adds up what a rank keeps for training: the store's per-example arrays, the
schedule's bucket grouping and the epoch plan.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from app.batching.buckets import BucketSchedule, MicroBatch, TokenStore  # noqa: E402

BOUNDS = [2, 4, 6, 8, 10, 12, 14, 16]
SEED = 1234


def old_epoch(store, bounds, *, micro_batch, grad_accum, data_parallel, seed, epoch):
    """The planner before the flat-array plan (shuffled, fixed micro-batch), including its step count."""
    per_step = grad_accum * data_parallel
    n_micro = sum(-(-int(np.sum(store.buckets == b)) // micro_batch) for b in range(len(bounds)))
    steps_per_epoch = max(1, -(-n_micro // per_step))
    rng = np.random.default_rng([seed, epoch])
    micro = []
    for b in range(len(bounds)):
        idx = rng.permutation(np.flatnonzero(store.buckets == b))
        micro.extend(idx[i : i + micro_batch] for i in range(0, len(idx), micro_batch))
    micro = [micro[i] for i in rng.permutation(len(micro))]
    empty = np.zeros(0, dtype=np.int64)
    micro.extend([empty] * (steps_per_epoch * per_step - len(micro)))
    lengths, nbytes = store.lengths, store.num_bytes
    mbs = [
        MicroBatch(m, int(lengths[m].sum()), int(nbytes[m].sum()), len(m) * int(lengths[m].max(initial=0)))
        for m in micro
    ]
    return [mbs[s * per_step : (s + 1) * per_step] for s in range(steps_per_epoch)]


def write_split(n: int, path: Path) -> None:
    import datasets
    import pyarrow as pa

    rng = np.random.default_rng(n)
    lengths = rng.integers(1, 17, size=n).astype(np.int32)
    offsets = np.zeros(n + 1, np.int32)
    np.cumsum(lengths, out=offsets[1:])
    values = rng.integers(3, 32000, size=int(offsets[-1]), dtype=np.int32)
    table = pa.table(
        {
            "input_ids": pa.ListArray.from_arrays(pa.array(offsets), pa.array(values)),
            "length": pa.array(lengths),
            "num_bytes": pa.array(lengths.astype(np.int64) * 3),
            "bucket": pa.array(np.searchsorted(BOUNDS, lengths).astype(np.int32)),
        }
    )
    datasets.disable_progress_bars()
    datasets.Dataset(table).save_to_disk(str(path))


def _status_kb(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key):
            return int(line.split()[1])
    raise KeyError(key)


def _reset_peak() -> bool:
    try:
        Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS
        return True
    except OSError:
        return False


def measure(build) -> tuple[float, int | None, int, object]:
    """seconds, peak RSS above the start (bytes, None if the peak cannot be reset), RSS still held, result"""
    gc.collect()
    can_peak = _reset_peak()
    before = _status_kb("VmRSS")
    t0 = time.perf_counter()
    result = build()
    seconds = time.perf_counter() - t0
    peak = (_status_kb("VmHWM") - before) * 1024 if can_peak else None
    held = (_status_kb("VmRSS") - before) * 1024
    return seconds, peak, held, result


def same_steps(old, new, rng) -> int:
    """Compares a sample of steps (all of the first and last 50, 500 random ones); returns the count."""
    n = len(old)
    assert len(new) == n, (len(new), n)
    ks = sorted(
        set(range(min(50, n))) | set(range(max(0, n - 50), n)) | set(rng.integers(0, n, 500).tolist())
    )
    for k in ks:
        for a, b in zip(old[k], new[k], strict=True):
            assert np.array_equal(a.indices, b.indices) and (a.tokens, a.num_bytes, a.padded) == (
                b.tokens,
                b.num_bytes,
                b.padded,
            ), f"step {k} differs"
    return len(ks)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", type=int, nargs="+", default=[1_000_000, 10_000_000])
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--micro-batch", type=int, default=8)
    p.add_argument("--grad-accum", type=int, default=2)
    p.add_argument("--data-parallel", type=int, default=2)
    args = p.parse_args()
    import datasets

    batch = dict(micro_batch=args.micro_batch, grad_accum=args.grad_accum, data_parallel=args.data_parallel)
    result: dict = {"settings": dict(batch, buckets=len(BOUNDS), rounds=args.rounds)}
    with tempfile.TemporaryDirectory(prefix="bench_sampler_") as tmp:
        for n in args.sizes:
            path = Path(tmp) / f"split{n}"
            t0 = time.perf_counter()
            write_split(n, path)
            write_s = time.perf_counter() - t0
            gc.collect()
            t0 = time.perf_counter()
            store = TokenStore(datasets.load_from_disk(str(path)))
            open_s = time.perf_counter() - t0
            probe = np.random.default_rng(0).integers(0, n, 100_000)
            t0 = time.perf_counter()
            for i in probe:
                store.ids(int(i))
            ids_us = (time.perf_counter() - t0) / len(probe) * 1e6

            def build_new(store=store):
                s = BucketSchedule(store, BOUNDS, seed=SEED, **batch)
                return s, s.epoch(0)

            def build_old(store=store):
                return old_epoch(store, BOUNDS, seed=SEED, epoch=0, **batch)

            runs: dict[str, list] = {"old": [], "new": []}
            checked = 0
            for _ in range(args.rounds):
                old = measure(build_old)
                new = measure(build_new)
                runs["old"].append(old[:3])
                runs["new"].append(new[:3])
                checked = same_steps(old[3], new[3][1], np.random.default_rng(len(runs["old"])))
                sched, plan = new[3]
                del old, new
            t0 = time.perf_counter()
            for k in range(0, len(plan), max(1, len(plan) // 1000)):
                plan[k]
            step_us = (time.perf_counter() - t0) / len(range(0, len(plan), max(1, len(plan) // 1000))) * 1e6
            store_bytes = store.lengths.nbytes + store.num_bytes.nbytes + store.buckets.nbytes
            entry = {
                "examples": n,
                "steps_per_epoch": len(plan),
                "write_split_s": round(write_s, 2),
                "tokenstore_open_s": round(open_s, 3),
                "tokenstore_chunks": len(store._starts) - 1,
                "ids_us": round(ids_us, 2),
                "step_lookup_us": round(step_us, 1),
                "plan_bytes": plan.nbytes,
                "held_per_rank_bytes": store_bytes + sched._grouped.nbytes + plan.nbytes,
                "steps_checked_identical": checked,
            }
            for name, rs in runs.items():
                peaks = [r[1] for r in rs]
                entry[f"{name}_build_s"] = round(statistics.median(r[0] for r in rs), 3)
                entry[f"{name}_peak_rss_delta_mb"] = (
                    "unavailable" if None in peaks else round(max(peaks) / 2**20, 1)
                )
                entry[f"{name}_held_rss_mb"] = round(statistics.median(r[2] for r in rs) / 2**20, 1)
            entry["speedup"] = round(entry["old_build_s"] / entry["new_build_s"], 1)
            print(json.dumps(entry), flush=True)
            result[str(n)] = entry
            del store, sched, plan
    print(json.dumps(result))


if __name__ == "__main__":
    main()
