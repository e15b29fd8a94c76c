"""Train/validation/test assignment as a pure function of each document's content and ``--seed``.

Each kept document has ``u`` = keyed-hash(content, seed) mapped to [0, 1):
``u < val_fraction`` -> validation, ``u < val_fraction + test_fraction`` -> test, else train.
Adding or removing files therefore never moves an existing document, and identical documents
(duplicated lines, copied files) always land in the same split, so nothing leaks from train to eval.

Tiny corpora: if a held-out split with a non-zero fraction comes out empty while train has at least
3 documents, the train document with the smallest ``u`` (the one nearest the held-out range) moves
into it (validation first, then test). This is still a function of the document set alone; it only
ever applies to corpora small enough that hash luck leaves a split empty, and the summary says so.
"""

from __future__ import annotations

import numpy as np

SPLIT_CODES = {"train": 0, "validation": 1, "test": 2}


def assign(u: np.ndarray, val_fraction: float, test_fraction: float) -> tuple[np.ndarray, list[str]]:
    """Split code per document (0 train, 1 validation, 2 test) and the notes on any rescued split."""
    codes = np.zeros(len(u), dtype=np.int8)
    codes[u < val_fraction + test_fraction] = SPLIT_CODES["test"]
    codes[u < val_fraction] = SPLIT_CODES["validation"]
    notes: list[str] = []
    for name, fraction in (("validation", val_fraction), ("test", test_fraction)):
        code = SPLIT_CODES[name]
        train = np.flatnonzero(codes == 0)
        if fraction > 0 and not (codes == code).any() and len(train) >= 3:
            nearest = u[train] == u[train].min()  # all copies of that document move together
            codes[train[nearest]] = code
            notes.append(
                f"{name} split was empty by hash; moved {int(nearest.sum())} document(s) from train into it"
            )
    return codes, notes
