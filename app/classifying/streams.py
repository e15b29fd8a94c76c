"""An input's bytes as a stream: a file or stdin, counted as it is read (the input's progress), decompressed
by its suffix (.gz, .bz2, .xz, .zst), a UTF-8 byte-order mark dropped, and a stream that breaks off (a
truncated or corrupt archive, a disk error) one line naming the file."""

from __future__ import annotations

import contextlib
import io
import lzma
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

from app.classifying.config import COMPRESSED
from app.common.errors import UserError
from app.common.text import BOM

_LONE_CR = re.compile(rb"(?<=\r)(?!\n)")  # after a \r that ends a line on its own (old Mac line ends)


class Counted(io.RawIOBase):
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


def compression(path: str) -> str:
    """The compression suffix of `path` ("" for none, or stdin)."""
    suffix = Path(path).suffix.lower() if path != "-" else ""
    return suffix if suffix in COMPRESSED else ""


def _decompressed(raw, suffix: str):
    if suffix == ".gz":
        import gzip

        return gzip.GzipFile(fileobj=raw)
    if suffix == ".bz2":
        import bz2

        return bz2.BZ2File(raw)
    if suffix == ".xz":
        return lzma.LZMAFile(raw)
    if suffix == ".zst":
        import zstandard

        return zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True)
    return raw


def open_input(path: str) -> tuple[io.BufferedReader, Counted]:
    """(the input's decompressed bytes, BOM dropped; the counter of the bytes read from the file itself)."""
    try:
        raw = sys.stdin.buffer if path == "-" else open(path, "rb")  # noqa: SIM115 - the caller closes it
    except OSError as e:
        raise UserError(f"--input {path}: cannot read it ({e.strerror or e})") from None
    counted = Counted(raw)
    stream = io.BufferedReader(_decompressed(io.BufferedReader(counted), compression(path)), 1 << 20)
    with reading(path):
        if stream.peek(len(BOM))[: len(BOM)] == BOM:
            stream.read(len(BOM))
    return stream, counted


def stream_errors() -> tuple[type[BaseException], ...]:
    """What a broken stream raises: a disk error, a truncated or corrupt .gz/.bz2/.xz/.zst."""
    errors: tuple[type[BaseException], ...] = (OSError, EOFError, lzma.LZMAError)
    try:
        import zstandard

        errors += (zstandard.ZstdError,)
    except ImportError:
        pass
    return errors


@contextlib.contextmanager
def reading(path: str, where: Callable[[], str] = lambda: "") -> Iterator[None]:
    """A broken stream inside is one UserError line naming the file (and `where()` in it)."""
    try:
        yield
    except stream_errors() as e:
        what = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        fmt = f"{compression(path).lstrip('.')}: " if compression(path) else ""
        raise UserError(f"--input {path}: cannot read it{where()} ({fmt}{what})") from None


def lines(stream: io.BufferedReader, add: Callable[[bytes], None]) -> Iterator[bytes]:
    """The stream's lines as bytes with their line ends (\\n, \\r\\n or a lone \\r), each handed to `add`
    (a digest's) as it is handed on."""
    for raw in stream:
        for piece in _LONE_CR.split(raw) if b"\r" in raw else (raw,):
            if piece:
                add(piece)
                yield piece
