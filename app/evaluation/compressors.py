"""Reference compression rates: what gzip -9, bzip2 -9 and xz -9 achieve on the same bytes, in bits/byte.

The standard library's gzip / bz2 / lzma modules at level (preset) 9, so no external binaries; the
sizes include each format's header, as the command-line tools' output files would.
"""

from __future__ import annotations

import bz2
import gzip
import lzma

COMPRESSORS = {
    "gzip -9": lambda b: gzip.compress(b, compresslevel=9, mtime=0),
    "bzip2 -9": lambda b: bz2.compress(b, compresslevel=9),
    "xz -9": lambda b: lzma.compress(b, format=lzma.FORMAT_XZ, preset=9),
}


def compressed_bits_per_byte(data: bytes) -> dict[str, float]:
    """{name: 8 * compressed size / raw size} for every compressor in COMPRESSORS."""
    n = max(1, len(data))
    return {name: 8.0 * len(fn(data)) / n for name, fn in COMPRESSORS.items()}
