"""Streaming readers: one input file -> records ``(text | None, reason, line)``, holding a bounded piece at a time.

Plain text and JSON are read by hand, not by ``datasets``' ``text``/``json`` builders: the text builder
holds a whole file as one Arrow string (a file over 2 GB cannot even be one) or loses paragraph
structure line by line, and the JSON builder fails a whole file on one malformed line, where we skip
and count that line with its number. Both read ``.gz``/``.xz``/``.zst`` through the stdlib/zstandard
stream decoders. CSV/TSV (``csv_rows``, which picks the reader) and Parquet go through
``datasets.load_dataset(..., streaming=True)``.

Text is decoded as UTF-8 with replacement characters, a byte-order mark at its start dropped (as the CSV
reader's ``utf-8-sig`` does); the first invalid byte of a file is reported
(line, byte offset) through ``Utf8State``. Line ends are normalised as Python's universal newlines
do (``\\r\\n`` and ``\\r`` become ``\\n``), as the ``text`` builder did before.
"""

from __future__ import annotations

import gzip
import io
import json
import lzma
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from app.common.text import BOM
from data_prep.errors import UserError

COMPRESSIONS = (".gz", ".xz", ".zst")
# A document (file, paragraph or line) longer than this is cut at a line boundary (or, for one longer
# line, at this size) into parts that are tokenized, hashed and split as separate units: what bounds
# memory per document. Changing it changes the output, so it is a constant, not a flag.
PART_CHARS = 1 << 20
CHUNK_BYTES = 1 << 20  # read size; lines are completed past it, so chunks end at a line end
Record = tuple[str | None, str, int, bool]  # (text, skip reason or "", first line, ends the document)


@dataclass(slots=True)
class Utf8State:
    """Where a file first had invalid UTF-8 (None if nowhere), and where its compressed stream broke off."""

    first_bad: tuple[int, int] | None = None  # (line, byte offset)
    # (line, why): a .gz/.xz/.zst file truncated or corrupt there; the lines before it are kept (whole
    # lines only: the read that failed is dropped), the file is counted and named, the prep goes on
    broken_at: tuple[int, str] | None = None


class _ZstdFrames(io.RawIOBase):
    """A .zst file's frames decompressed one after another. zstandard's ``stream_reader`` ends a file cut
    inside a frame as if it were complete (a short read, no error); this raises EOFError there."""

    def __init__(self, path: Path) -> None:
        import zstandard

        self._new = zstandard.ZstdDecompressor().decompressobj
        self._raw = open(path, "rb")  # noqa: SIM115 - closed with the reader
        self._dobj = self._new()
        self._out, self._pos, self._in_frame = b"", 0, False

    def readable(self) -> bool:
        return True

    def close(self) -> None:
        self._raw.close()
        super().close()

    def readinto(self, b) -> int:
        while self._pos == len(self._out):
            data = self._raw.read(1 << 16)
            if not data:
                if self._in_frame:
                    raise EOFError("the file ends inside a zstd frame (truncated)")
                return 0
            parts = []
            while data:  # a frame may end inside this read: the rest starts the next one
                self._in_frame = True
                parts.append(self._dobj.decompress(data))
                data = b""
                if self._dobj.eof:
                    data, self._dobj, self._in_frame = self._dobj.unused_data, self._new(), False
            self._out, self._pos = b"".join(parts), 0
        n = min(len(b), len(self._out) - self._pos)
        b[:n] = self._out[self._pos : self._pos + n]
        self._pos += n
        return n


def open_binary(path: Path) -> io.BufferedIOBase:
    """The file's decompressed bytes as a stream; raises UserError if it cannot be opened."""
    suffix = path.suffix.lower()
    try:
        if suffix == ".gz":
            return gzip.open(path, "rb")  # type: ignore[return-value]
        if suffix == ".xz":
            return lzma.open(path, "rb")  # type: ignore[return-value]
        if suffix == ".zst":
            return io.BufferedReader(_ZstdFrames(path), 1 << 20)
        return open(path, "rb")
    except OSError as exc:
        raise UserError(f"{path}: cannot read file ({exc.strerror or exc})") from exc


def _incomplete_tail(data: bytes) -> int:
    """Bytes at the end of ``data`` that start a UTF-8 sequence not yet complete (0..3)."""
    for back in range(1, min(4, len(data)) + 1):
        b = data[-back]
        if b & 0xC0 != 0x80:  # a lead (or ASCII) byte
            need = 2 if b >> 5 == 0b110 else 3 if b >> 4 == 0b1110 else 4 if b >> 3 == 0b11110 else 1
            return back if need > back else 0
    return 0


def iter_chunks(path: Path, utf8: Utf8State) -> Iterator[tuple[str, int]]:
    """(text, line number of its first character): the file decoded in pieces of about CHUNK_BYTES that
    end at a line end (unless one line is longer than 2 * CHUNK_BYTES), newlines normalised."""
    f = open_binary(path)
    lineno, offset, carry, cr_pending = 1, 0, b"", False
    try:
        while True:
            try:
                raw = f.read(CHUNK_BYTES)
                if raw and not raw.endswith(b"\n"):
                    raw += f.readline(CHUNK_BYTES)  # finish the line, within bounds
            except Exception as exc:
                if not _broken_stream(path, exc):
                    raise UserError(f"{path}: cannot read file near line {lineno} ({exc})") from exc
                utf8.broken_at = (lineno, str(exc) or type(exc).__name__)
                raw = b""  # the text so far is kept, as of a file that ended here
            eof = not raw
            data = carry + raw
            if offset == 0 and not carry and data.startswith(BOM):  # Notepad's byte-order mark: no text
                data, offset = data[len(BOM) :], len(BOM)
            cut = len(data) if eof or data.endswith(b"\n") else len(data) - _incomplete_tail(data)
            data, carry = data[:cut], data[cut:]
            if data:
                try:
                    text = data.decode("utf-8")
                except UnicodeDecodeError as exc:
                    if utf8.first_bad is None:
                        utf8.first_bad = (lineno + data.count(b"\n", 0, exc.start), offset + exc.start)
                    text = data.decode("utf-8", errors="replace")
                offset += len(data)
                if cr_pending and text.startswith("\n"):
                    text = text[1:]  # the \n of a \r\n split across two reads
                cr_pending = text.endswith("\r")
                if "\r" in text:
                    text = text.replace("\r\n", "\n").replace("\r", "\n")
                if text:
                    yield text, lineno
                    lineno += text.count("\n")
            if eof:
                return
    finally:
        f.close()


def _broken_stream(path: Path, exc: Exception) -> bool:
    """A compressed file that is truncated or corrupt (not a disk or permission error: those refuse)."""
    if path.suffix.lower() not in COMPRESSIONS:
        return False
    return isinstance(exc, (EOFError, lzma.LZMAError, gzip.BadGzipFile)) or type(exc).__name__ == "ZstdError"


def iter_lines(path: Path, utf8: Utf8State) -> Iterator[tuple[str, int, bool]]:
    """(text, line number, complete) for each line without its newline; a line longer than PART_CHARS
    comes in several pieces, all but the last with ``complete`` False."""
    partial, first = "", 1
    for text, lineno in iter_chunks(path, utf8):
        lines = text.split("\n")
        if partial:
            lines[0] = partial + lines[0]
            lineno = first
        for i in range(len(lines) - 1):
            yield lines[i], lineno + i, True
        partial, first = lines[-1], lineno + len(lines) - 1
        if len(partial) >= PART_CHARS:
            yield partial, first, False
            partial = ""
    if partial:
        yield partial, first, False


class _Parts:
    """Accumulates one document's text; hands out parts of about PART_CHARS characters. A full part is
    held back until more text follows, so a document never ends in a part of only whitespace."""

    def __init__(self) -> None:
        self.pieces: list[str] = []
        self.size = 0
        self.first = 0
        self.held: tuple[str, int] | None = None

    def add(self, text: str, lineno: int) -> Iterator[Record]:
        if not self.pieces:
            self.first = lineno
        self.pieces.append(text)
        self.size += len(text)
        if self.size >= PART_CHARS:
            if self.held is not None:
                yield self.held[0], "", self.held[1], False
            self.held = ("".join(self.pieces), self.first)
            self.pieces, self.size = [], 0

    def end(self) -> Iterator[Record]:
        """The document ends here (nothing is yielded if it never started)."""
        text = "".join(self.pieces)
        if self.held is not None:
            if text.strip():
                yield self.held[0], "", self.held[1], False
                yield text, "", self.first, True
            else:
                yield self.held[0] + text, "", self.held[1], True
        elif self.pieces:
            yield text, "", self.first, True
        self.pieces, self.size, self.held = [], 0, None


_PARAGRAPH_BREAK = re.compile(r"\n(?:[ \t\r\f\v]*\n)+")


def text_records(path: Path, doc_split: str, utf8: Utf8State) -> Iterator[Record]:
    """Documents of a plain-text file: the whole file (its newlines kept), blank-line paragraphs, or lines;
    parts of about PART_CHARS characters (cut at line ends) for longer ones."""
    if doc_split == "line":
        doc = _Parts()
        for text, lineno, complete in iter_lines(path, utf8):
            if complete and doc.held is None and not doc.pieces:
                yield text, "", lineno, True  # the common case, without the accumulator
                continue
            yield from doc.add(text, lineno)
            if complete:
                yield from doc.end()
        yield from doc.end()
        return
    if doc_split == "file":
        doc, seen = _Parts(), False
        for text, lineno in iter_chunks(path, utf8):
            seen = True
            yield from doc.add(text, lineno)
        if not seen:
            yield "", "", 1, True  # an empty file is one (empty, skipped) document
        yield from doc.end()
        return
    # paragraph: the text between runs of whitespace-only lines (as one regex split of the whole file);
    # the text after a chunk's last break is carried into the next chunk, where the break may complete
    doc, carry, line, emitted = _Parts(), "", 1, False
    for text, lineno in iter_chunks(path, utf8):
        text, start = carry + text, 0
        lineno = line if carry else lineno
        for m in _PARAGRAPH_BREAK.finditer(text):
            yield from doc.add(text[start : m.start()], lineno)
            yield from doc.end()
            emitted = True
            lineno += text.count("\n", start, m.end())
            start = m.end()
        carry, line = text[start:], lineno
        if len(carry) >= PART_CHARS:  # a paragraph longer than a part: hand over all but its trailing blanks
            i = len(carry.rstrip("\n \t\r\f\v"))
            yield from doc.add(carry[:i], line)
            line += carry.count("\n", 0, i)
            carry = carry[i:]
    tail = carry.rstrip("\n")
    if doc.pieces or doc.held is not None or tail.strip() or not emitted:
        if tail or not emitted:
            yield from doc.add(tail, line)
        yield from doc.end()


_MALFORMED = object()


def _check_row(obj: object, text_field: str) -> tuple[str | None, str]:
    if obj is _MALFORMED:
        return None, "malformed_json"
    if not isinstance(obj, dict):
        return None, "not_an_object"
    if text_field not in obj:
        return None, "missing_text_field"
    value = obj[text_field]
    if value is None:
        return None, "null_text"
    if not isinstance(value, str):
        return None, "non_string_text"
    return value, ""


def json_records(path: Path, text_field: str, utf8: Utf8State, parse: bool = True) -> Iterator[Record]:
    """JSON Lines rows (blank lines ignored), or the elements of one top-level JSON array.

    ``parse=False`` hands JSON Lines rows on unparsed (reason ``UNPARSED``) for ``parse_row`` in a
    worker process: parsing was the largest cost left in the parent of the encode pass."""
    lines = iter_lines(path, utf8)
    for text, lineno, complete in lines:
        if not text.strip() and complete:
            continue
        if text.lstrip().startswith("["):
            yield from _json_array(text, lineno, complete, lines, text_field)
            return
        yield from _jsonl_row(text, lineno, complete, lines, text_field, parse)
        break
    for text, lineno, complete in lines:
        if not text.strip() and complete:
            continue
        yield from _jsonl_row(text, lineno, complete, lines, text_field, parse)


UNPARSED = "unparsed"  # the reason of a JSON Lines row handed on as its raw text (parse=False)


def parse_row(row: str, text_field: str) -> tuple[str | None, str]:
    """(text, "") of one JSON Lines row, or (None, skip reason)."""
    try:
        obj = json.loads(row)
    except json.JSONDecodeError:
        obj = _MALFORMED
    return _check_row(obj, text_field)


def _jsonl_row(text, lineno, complete, lines, text_field, parse) -> Iterator[Record]:
    pieces = [text]
    while not complete:  # one JSON row longer than PART_CHARS: it has to be parsed whole
        nxt = next(lines, None)
        if nxt is None:
            break
        text, _, complete = nxt
        pieces.append(text)
    row = "".join(pieces)
    if not parse:
        yield row, UNPARSED, lineno, True
        return
    value, reason = parse_row(row, text_field)
    yield value, reason, lineno, True


def _json_array(text, lineno, complete, lines, text_field) -> Iterator[Record]:
    """Elements of a JSON array, decoded one at a time from a buffer refilled line by line; a syntax
    error ends the file with one malformed_json record (the elements before it are kept)."""
    decoder = json.JSONDecoder()
    buf = text[text.index("[") + 1 :] + ("\n" if complete else "")
    line_of_buf = lineno  # line number at buf[0]
    exhausted = False
    expect_value = True

    def refill() -> bool:
        nonlocal buf, exhausted
        for t, _, c in lines:
            buf += t + ("\n" if c else "")
            return True
        exhausted = True
        return False

    while True:
        stripped = buf.lstrip()
        line_of_buf += buf.count("\n", 0, len(buf) - len(stripped))
        buf = stripped
        if not buf:
            if refill():
                continue
            yield None, "malformed_json", line_of_buf, True  # the array never closed
            return
        if buf[0] == "]" and expect_value is not None:
            return
        if buf[0] == "," and not expect_value:
            buf, expect_value = buf[1:], True
            continue
        try:
            obj, end = decoder.raw_decode(buf)
        except json.JSONDecodeError:
            if not exhausted and refill():
                continue  # probably cut mid-value: read on (bounded by the value's own size)
            yield None, "malformed_json", line_of_buf, True
            return
        if not expect_value:
            yield None, "malformed_json", line_of_buf, True
            return
        if end == len(buf) and not exhausted and refill():
            continue  # a number or literal may continue in the next line
        value, reason = _check_row(obj, text_field)
        yield value, reason, line_of_buf, True
        line_of_buf += buf.count("\n", 0, end)
        buf, expect_value = buf[end:], False


def table_records(builder: str, path: Path, text_field: str, first_line: int, **kwargs) -> Iterator[Record]:
    """Rows of a CSV/TSV or Parquet file through ``datasets``' streaming builders, a batch at a time."""
    import datasets

    where = str(path)
    try:
        ds = datasets.load_dataset(builder, data_files=[str(path)], split="train", streaming=True, **kwargs)
        line = first_line
        for batch in ds.iter(batch_size=1000):
            if text_field not in batch:
                raise UserError(
                    f"{where}: no column {text_field!r} (columns: {', '.join(batch)}); pick one with --text-field"
                )
            for value in batch[text_field]:
                if value is None:
                    yield None, "null_text", line, True
                elif not isinstance(value, str):
                    yield None, "non_string_text", line, True
                else:
                    yield value, "", line, True
                line += 1
    except UserError:
        raise
    except Exception as exc:
        raise UserError(f"{where}: cannot load as {builder}: {_last_line(exc)}") from exc


def _last_line(exc: BaseException) -> str:
    msg = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
    cause = exc.__cause__ or exc.__context__
    if cause is not None and str(cause).strip():
        msg = str(cause).strip().splitlines()[-1]
    return msg
