"""CSV/TSV files -> records, the same whatever pandas and ``datasets`` releases are installed.

A file of valid UTF-8 with no NUL byte goes through ``datasets``' streaming ``csv`` builder (pandas' C
parser). Any other file is read with Python's ``csv`` module from a UTF-8 stream decoded with replacement
characters, because two releases in our declared range lose text there, silently or not:
- pandas before 3.1 ends a field at its first NUL byte (``"a\\0b"`` is read as ``"a"``), so a row that
  should be skipped and counted as ``nul_bytes`` was kept, cut;
- ``datasets`` before 5.1 drops ``encoding_errors`` under pandas 3.0-3.2 (it compares the minor version
  alone), so one byte of Latin-1 refused the whole prep.
The scan that decides also finds the first invalid byte (line, offset), which is reported as for text.
"""

from __future__ import annotations

import codecs
import csv
import io
from collections.abc import Iterator
from pathlib import Path

from data_prep import readers
from data_prep.errors import UserError

SCAN_BYTES = 1 << 20
FIELD_LIMIT = (1 << 31) - 1  # the csv module's default is 128 KiB; pandas has none


def scan(path: Path, utf8: readers.Utf8State) -> bool:
    """True if the file holds a NUL byte or invalid UTF-8; sets ``utf8.first_bad`` at the first invalid byte."""
    decoder = codecs.getincrementaldecoder("utf-8")("strict")
    line, offset, nul = 1, 0, False
    with open(path, "rb") as f:
        while block := f.read(SCAN_BYTES):
            nul = nul or b"\0" in block
            if utf8.first_bad is None:
                held = len(decoder.getstate()[0])  # a character's first bytes, from the block before
                try:
                    decoder.decode(block)
                except UnicodeDecodeError as exc:
                    at = exc.start - held  # < 0: the bad sequence began in the block before (no newline)
                    utf8.first_bad = (line + block.count(b"\n", 0, max(at, 0)), offset + at)
                    decoder = None
            line += block.count(b"\n")
            offset += len(block)
            if nul and utf8.first_bad is not None:
                break
    if utf8.first_bad is None and decoder is not None:
        held = len(decoder.getstate()[0])
        try:
            decoder.decode(b"", final=True)  # a file that ends inside a character
        except UnicodeDecodeError as exc:
            utf8.first_bad = (line, offset - held + exc.start)
    return nul or utf8.first_bad is not None


def csv_records(path: Path, text_field: str, sep: str, clean: bool) -> Iterator[readers.Record]:
    """Rows of a CSV/TSV file (``clean``: ``scan`` found nothing): its header row is line 1, rows are
    numbered from 2 as they come."""
    if clean:
        yield from readers.table_records(
            "csv", path, text_field, 2, sep=sep, keep_default_na=False, na_values=[]
        )
        return
    yield from _python_rows(path, text_field, sep)


def _python_rows(path: Path, text_field: str, sep: str) -> Iterator[readers.Record]:
    """What pandas gives with ``keep_default_na=False``: an empty or missing field is "", a blank line is
    no row; a UTF-8 byte-order mark is dropped."""
    csv.field_size_limit(max(csv.field_size_limit(), FIELD_LIMIT))
    with open(path, "rb") as raw:
        text = io.TextIOWrapper(raw, encoding="utf-8-sig", errors="replace", newline="")
        rows = csv.reader(text, delimiter=sep)
        try:
            header = next(rows, None)
            if header is None:
                return
            if text_field not in header:
                raise UserError(
                    f"{path}: no column {text_field!r} (columns: {', '.join(header)}); pick one with --text-field"
                )
            col, line = header.index(text_field), 2
            for row in rows:
                if not row:
                    continue
                yield row[col] if col < len(row) else "", "", line, True
                line += 1
        except csv.Error as exc:
            raise UserError(f"{path}:{rows.line_num}: cannot read as csv: {exc}") from exc
