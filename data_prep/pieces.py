"""One encoded block as it goes into the shard files: Arrow IPC messages per split, and its counts.

A shard file is an Arrow IPC stream: the schema message, record-batch messages, and an end marker.
Record-batch messages do not depend on where they sit in a stream, so a block's messages can be made
anywhere and appended later; ``shards.GroupWriter`` writes the schema, appends pieces in input order
and ends the stream, and the bytes equal those of one ``pa.ipc.new_stream`` writer given the same
tables (checked in the tests).

Why: the encoded tokens are the bulk of the data (4 bytes per token; for the byte tokenizer four
times the input). Workers used to send them back through the pool's pipe, and the parent spent its
time receiving, unpickling and re-serialising them while the workers waited to send: more workers
ran slower. Now a worker serialises its block and writes it to a spool file; only the counts and
the spool file's offsets travel back, and the parent moves the bytes with ``os.copy_file_range``
(a copy inside the kernel, page cache to page cache; a spool file deleted soon enough is never
written to the disk).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa

from app.common import faults
from data_prep.encode import Encoded

END_OF_STREAM = b"\xff\xff\xff\xff\x00\x00\x00\x00"  # Arrow IPC: continuation marker, zero length


@dataclass(slots=True)
class Piece:
    """The messages of one block per split: held in memory, or spilled to ``spool`` at ``ranges``."""

    docs: list[int]  # per split: documents (segment mode: segments) with examples in this block
    examples: list[int]
    tokens: list[int]
    bytes: list[int]  # UTF-8 bytes of the examples
    table_bytes: int  # Arrow buffer bytes of all three tables: what fills a shard group
    hist: np.ndarray  # (max_seq_len + 1,) int64 train examples per length
    data: list[list[pa.Buffer]] = field(default_factory=list)  # per split: messages, in memory
    spool: str | None = None  # spilled: the file holding the messages of all splits back to back
    ranges: list[tuple[int, int]] = field(default_factory=list)  # per split: (offset, length) in spool


def from_encoded(enc: Encoded) -> Piece:
    """Serialise the tables (one record batch per non-empty split) and count them."""
    data, examples, tokens, nbytes = [], [], [], []
    table_bytes = 0
    for table in enc.tables:
        data.append([b.serialize() for b in table.to_batches()] if len(table) else [])
        examples.append(len(table))
        tokens.append(int(np.asarray(table.column("length")).sum()) if len(table) else 0)
        nbytes.append(int(np.asarray(table.column("num_bytes")).sum()) if len(table) else 0)
        table_bytes += table.nbytes
    return Piece([int(d) for d in enc.docs], examples, tokens, nbytes, table_bytes, enc.hist, data)


def spill(piece: Piece, path: Path) -> Piece:
    """Write the messages to ``path`` (all splits back to back) and keep only where they are."""
    ranges, offset = [], 0
    with open(path, "wb") as f:
        for messages in piece.data:
            length = 0
            for m in messages:
                f.write(m)
                length += m.size
            ranges.append((offset, length))
            offset += length
    piece.data, piece.spool, piece.ranges = [], str(path), ranges
    return piece


def append(piece: Piece, split: int, dst: int) -> None:
    """Append the messages of ``split`` to the open file descriptor ``dst``."""
    faults.shard_write(
        sum(m.size for m in piece.data[split]) if piece.spool is None else piece.ranges[split][1]
    )
    if piece.spool is None:
        for m in piece.data[split]:
            write_all(dst, m)
        return
    offset, length = piece.ranges[split]
    if length:
        with open(piece.spool, "rb") as src:
            _copy(src.fileno(), dst, offset, length)


def release(piece: Piece) -> None:
    """Delete the spool file (its pages are usually dropped before they ever reach the disk)."""
    if piece.spool is not None:
        Path(piece.spool).unlink(missing_ok=True)


def _copy(src: int, dst: int, offset: int, length: int) -> None:
    end = offset + length
    while offset < end:
        try:  # in-kernel copy; absent on some systems, refused by some file systems
            n = os.copy_file_range(src, dst, end - offset, offset)
        except (AttributeError, OSError):
            n = 0
        if n <= 0:
            break
        offset += n
    while offset < end:  # the portable way, for whatever copy_file_range left
        chunk = os.pread(src, min(end - offset, 1 << 22), offset)
        if not chunk:
            raise OSError(f"spool file ended early at byte {offset} of {end}")
        write_all(dst, chunk)
        offset += len(chunk)


def write_all(fd: int, data: bytes | memoryview) -> None:
    data = memoryview(data)
    while data:
        data = data[os.write(fd, data) :]
