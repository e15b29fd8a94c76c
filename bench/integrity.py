"""What data_prep/integrity.py's start-up checks cost per byte: the XXH3-128 shard digest and the token-id
range pass, on an Arrow shard in the page cache (a list<int32> `input_ids` column, as data_prep writes it).
JSON line last.

    python bench/integrity.py [--mb 512] [--rounds 3]

Reports GB/s for each check (the best of the rounds) and the seconds 100 GB of shards would take at that
rate, one process. A disk slower than these rates bounds the check instead.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from data_prep.integrity import file_digest, id_problem


def write_shard(path: Path, mb: int, seq: int = 1024) -> None:
    """Rows of `seq` random ids below 4096, about `mb` MB of int32 values, in Arrow's IPC file format."""
    rows = max(1, mb * (1 << 20) // (4 * seq))
    ids = np.random.default_rng(0).integers(0, 4096, size=rows * seq, dtype=np.int32)
    col = pa.ListArray.from_arrays(np.arange(0, rows * seq + 1, seq, dtype=np.int32), ids)
    table = pa.table({"input_ids": col})
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table, max_chunksize=4096)


def best_seconds(fn, rounds: int) -> float:
    best = float("inf")
    for _ in range(rounds):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=int, default=512, help="shard size in MB")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "00000.arrow"
        write_shard(path, args.mb)
        size = path.stat().st_size
        file_digest(path)  # into the page cache
        column = pa.ipc.open_file(pa.memory_map(str(path))).read_all().column("input_ids")
        digest_s = best_seconds(lambda: file_digest(path), args.rounds)
        ids_s = best_seconds(lambda: id_problem(path, column, 4096, path), args.rounds)
    rates = {"digest": size / digest_s / 1e9, "id_range": size / ids_s / 1e9}
    result = {
        "bench": "integrity",
        "shard_bytes": size,
        "gb_per_s": {k: round(v, 2) for k, v in rates.items()},
        "seconds_per_100_gb": round(sum(100 / v for v in rates.values()), 1),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
