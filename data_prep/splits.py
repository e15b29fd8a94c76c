"""Train/validation/test assignment as a pure function of each document's content and ``--seed``.

Each kept document has ``u`` = keyed-hash(content, seed) mapped to [0, 1):
``u < val_fraction`` -> validation, ``u < val_fraction + test_fraction`` -> test, else train.
Adding or removing files therefore never moves an existing document, and identical documents
(duplicated lines, copied files) always land in the same split, so nothing leaks from train to eval.

Too few documents (one book, a handful of files: a held-out split with a non-zero fraction gets no
document by hash): every document is cut at chunk boundaries into contiguous train, validation and
test segments instead (``encode.segment_codes``); the scan decides, the summary says so.
"""

from __future__ import annotations

import numpy as np

SPLIT_CODES = {"train": 0, "validation": 1, "test": 2}


def code_of(u: float, val_fraction: float, test_fraction: float) -> int:
    """Split code of one document (0 train, 1 validation, 2 test)."""
    if u < val_fraction:
        return 1
    return 2 if u < val_fraction + test_fraction else 0


def assign(u: np.ndarray, val_fraction: float, test_fraction: float) -> np.ndarray:
    """Split code per document, vectorised ``code_of``."""
    codes = np.zeros(len(u), dtype=np.int8)
    codes[u < val_fraction + test_fraction] = SPLIT_CODES["test"]
    codes[u < val_fraction] = SPLIT_CODES["validation"]
    return codes
