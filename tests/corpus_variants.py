"""The public-domain novels in tests/fixtures/corpora and the input variants data prep tests read them as.

    write_variants(out) -> {"botchan.txt", "botchan_paragraphs.txt", "wagahaiwa.txt", "rows.jsonl": path}

The English book as it ships (UTF-8 BOM, CRLF, no blank lines); the same lines grouped 6 to a paragraph
with CRLF blank lines between (Windows text with paragraphs); the Japanese book (very long lines); and
paragraph-sized rows of both ({"id", "text", "lang"}) as JSONL, English paragraphs first.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

CORPORA = Path(__file__).resolve().parent / "fixtures" / "corpora"
BOOK = CORPORA / "botchan.txt"
JAPANESE = CORPORA / "wagahaiwa_nekodearu.txt"


def nonblank_lines(raw: bytes) -> list[str]:
    """The text's non-blank lines, without BOM or line ends."""
    text = raw.decode("utf-8").lstrip("\ufeff").replace("\r\n", "\n")
    return [line for line in text.split("\n") if line.strip()]


def write_variants(out: Path) -> dict[str, Path]:
    out.mkdir(parents=True, exist_ok=True)
    en_lines, ja_lines = nonblank_lines(BOOK.read_bytes()), nonblank_lines(JAPANESE.read_bytes())
    paragraphs = ["\n".join(en_lines[i : i + 6]) for i in range(0, len(en_lines), 6)]
    paths = {
        name: out / name for name in ("botchan.txt", "botchan_paragraphs.txt", "wagahaiwa.txt", "rows.jsonl")
    }
    shutil.copyfile(BOOK, paths["botchan.txt"])
    shutil.copyfile(JAPANESE, paths["wagahaiwa.txt"])
    crlf = "\r\n\r\n".join(p.replace("\n", "\r\n") for p in paragraphs)
    paths["botchan_paragraphs.txt"].write_bytes(crlf.encode("utf-8"))
    rows = [{"text": p, "lang": "en"} for p in paragraphs] + [{"text": t, "lang": "ja"} for t in ja_lines]
    with open(paths["rows.jsonl"], "w", encoding="utf-8") as f:
        for i, row in enumerate(rows):
            f.write(json.dumps({"id": i, **row}, ensure_ascii=False) + "\n")
    return paths
