"""The texts to classify, streamed: one row at a time from a CSV, JSON Lines, Parquet or plain-text file
(.gz/.bz2/.xz/.zst read as streams, app/classifying/streams.py) or stdin, so a 10 GB input never sits in
memory.

Every input record is a row, numbered from 1 (CSV: the data rows after the header; JSONL and plain text:
the lines; Parquet: its rows). A row whose text cannot be classified is a bad row, yielded with the reason
(never dropped unsaid): an empty text, a missing or non-text field, a line that is not a JSON object,
invalid UTF-8, a CSV record with another number of fields than the header. What makes the whole input
unreadable (no such file, no --text-field column, a CSV the parser cannot follow, a broken archive) is one
UserError line. A --keep-fields value that is not valid UTF-8 is kept escaped (app.common.text.escaped) and
counted on its row.

As it reads, the input keeps a digest of the bytes each chunk of rows was read from (`take_digest`: the
lines of a CSV, JSONL or text file, the header of a CSV in every chunk's; a Parquet file's values): what a
part records, so a rerun knows a part was made from the bytes it reads now.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from app.classifying.streams import Counted, lines, open_input, reading
from app.common.errors import UserError
from app.common.text import SAMPLE_ROWS, escaped, text_column


@dataclass(slots=True)
class Row:
    number: int  # 1-based row of the input
    text: str | None  # None: a bad row
    problem: str = ""  # why it is bad
    kept: dict = field(default_factory=dict)  # --keep-fields' values
    nbytes: int = 0  # the text's UTF-8 bytes
    escaped: int = 0  # --keep-fields' values that were not valid UTF-8, kept escaped


def _checked(text: object, field_name: str, number: int, kept: tuple[dict, int]) -> Row:
    """A text value -> a Row, bad when it is not a non-empty string of valid UTF-8."""
    if text is None:
        return Row(number, None, f"no {field_name!r}" if field_name else "no text", *kept)
    if not isinstance(text, str):
        return Row(number, None, f"{field_name!r} is {type(text).__name__}, not text", *kept)
    try:
        nbytes = len(text.encode("utf-8"))
    except UnicodeEncodeError:  # surrogateescape's stand-ins for bytes that are not UTF-8
        return Row(number, None, "invalid UTF-8", *kept)
    if not text.strip():
        return Row(number, None, "empty text", *kept)
    return Row(number, text, "", kept[0], nbytes, kept[1])


def _kept(values: dict, from_bytes: bool) -> tuple[dict, int]:
    """--keep-fields' values, each one that is not valid UTF-8 escaped -> (them, how many were)."""
    out, count = {}, 0
    for k, v in values.items():
        out[k], n = escaped(v, from_bytes)
        count += n > 0
    return out, count


class Input:
    """One input (a file or stdin) in a format; `rows()` streams it, `progress()` says how far it is."""

    def __init__(self, path: str, kind: str, text_field: str, keep_fields: list[str]) -> None:
        self.path, self.kind, self.text_field, self.keep = path, kind, text_field, keep_fields
        self.size: int | None = None  # bytes (a file) or rows (Parquet); None for stdin
        self._stream: Counted | None = None
        self._rows_read = 0
        self._digest = self._base = hashlib.sha256()
        self.said: str | None = None  # the text column chosen, in words (app.common.text.text_column)
        if path != "-":
            p = Path(path)
            if not p.is_file():
                raise UserError(f"--input {p}: no such file")
            self.size = p.stat().st_size
        self.kept_types: dict[str, object] = {}  # Parquet: the --keep-fields' arrow types
        self._check_fields()

    def describe(self) -> str:
        return "stdin" if self.path == "-" else self.path

    def identity(self) -> dict:
        """What a rerun checks before it reads: the file's path (each part's digest says the rest)."""
        return {"path": "-" if self.path == "-" else str(Path(self.path).resolve())}

    def progress(self) -> float | None:
        """The share of the input read so far (None: stdin)."""
        if self.size is None:
            return None
        done = self._rows_read if self.kind == "parquet" else (self._stream.count if self._stream else 0)
        return min(1.0, done / self.size) if self.size else 1.0

    def take_digest(self) -> str:
        """The digest of the bytes of the rows read since the last call (and of a CSV's header)."""
        out = self._digest.hexdigest()
        self._digest = self._base.copy()
        return out

    def _binary(self) -> io.BufferedReader:
        stream, self._stream = open_input(self.path)
        return stream

    # ---- the columns, checked before any work

    def _check_fields(self) -> None:
        """The text column (chosen by app.common.text.text_column where `text` is not one) and the columns
        a CSV, JSONL or Parquet file must have, checked before any work (stdin's header comes with its
        rows)."""
        if self.kind == "lines":
            if self.keep:
                raise UserError("--keep-fields: plain-text lines have no fields")
            return
        if self.path == "-":
            return
        columns, sample = self._sample()
        self.text_field, self.said = text_column(self.text_field, columns, sample, self.keep)
        if self.kind != "jsonl":  # a JSON line without the key is a bad row, not an unreadable file
            self._need(columns)

    def _sample(self) -> tuple[list[str], dict[str, list]]:
        """The file's columns and its first SAMPLE_ROWS rows' values of each."""
        if self.kind == "parquet":
            return self._parquet_sample()
        stream = self._binary()
        try:
            with reading(self.path):
                if self.kind == "csv":
                    return self._csv_sample(stream)
                rows = [self._json_object(raw) for raw, _ in zip(stream, range(SAMPLE_ROWS))]
        finally:
            stream.close()
        columns = list(dict.fromkeys(k for r in rows if r for k in r))
        return columns, {c: [r.get(c) for r in rows if r] for c in columns}

    def _csv_sample(self, stream) -> tuple[list[str], dict[str, list]]:
        reader = csv.reader(line.decode("utf-8", "surrogateescape") for line in lines(stream, lambda _: None))
        try:
            header = next(reader, None) or []
            rows = [rec for rec, _ in zip(reader, range(SAMPLE_ROWS))]
        except csv.Error as e:
            line = reader.line_num
            raise UserError(
                f"--input {self.path}: line {line}: not CSV the reader can follow ({e})"
            ) from None
        return header, {c: [r[i] for r in rows if i < len(r)] for i, c in enumerate(header)}

    def _parquet_sample(self) -> tuple[list[str], dict[str, list]]:
        import pyarrow.parquet as pq

        try:
            f = pq.ParquetFile(self.path)
            schema = f.schema_arrow
            first = next(f.iter_batches(batch_size=SAMPLE_ROWS), None)
        except Exception as e:  # pyarrow raises several kinds for a file that is not Parquet
            raise UserError(f"--input {self.path}: cannot read it as Parquet ({e})") from None
        self.size = f.metadata.num_rows
        self.kept_types = {k: schema.field(k).type for k in self.keep if k in schema.names}
        return list(schema.names), first.to_pydict() if first is not None else {}

    @staticmethod
    def _json_object(raw: bytes) -> dict | None:
        try:
            obj = json.loads(raw)
        except ValueError:
            return None
        return obj if isinstance(obj, dict) else None

    def _need(self, columns: list[str]) -> None:
        for name, flag in ((self.text_field, "--text-field"), *((k, "--keep-fields") for k in self.keep)):
            if name not in columns:
                raise UserError(
                    f"--input {self.describe()}: no column {name!r} ({flag}); columns: {', '.join(columns)}"
                )

    # ---- the rows

    def rows(self) -> Iterator[Row]:
        reader = {"csv": self._csv, "jsonl": self._jsonl, "lines": self._lines, "parquet": self._parquet}
        self._digest = self._base = hashlib.sha256()
        try:
            with reading(self.path, lambda: f" after its row {self._rows_read}"):
                for row in reader[self.kind]():
                    self._rows_read += 1
                    yield row
        finally:
            if self._stream is not None and self.path != "-":
                self._stream.close()

    def _lines(self) -> Iterator[Row]:
        for number, raw in enumerate(lines(self._binary(), self._add), start=1):
            line = raw.rstrip(b"\n").rstrip(b"\r")
            try:
                text = line.decode("utf-8")
            except UnicodeDecodeError:
                yield Row(number, None, "invalid UTF-8")
                continue
            yield _checked(text, "", number, ({}, 0))

    def _add(self, data: bytes) -> None:
        """Bytes read for the rows: into the digest `take_digest` hands out next."""
        self._digest.update(data)

    def _jsonl(self) -> Iterator[Row]:
        for number, raw in enumerate(lines(self._binary(), self._add), start=1):
            if number == 1 and raw.lstrip().startswith(b"["):
                raise UserError(
                    f"--input {self.describe()}: a JSON array; classify reads JSON Lines (one object a line)"
                )
            try:
                obj = json.loads(raw)
            except UnicodeDecodeError:
                yield Row(number, None, "invalid UTF-8")
                continue
            except ValueError as e:
                yield Row(
                    number, None, "an empty line" if not raw.strip() else f"not JSON ({getattr(e, 'msg', e)})"
                )
                continue
            if not isinstance(obj, dict):
                yield Row(number, None, f"a JSON {type(obj).__name__}, not an object")
                continue
            kept = _kept({k: obj.get(k) for k in self.keep}, from_bytes=False)
            yield _checked(obj.get(self.text_field), self.text_field, number, kept)

    def _csv(self) -> Iterator[Row]:
        csv.field_size_limit(2**31 - 1)  # a long text is one field
        text = (line.decode("utf-8", "surrogateescape") for line in lines(self._binary(), self._add))
        reader = csv.reader(text)
        try:
            header = next(reader, None)
            if header is None:
                return
            self._base = self._digest.copy()  # the header: part of every chunk's digest
            self._need(header)
            at = header.index(self.text_field)
            keep = [header.index(k) for k in self.keep]
            for number, rec in enumerate(reader, start=1):
                kept = _kept({k: rec[i] if i < len(rec) else None for k, i in zip(self.keep, keep)}, True)
                if len(rec) != len(header):
                    yield Row(number, None, f"{len(rec)} fields, the header has {len(header)}", *kept)
                    continue
                yield _checked(rec[at], self.text_field, number, kept)
        except csv.Error as e:
            raise UserError(
                f"--input {self.describe()}: line {reader.line_num}: not CSV the reader can follow ({e})"
            ) from None

    def _parquet(self) -> Iterator[Row]:
        import pyarrow.parquet as pq

        number, columns = 0, list(dict.fromkeys([self.text_field, *self.keep]))
        for batch in pq.ParquetFile(self.path).iter_batches(batch_size=4096, columns=columns):
            cols = batch.to_pydict()
            for i, text in enumerate(cols[self.text_field]):
                number += 1
                kept = {k: cols[k][i] for k in self.keep}
                self._digest.update(json.dumps([text, kept], default=str).encode() + b"\n")
                yield _checked(text, self.text_field, number, (kept, 0))
