"""Pass 1 of a data-prep run: every record read once, the skip rules applied, each document hashed to its
split and counted, the source fingerprinted, and a bounded seeded sample kept for SentencePiece (the
documents with the smallest split hash, up to the sample budget). Then how a held-out split that got no
document by hash gets some (`rescue`)."""

from __future__ import annotations

import hashlib
import heapq
import logging
import time
from collections import Counter
from typing import Any

import numpy as np

from app.common.logs import Progress
from data_prep import documents, readers, sources, splits
from data_prep.config import PrepConfig
from data_prep.errors import UserError

log = logging.getLogger(__name__)
MAX_EXAMPLES_SHOWN = 3


class _Cuts:
    """Documents longer than readers.PART_CHARS that came as several parts (each a document from then on:
    split, tokenized and counted alone), so the summary can say why a file became N documents."""

    def __init__(self) -> None:
        self.documents = self.parts = 0
        self._open = False  # the last record was a part that did not end its document

    def note(self, ends_document: bool) -> None:
        if not self._open and not ends_document:
            self.documents += 1
        if self._open or not ends_document:
            self.parts += 1
        self._open = not ends_document

    def as_dict(self) -> dict[str, int]:
        return {"documents": self.documents, "parts": self.parts, "part_chars": readers.PART_CHARS}


def first_pass(
    cfg: PrepConfig, srcs: sources.Sources, sample_budget: int, progress: Progress
) -> tuple[dict[str, Any], tuple[Sample, Sample]]:
    """Pass 1: counts, skip examples, split sizes by hash, the source fingerprint and the tokenizer sample."""
    skipped: Counter = Counter({r: 0 for r in documents.SKIP_REASONS})
    where: dict[str, list[str]] = {r: [] for r in documents.SKIP_REASONS}
    split_docs = np.zeros(3, np.int64)
    with_fffd: Counter = Counter()
    fingerprint = hashlib.blake2b(digest_size=16)
    budget = sample_budget
    # (-u, order, text) of the documents with the smallest u: among train ones, and (for a corpus that
    # ends up cut into segments, whose one book may have hashed to validation) among all
    train_sample, any_sample = Sample(budget), Sample(budget)
    records = kept = total_bytes = 0
    lowest: dict[float, list[int]] = {}  # the two smallest u of train documents: [copies, bytes]
    want_sample = cfg.tokenizer == "sentencepiece" and cfg.tokenizer_model is None
    t0, cuts = time.perf_counter(), _Cuts()
    for text, reason, doc_id, u, nbytes, eos, file, line in documents.check(srcs.records(), cfg.seed):
        records += 1
        progress.update()
        cuts.note(eos)
        if reason:
            skipped[reason] += 1
            if len(where[reason]) < MAX_EXAMPLES_SHOWN:
                where[reason].append(f"{srcs.names[file]}:{line}" if line > 0 else srcs.names[file])
            continue
        kept += 1
        total_bytes += nbytes
        fingerprint.update(doc_id.to_bytes(8, "little"))
        code = splits.code_of(u, cfg.val_fraction, cfg.test_fraction)
        split_docs[code] += 1
        if code == 0 and (len(lowest) < 2 or u <= max(lowest)):
            entry = lowest.setdefault(u, [0, 0])
            entry[0], entry[1] = entry[0] + 1, entry[1] + nbytes
            if len(lowest) > 2:
                del lowest[max(lowest)]
        if "\ufffd" in text:
            with_fffd[file] += 1
        if want_sample:
            any_sample.offer(u, records, text, nbytes)
            if code == 0:
                train_sample.offer(u, records, text, nbytes)
        if records % 200_000 == 0:
            log.info(
                "scanned %d records, %.0f MB, %.1f s", records, total_bytes / 1e6, time.perf_counter() - t0
            )
    fingerprint.update(repr(sorted(skipped.items())).encode())
    for reason in documents.SKIP_REASONS:
        if skipped[reason]:
            more = skipped[reason] - len(where[reason])
            log.warning(
                "skipped %d record(s) (%s): %s%s",
                skipped[reason],
                reason,
                ", ".join(where[reason]),
                f" and {more} more" if more > 0 else "",
            )
    samples = (train_sample, any_sample)
    scan = {
        "records": records,
        "kept": kept,
        "bytes": total_bytes,
        "skipped": dict(skipped),
        "where": where,
        "repaired": int(sum(n for f, n in with_fffd.items() if f in srcs.bad_utf8)),
        "cut_short": sorted(srcs.broken.values()),  # compressed inputs truncated or corrupt ("file:line")
        "split_docs": split_docs.tolist(),
        "lowest_train": sorted([u, n, b] for u, (n, b) in lowest.items()),
        "fingerprint": fingerprint.hexdigest(),
        "long_documents_cut": cuts.as_dict(),
    }
    log.info(
        "scanned %d records (%.0f MB kept) in %.1f s", records, total_bytes / 1e6, time.perf_counter() - t0
    )
    return scan, samples


class Sample:
    """The documents with the smallest u, up to ``budget`` bytes (plus the one that crosses it, as before)."""

    def __init__(self, budget: int) -> None:
        self.budget, self.held = budget, 0
        self.heap: list[tuple[float, int, str, int]] = []  # (-u, input order, text, bytes)

    def offer(self, u: float, order: int, text: str, nbytes: int) -> None:
        if self.held < self.budget or u < -self.heap[0][0]:
            heapq.heappush(self.heap, (-u, order, text, nbytes))
            self.held += nbytes
            while self.held - self.heap[0][3] >= self.budget:
                self.held -= heapq.heappop(self.heap)[3]

    def texts(self, drop: set[float] = frozenset()) -> list[str]:
        """In input order (``drop``: the u of documents moved out of train)."""
        return [t for u, _, t, _ in sorted(self.heap, key=lambda x: x[1]) if -u not in drop]


def rescue(cfg: PrepConfig, scan: dict[str, Any]) -> list[str]:
    """Decide how a held-out split that got no document by hash gets some (sets scan["moves"] and
    scan["split_mode"]; returns the names of the splits that were empty by hash).

    A corpus with enough documents moves the train document nearest the held-out range (all its
    copies), as long as it is no bigger than twice the split's share of the text; otherwise (one book,
    a handful of files) the corpus is cut into contiguous segments per document instead."""
    empty, moves = [], []
    lowest = list(scan["lowest_train"])
    train_docs = scan["split_docs"][0]
    segments = train_docs == 0  # everything hashed to validation/test: only possible with very few documents
    for name, code, frac in (("validation", 1, cfg.val_fraction), ("test", 2, cfg.test_fraction)):
        if frac <= 0 or scan["split_docs"][code] > 0:
            continue
        empty.append(name)
        if lowest and train_docs - lowest[0][1] >= 2 and lowest[0][2] <= 2 * frac * scan["bytes"]:
            u, n, _ = lowest.pop(0)
            moves.append([u, code])
            train_docs -= n
        else:
            segments = True
    scan["moves"] = [] if segments else moves
    scan["split_mode"] = "segments" if segments else "documents"
    if not segments:
        for u, code in moves:
            n = next(m[1] for m in scan["lowest_train"] if m[0] == u)
            scan["split_docs"][0] -= n
            scan["split_docs"][code] += n
    return empty


def check_kept(scan: dict[str, Any], srcs: sources.Sources) -> None:
    """Refuse an input whose every record was skipped, with the count per reason."""
    if scan["kept"] == 0:
        names = srcs.names
        w = names[0] if len(names) == 1 else f"{len(names)} inputs"
        raise UserError(
            f"no documents left in {w}: all {scan['records']} records were skipped ("
            + ", ".join(f"{r} {n}" for r, n in scan["skipped"].items() if n)
            + ")"
        )


def tokenizer_sample(scan: dict[str, Any], samples: tuple[Sample, Sample] | None) -> list[str] | None:
    """The texts SentencePiece trains on (None when resumed): train documents only, unless the corpus is cut
    into segments."""
    if samples is None:
        return None
    if scan["split_mode"] == "documents":
        return samples[0].texts(drop={u for u, _ in scan["moves"]})
    return samples[1].texts()
