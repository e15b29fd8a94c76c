"""Documents -> fixed-size examples: tokenize in ``Dataset.map`` workers, append EOS, chunk.

The map function works on Arrow batches end to end: one ``encode_batch`` call per batch (the
tokenizer's own batch path), ids flattened into one int32 buffer, chunk offsets computed with
numpy, and a ``pa.Table`` returned, so Python does per-document work only in the tokenizer loop.
``num_bytes`` of a chunk is a difference of the cumulative per-token byte table, so chunk bytes add
up exactly to the document's UTF-8 bytes; that identity is checked per document here.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from data_prep.tokenizer import Tokenizer

EXAMPLE_SCHEMA = pa.schema(
    [
        ("input_ids", pa.list_(pa.int32())),
        ("length", pa.int32()),
        ("num_bytes", pa.int64()),
        ("doc_id", pa.int64()),
        ("split", pa.int8()),
    ]
)


class LossyTokenizerError(RuntimeError):
    pass


class EncodeFn:
    """Picklable map function: Arrow batch of documents -> Arrow table of examples."""

    def __init__(self, tokenizer: Tokenizer, max_seq_len: int) -> None:
        self.tokenizer = tokenizer
        self.max_seq_len = max_seq_len

    def _ids(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """Flat int32 ids (EOS appended per document) and per-document token counts."""
        parts = self.tokenizer.encode_arrays(texts)
        eos = np.array([self.tokenizer.eos_id], dtype=np.int32)
        counts = np.fromiter((len(p) + 1 for p in parts), dtype=np.int64, count=len(parts))
        flat = np.concatenate([a for p in parts for a in (p, eos)]) if parts else np.zeros(0, np.int32)
        return flat.astype(np.int32, copy=False), counts

    def __call__(self, batch: pa.Table) -> pa.Table:
        texts = batch.column("text").to_pylist()
        flat, counts = self._ids(texts)
        doc_end = np.cumsum(counts)
        doc_start = doc_end - counts
        n_chunks = -(-counts // self.max_seq_len)
        # chunk k of a document starts at doc_start + k * max_seq_len and ends at min(that + L, doc_end)
        first = np.repeat(np.cumsum(n_chunks) - n_chunks, n_chunks)
        k = np.arange(int(n_chunks.sum())) - first
        starts = np.repeat(doc_start, n_chunks) + k * self.max_seq_len
        ends = np.minimum(starts + self.max_seq_len, np.repeat(doc_end, n_chunks))
        offsets = np.append(starts, ends[-1] if len(ends) else 0).astype(np.int32)

        cum = np.concatenate([[0], np.cumsum(self.tokenizer.token_bytes[flat])])
        num_bytes = cum[ends] - cum[starts]
        expected = batch.column("num_bytes").to_numpy()
        got = cum[doc_end] - cum[doc_start]
        if not np.array_equal(got, expected):
            i = int(np.flatnonzero(got != expected)[0])
            raise LossyTokenizerError(
                f"tokenizer is not lossless on document {batch.column('doc_id')[i].as_py()}: "
                f"{got[i]} token bytes vs {expected[i]} UTF-8 bytes"
            )
        return pa.Table.from_arrays(
            [
                pa.ListArray.from_arrays(pa.array(offsets), pa.array(flat)),
                pa.array((ends - starts).astype(np.int32)),
                pa.array(num_bytes.astype(np.int64)),
                pa.array(np.repeat(batch.column("doc_id").to_numpy(), n_chunks)),
                pa.array(np.repeat(batch.column("split").to_numpy(), n_chunks)),
            ],
            schema=EXAMPLE_SCHEMA,
        )


def encode_documents(docs, tokenizer: Tokenizer, *, max_seq_len: int, num_proc: int, batch_size: int = 256):
    """``docs`` has columns text, doc_id, num_bytes, split; returns examples (EXAMPLE_SCHEMA) in document order."""
    import datasets

    # Enough batches for every worker to stay busy, few enough that per-batch overhead stays small.
    batch_size = max(1, min(batch_size, -(-len(docs) // (4 * num_proc))))

    features = datasets.Features(
        {
            "input_ids": datasets.Sequence(datasets.Value("int32")),
            "length": datasets.Value("int32"),
            "num_bytes": datasets.Value("int64"),
            "doc_id": datasets.Value("int64"),
            "split": datasets.Value("int8"),
        }
    )
    return (
        docs.with_format("arrow")
        .map(
            EncodeFn(tokenizer, max_seq_len),
            batched=True,
            batch_size=batch_size,
            num_proc=min(num_proc, max(1, len(docs) // batch_size)) if num_proc > 1 else None,
            remove_columns=docs.column_names,
            features=features,
            new_fingerprint=f"encode-{docs._fingerprint}-{max_seq_len}",
            desc="Encoding",
        )
        .with_format(None)
    )
