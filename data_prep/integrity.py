"""Is a prepared shard still what data prep wrote? Sizes, XXH3-128 digests and token-id ranges.

Readers check in two steps (``format.load_prepared``, ``PreparedData.split``):

- at open, every shard file that ``manifest.json`` lists exists and has its recorded size (a ``stat``
  each: a missing or truncated shard is refused before anything else runs);
- when a split is opened (training opens all three at start-up), each of its shard files is hashed
  against the manifest and the largest and smallest token id are checked against the vocabulary in
  ``meta.json``, so damage of the same size, or a ``meta.json`` whose vocabulary is too small for the
  ids, is refused before the first step rather than ending in an ``IndexError`` in the embedding (or,
  with an id that happens to be in range, in training on garbage in silence).

The functions return a one-line problem (``None`` when the file is fine); ``format`` raises it.
Digests guard against damage (a kill mid-copy, a bad disk, a truncated transfer), not against
tampering: whoever can change a shard can change the manifest too.
"""

from __future__ import annotations

import mmap
from pathlib import Path

import numpy as np
import xxhash

from data_prep import arrow_numpy

CHUNK = 1 << 24  # 16 MiB per update: large enough that the per-call cost vanishes


def file_digest(path: Path) -> str:
    """XXH3-128 of the file, hashed from a read-only memory map (no copy through a read buffer). Data prep
    hashes each shard in the parent while the workers encode, where SHA-256 (~0.7 GB/s here vs ~4 GB/s)
    was the largest serial cost; rsync uses the same hash for its file checksums."""
    h = xxhash.xxh3_128()
    with open(path, "rb") as f:
        size = f.seek(0, 2)
        if size:
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
                view = memoryview(m)
                try:
                    for start in range(0, size, CHUNK):
                        h.update(view[start : start + CHUNK])
                        # hashed pages leave this process (they stay in the page cache): a mapped
                        # 256 MB shard would otherwise count whole in the resident set
                        m.madvise(mmap.MADV_DONTNEED, start, min(CHUNK, size - start))
                finally:
                    view.release()
    return h.hexdigest()


def size_problem(path: Path, expected: int) -> str | None:
    """Missing, not a file, or another size than the manifest's."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return f"{path}: shard missing (manifest.json lists it)"
    except OSError as e:
        return f"{path}: shard unreadable ({e.strerror or e})"
    if not path.is_file():
        return f"{path}: not a file (manifest.json lists it as a shard)"
    if size != expected:
        how = "truncated" if size < expected else "longer than written"
        return f"{path}: shard {how}: {size} bytes, manifest.json says {expected}"
    return None


def digest_problem(path: Path, expected: str) -> str | None:
    """A digest other than the manifest's: the bytes changed since data prep wrote them."""
    try:
        got = file_digest(path)
    except OSError as e:
        return f"{path}: shard unreadable ({e.strerror or e})"
    if got != expected:
        return f"{path}: shard damaged: its XXH3-128 digest differs from manifest.json's (same size, other bytes)"
    return None


def id_problem(path: Path, input_ids, vocab_size: int, meta_path: Path) -> str | None:
    """Token ids outside [0, vocab_size): ``input_ids`` is the shard's list<int32> column (chunked)."""
    top = -1  # the largest id read as uint32: a negative int32 id reads as 2**31 or more
    for chunk in input_ids.chunks:
        values = arrow_numpy.view(chunk.values)  # the memory-mapped buffer itself
        if len(values):
            top = max(top, int(values.view(np.uint32).max()))  # one pass checks both ends
    if top >= vocab_size:
        bad = top - (1 << 32) if top >= 1 << 31 else top
        return (
            f"{path}: token id {bad} is outside the vocabulary of {vocab_size} that {meta_path} gives "
            f"(the shard or meta.json is damaged, or they come from different preps)"
        )
    return None
