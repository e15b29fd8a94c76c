"""Text as people save it: a byte-order mark, bytes that are not UTF-8, a text column not named `text`.

Every reader of a handed text file (classify's and transfer's inputs, evaluate --text, generate --prompts,
data_prep's readers) drops a UTF-8 byte-order mark (Notepad and PowerShell write one) before the first
line, so line 1 reads as the same sentence on line 2 would. A value we copy from an input to an output
that is not valid UTF-8 is written escaped (`escaped`), never refused and never a traceback. The column a
text is read from is chosen by one rule (`text_column`), for app/classify.py and app/transfer.py alike.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

BOM = b"\xef\xbb\xbf"  # UTF-8's byte-order mark
DEFAULT_TEXT_FIELD = "text"
SAMPLE_ROWS = 100  # rows `text_column` looks at to tell a text column from a number or a flag
_NOT_TEXT = re.compile(r"\s*([-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?|true|false|nan|inf|)\s*", re.IGNORECASE)


def without_bom(data: bytes) -> bytes:
    return data[len(BOM) :] if data.startswith(BOM) else data


def escaped(value: object, from_bytes: bool) -> tuple[object, int]:
    """`value` (a str, or JSON's lists and objects of them) with every lone surrogate written as text ->
    (the value, how many strings were escaped). `from_bytes`: the surrogates stand for bytes that were not
    UTF-8 (Python's surrogateescape, a CSV or text line), written `\\xNN`; else they are a JSON file's own
    `\\udXXX` escapes of no character, written `\\uXXXX` as the file had them."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
            return value, 0
        except UnicodeEncodeError:
            return "".join(_escape_char(c, from_bytes) for c in value), 1
    if isinstance(value, list):
        parts = [escaped(v, from_bytes) for v in value]
        return [v for v, _ in parts], sum(n for _, n in parts)
    if isinstance(value, dict):
        out, count = {}, 0
        for k, v in value.items():
            (k2, a), (v2, b) = escaped(k, from_bytes), escaped(v, from_bytes)
            out[k2], count = v2, count + a + b
        return out, count
    return value, 0


def _escape_char(c: str, from_bytes: bool) -> str:
    code = ord(c)
    if not 0xD800 <= code <= 0xDFFF:
        return c
    if from_bytes and 0xDC80 <= code <= 0xDCFF:
        return f"\\x{code - 0xDC00:02x}"
    return f"\\u{code:04x}"


def is_text(values: Sequence[object]) -> bool:
    """A column's values hold text: strings, some of them more than a number, a true/false or blank."""
    strings = [v for v in values if v is not None]
    return (
        bool(strings)
        and all(isinstance(v, str) for v in strings)
        and any(not _NOT_TEXT.fullmatch(v) for v in strings)
    )


def text_column(
    asked: str, columns: Sequence[str], sample: Mapping[str, Sequence[object]], taken: Sequence[str]
) -> tuple[str, str | None]:
    """The column to read texts from -> (its name, the line that says it was chosen, or None).

    `asked` (--text-field) when the input has it or the user named it; where it is the default `text` and
    the input has no such column, its one column of text (`is_text` on the `sample` of its first rows)
    besides the ones `taken` for something else (the labels, the --keep-fields): GLUE's and SST's
    `sentence`. None or several to choose from: `asked`, which the caller refuses naming the columns."""
    if asked in columns or asked != DEFAULT_TEXT_FIELD:
        return asked, None
    texts = [c for c in columns if c not in taken and is_text(sample.get(c, ()))]
    if len(texts) != 1:
        return asked, None
    besides = f" besides {', '.join(repr(c) for c in taken)}" if taken else ""
    return texts[0], f"--text-field: no column 'text'; reading {texts[0]!r}, its one column of text{besides}"
