"""The texts to classify, streamed: one row at a time from a CSV, JSON Lines, Parquet or plain-text file
(.gz/.xz/.zst read as streams) or stdin, so a 10 GB input never sits in memory.

Every input record is a row, numbered from 1 (CSV: the data rows after the header; JSONL and plain text:
the lines; Parquet: its rows). A row whose text cannot be classified is a bad row, yielded with the reason
(never dropped unsaid): an empty text, a missing or non-text field, a line that is not a JSON object,
invalid UTF-8, a CSV record with another number of fields than the header. What makes the whole input
unreadable (no such file, no --text-field column, a CSV the parser cannot follow) is one UserError line.
"""

from __future__ import annotations

import csv
import io
import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from app.common.errors import UserError

COMPRESSED = (".gz", ".xz", ".zst")


@dataclass(slots=True)
class Row:
    number: int  # 1-based row of the input
    text: str | None  # None: a bad row
    problem: str = ""  # why it is bad
    kept: dict = field(default_factory=dict)  # --keep-fields' values
    nbytes: int = 0  # the text's UTF-8 bytes


class _Counted(io.RawIOBase):
    """A binary stream that counts the bytes read from it (the input's progress, compressed or not)."""

    def __init__(self, raw) -> None:
        self.raw, self.count = raw, 0

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        n = self.raw.readinto(b)
        self.count += n or 0
        return n

    def close(self) -> None:
        self.raw.close()
        super().close()


def _decompressed(raw, suffix: str):
    if suffix == ".gz":
        import gzip

        return gzip.GzipFile(fileobj=raw)
    if suffix == ".xz":
        import lzma

        return lzma.LZMAFile(raw)
    if suffix == ".zst":
        import zstandard

        return zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True)
    return raw


def _checked(text: object, field_name: str, number: int, kept: dict) -> Row:
    """A text value -> a Row, bad when it is not a non-empty string of valid UTF-8."""
    if text is None:
        return Row(number, None, f"no {field_name!r}" if field_name else "no text", kept)
    if not isinstance(text, str):
        return Row(number, None, f"{field_name!r} is {type(text).__name__}, not text", kept)
    try:
        nbytes = len(text.encode("utf-8"))
    except UnicodeEncodeError:  # surrogateescape's stand-ins for bytes that are not UTF-8
        return Row(number, None, "invalid UTF-8", kept)
    if not text.strip():
        return Row(number, None, "empty text", kept)
    return Row(number, text, "", kept, nbytes)


class Input:
    """One input (a file or stdin) in a format; `rows()` streams it, `progress()` says how far it is."""

    def __init__(self, path: str, kind: str, text_field: str, keep_fields: list[str]) -> None:
        self.path, self.kind, self.text_field, self.keep = path, kind, text_field, keep_fields
        self.size: int | None = None  # bytes (a file) or rows (Parquet); None for stdin
        self._stream: _Counted | None = None
        self._rows_read = 0
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
        """What a rerun checks to continue from the parts: the file's path, size and modification time."""
        if self.path == "-":
            return {"path": "-"}
        st = Path(self.path).stat()
        return {"path": str(Path(self.path).resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns}

    def progress(self) -> float | None:
        """The share of the input read so far (None: stdin)."""
        if self.size is None:
            return None
        done = self._rows_read if self.kind == "parquet" else (self._stream.count if self._stream else 0)
        return min(1.0, done / self.size) if self.size else 1.0

    def _binary(self):
        raw = sys.stdin.buffer if self.path == "-" else open(self.path, "rb")  # noqa: SIM115 - closed by rows()
        self._stream = _Counted(raw)
        suffix = Path(self.path).suffix.lower() if self.path != "-" else ""
        return io.BufferedReader(_decompressed(io.BufferedReader(self._stream), suffix), 1 << 20)

    def _check_fields(self) -> None:
        """The columns a CSV or Parquet input must have, checked before any work."""
        if self.kind == "lines" and self.keep:
            raise UserError("--keep-fields: plain-text lines have no fields")
        if self.kind == "csv" and self.path != "-":  # stdin's header is read with its rows
            stream = self._binary()
            try:
                reader = csv.reader(io.TextIOWrapper(stream, "utf-8-sig", "surrogateescape", newline=""))
                header = next(reader, None)
            except csv.Error as e:
                raise UserError(f"--input {self.path}: line 1: not CSV the reader can follow ({e})") from None
            finally:
                stream.close()
            if header is not None:
                self._need(header)
        if self.kind == "parquet":
            import pyarrow.parquet as pq

            try:
                schema = pq.ParquetFile(self.path).schema_arrow
            except Exception as e:  # pyarrow raises several kinds for a file that is not Parquet
                raise UserError(f"--input {self.path}: cannot read it as Parquet ({e})") from None
            self.size = pq.ParquetFile(self.path).metadata.num_rows
            self._need(list(schema.names))
            self.kept_types = {k: schema.field(k).type for k in self.keep}

    def _need(self, columns: list[str]) -> None:
        for name, flag in ((self.text_field, "--text-field"), *((k, "--keep-fields") for k in self.keep)):
            if name not in columns:
                raise UserError(
                    f"--input {self.describe()}: no column {name!r} ({flag}); columns: {', '.join(columns)}"
                )

    def rows(self) -> Iterator[Row]:
        reader = {"csv": self._csv, "jsonl": self._jsonl, "lines": self._lines, "parquet": self._parquet}
        try:
            for row in reader[self.kind]():
                self._rows_read += 1
                yield row
        finally:
            if self._stream is not None and self.path != "-":
                self._stream.close()

    def _lines(self) -> Iterator[Row]:
        for number, raw in enumerate(self._binary(), start=1):
            line = raw.rstrip(b"\n").rstrip(b"\r")
            try:
                text = line.decode("utf-8")
            except UnicodeDecodeError:
                yield Row(number, None, "invalid UTF-8")
                continue
            yield _checked(text, "", number, {})

    def _jsonl(self) -> Iterator[Row]:
        for number, raw in enumerate(self._binary(), start=1):
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
            kept = {k: obj.get(k) for k in self.keep}
            yield _checked(obj.get(self.text_field), self.text_field, number, kept)

    def _csv(self) -> Iterator[Row]:
        csv.field_size_limit(2**31 - 1)  # a long text is one field
        text = io.TextIOWrapper(self._binary(), encoding="utf-8-sig", errors="surrogateescape", newline="")
        reader = csv.reader(text)
        try:
            header = next(reader, None)
            if header is None:
                return
            self._need(header)
            at = header.index(self.text_field)
            keep = [header.index(k) for k in self.keep]
            for number, rec in enumerate(reader, start=1):
                kept = {k: rec[i] if i < len(rec) else None for k, i in zip(self.keep, keep)}
                if len(rec) != len(header):
                    yield Row(number, None, f"{len(rec)} fields, the header has {len(header)}", kept)
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
                yield _checked(text, self.text_field, number, {k: cols[k][i] for k in self.keep})
