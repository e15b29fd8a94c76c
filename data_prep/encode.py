"""One block of documents -> fixed-size examples per split: tokenize, append EOS, chunk, assign splits.

Runs in the worker processes (``EncodeFn`` pickles with the tokenizer as bytes). The work is on numpy
buffers end to end: one ``encode_arrays`` call per block, ids flattened into one int32 buffer, chunk
offsets computed with numpy, one Arrow table per split returned. ``num_bytes`` of a chunk is a
difference of the cumulative per-token byte table, so chunk bytes add up exactly to the document's
UTF-8 bytes; that identity is checked per document here.

Split of a chunk: the document's hash split, or, in *segment* mode (a corpus with too few documents
for every split to get one by hash), contiguous runs of each document's chunks: the first
``1 - val - test`` of them train, then validation, then test (at least one each when the document
has three chunks or more; shorter ones stay whole in train), as nanoGPT splits one text.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from data_prep import documents, readers
from data_prep.splits import SPLIT_CODES, code_of
from data_prep.tokenizer import Tokenizer

EXAMPLE_SCHEMA = pa.schema(
    [
        ("input_ids", pa.list_(pa.int32())),
        ("length", pa.int32()),
        ("num_bytes", pa.int64()),
        ("doc_id", pa.int64()),
    ]
)
N_SPLITS = len(SPLIT_CODES)


class LossyTokenizerError(RuntimeError):
    pass


@dataclass(slots=True)
class Block:
    """Records handed to one worker call, as read (the main process only reads; workers parse, check and hash)."""

    texts: list[str | None]
    eos: list[bool]  # the document ends here (not a cut part of a longer one)
    rows: list[bool]  # the text is a JSON Lines row still to parse (``readers.parse_row``)


@dataclass(slots=True)
class Encoded:
    tables: list[pa.Table]  # one per split code
    docs: np.ndarray  # (3,) documents (segment mode: document segments) with examples in each split
    hist: np.ndarray  # (max_seq_len + 1,) int64 count of train examples per length


def segment_codes(n_chunks: np.ndarray, val: float, test: float) -> np.ndarray:
    """Per chunk split codes (concatenated over documents) for contiguous train/validation/test runs."""
    n_val = np.rint(n_chunks * val).astype(np.int64)
    n_test = np.rint(n_chunks * test).astype(np.int64)
    big = n_chunks >= 3
    n_val = np.where(big & (val > 0), np.maximum(n_val, 1), np.where(big, n_val, 0))
    n_test = np.where(big & (test > 0), np.maximum(n_test, 1), np.where(big, n_test, 0))
    over = np.maximum(n_val + n_test - (n_chunks - 1), 0)  # keep at least one train chunk
    n_test = n_test - np.minimum(over, n_test)
    n_train = n_chunks - n_val - n_test
    pos = np.arange(int(n_chunks.sum())) - np.repeat(np.cumsum(n_chunks) - n_chunks, n_chunks)
    train_end = np.repeat(n_train, n_chunks)
    val_end = train_end + np.repeat(n_val, n_chunks)
    return np.where(pos < train_end, 0, np.where(pos < val_end, 1, 2)).astype(np.int8)


class EncodeFn:
    """Picklable: Block -> Encoded."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        max_seq_len: int,
        *,
        seed: int,
        text_field: str,
        fractions: tuple[float, float],
        moves: dict[float, int],
        segments: bool,
    ) -> None:
        self.tokenizer = tokenizer
        self.max_seq_len = max_seq_len
        self.seed, self.fractions, self.moves = seed, fractions, moves
        self.text_field = text_field
        self.segments = segments  # contiguous segments per document instead of whole documents per split

    def _records(self, block: Block):
        for text, eos, row in zip(block.texts, block.eos, block.rows):
            if row:
                text, reason = readers.parse_row(text, self.text_field)
                if reason:
                    continue  # counted by the scan
            yield text, "", 0, 0, eos

    def _documents(self, block: Block):
        texts, doc_id, num_bytes, split, eos = [], [], [], [], []
        records = self._records(block)
        for text, reason, d, u, n, e, _, _ in documents.check(records, self.seed):
            if reason:
                continue  # counted by the scan
            texts.append(text)
            doc_id.append(d)
            num_bytes.append(n)
            split.append(self.moves.get(u, code_of(u, *self.fractions)))
            eos.append(e)
        return (
            texts,
            np.array(doc_id, np.int64),
            np.array(num_bytes, np.int64),
            np.array(split, np.int8),
            np.array(eos, bool),
        )

    def __call__(self, block: Block) -> Encoded:
        tok, L = self.tokenizer, self.max_seq_len
        texts, doc_ids, doc_bytes, doc_split, doc_eos = self._documents(block)
        parts = tok.encode_arrays(texts)
        eos = np.array([tok.eos_id], dtype=np.int32)
        counts = np.fromiter((len(p) for p in parts), dtype=np.int64, count=len(parts)) + doc_eos
        pieces = [a for p, e in zip(parts, doc_eos) for a in ((p, eos) if e else (p,))]
        flat = np.concatenate(pieces).astype(np.int32, copy=False) if pieces else np.zeros(0, np.int32)
        doc_end = np.cumsum(counts)
        doc_start = doc_end - counts
        n_chunks = -(-counts // L)
        # chunk k of a document starts at doc_start + k * L and ends at min(that + L, doc_end)
        first = np.repeat(np.cumsum(n_chunks) - n_chunks, n_chunks)
        k = np.arange(int(n_chunks.sum())) - first
        starts = np.repeat(doc_start, n_chunks) + k * L
        ends = np.minimum(starts + L, np.repeat(doc_end, n_chunks))

        cum = np.zeros(len(flat) + 1, np.int64)  # cum[i]: bytes of the first i tokens
        np.cumsum(tok.token_bytes[flat], out=cum[1:])
        got = cum[doc_end] - cum[doc_start]
        if not np.array_equal(got, doc_bytes):
            i = int(np.flatnonzero(got != doc_bytes)[0])
            raise LossyTokenizerError(
                f"tokenizer is not lossless on document {int(doc_ids[i])}: "
                f"{got[i]} token bytes vs {doc_bytes[i]} UTF-8 bytes"
            )
        num_bytes = cum[ends] - cum[starts]
        lengths = (ends - starts).astype(np.int32)
        doc_of_chunk = np.repeat(np.arange(len(counts)), n_chunks)
        if self.segments:
            code = segment_codes(n_chunks, *self.fractions)  # documents under 3 chunks stay whole in train
        else:
            code = np.repeat(doc_split, n_chunks)
        tables, docs = [], np.zeros(N_SPLITS, np.int64)
        present = np.bincount(code, minlength=N_SPLITS) > 0
        # the chunks tile ``flat`` in order, so a split's ids are the tokens whose chunk has its code
        token_code = np.repeat(code, lengths) if present.sum() > 1 else None  # (tokens,) int8
        for c in range(N_SPLITS):
            idx = np.flatnonzero(code == c)
            docs[c] = len(np.unique(doc_of_chunk[idx]))
            offsets = np.zeros(len(idx) + 1, np.int32)
            np.cumsum(lengths[idx], out=offsets[1:])
            if not present[c]:
                ids = flat[:0]
            elif token_code is None:
                ids = flat  # every chunk is in this split
            else:
                ids = flat[token_code == c]
            tables.append(
                pa.Table.from_arrays(
                    [
                        pa.ListArray.from_arrays(pa.array(offsets), pa.array(ids)),
                        pa.array(lengths[idx]),
                        pa.array(num_bytes[idx].astype(np.int64)),
                        pa.array(doc_ids[doc_of_chunk[idx]]),
                    ],
                    schema=EXAMPLE_SCHEMA,
                )
            )
        hist = np.bincount(lengths[code == 0], minlength=L + 1).astype(np.int64)
        return Encoded(tables, docs, hist)
