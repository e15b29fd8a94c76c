"""The memory a work really takes, for the tests that check an estimate against it (bench/memory.py runs
the work in a child process and reports the app's estimate beside the peak RSS growth).

Tolerance: the estimate must be >= the measured growth (what fits is admitted, what does not is refused)
and <= 2x it (nothing that fits is refused for a figure far off). The sizes make growths of 40 MB and more,
so that the allocator's noise (a few MB: glibc's arenas, torch's and Python's small-object caches) is a few
percent of what is measured, and the estimates sit at 1.1x-1.7x of it (bench/README.md), well inside.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

_spec = importlib.util.spec_from_file_location(
    "bench_memory", Path(__file__).resolve().parent.parent / "bench" / "memory.py"
)
bench_memory = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench_memory)


def check_estimate(work: str, **sizes) -> dict:
    """`work` measured at `sizes` in a child process; asserts 1x <= estimate / measured <= 2x."""
    r = bench_memory.measure({"work": work, **sizes})
    assert r["measured"] >= 30 << 20, f"{work} {sizes}: too small to measure above the noise: {r}"
    assert 1.0 <= r["ratio"] <= 2.0, (
        f"{work} {sizes}: estimate {r['estimate']:,} vs measured {r['measured']:,}"
    )
    return r
