"""Records -> documents: splitting plain text, parsing JSON records, and the skip rules.

A record is skipped (and counted under its reason) when it is:

* ``empty``: empty or whitespace-only text;
* ``nul_bytes``: contains NUL characters (binary data, or a mangled file);
* ``malformed_json``: a JSON line (or whole JSON-array file) that does not parse;
* ``not_an_object``: valid JSON that is not an object (so it has no fields);
* ``missing_text_field`` / ``null_text`` / ``non_string_text``: the ``--text-field`` value is absent,
  null, or not a string.

Documents with invalid UTF-8 are kept, decoded with U+FFFD replacement, and counted as ``repaired``.
Each kept document gets a content hash (``doc_id``), its split coordinate ``u`` in [0, 1) (a keyed
hash of the content with ``--seed``; see ``splits``) and its UTF-8 byte count.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

SKIP_REASONS = (
    "empty",
    "nul_bytes",
    "malformed_json",
    "not_an_object",
    "missing_text_field",
    "null_text",
    "non_string_text",
)
_PARAGRAPH_BREAK = re.compile(r"\n(?:[ \t\r\f\v]*\n)+")


def _split_text(text: str, doc_split: str) -> list[tuple[str, int]]:
    """(document, first line number) pieces of one file's text."""
    if doc_split == "file":
        return [(text, 1)]
    if doc_split == "line":
        lines = text.split("\n")
        if lines and lines[-1] == "":
            lines.pop()  # the newline ending the file does not start another line
        return [(line, i) for i, line in enumerate(lines, 1)]
    out, start, lineno = [], 0, 1
    for m in _PARAGRAPH_BREAK.finditer(text):
        out.append((text[start : m.start()], lineno))
        lineno += text.count("\n", start, m.end())
        start = m.end()
    tail = text[start:]
    if tail.strip() or not out:
        out.append((tail.rstrip("\n"), lineno))
    return out


def _json_records(text: str, text_field: str) -> list[tuple[str | None, str, int]]:
    """(text, reason, line) for each JSON Lines row, or each element of a top-level JSON array."""
    if text.lstrip().startswith("["):
        try:
            items = json.loads(text)
        except json.JSONDecodeError as exc:
            return [(None, "malformed_json", exc.lineno)]
        rows = [(item, 0) for item in items]
    else:
        rows = []
        for lineno, line in enumerate(text.split("\n"), 1):
            if not line.strip():
                continue  # blank lines separate nothing in JSON Lines
            try:
                rows.append((json.loads(line), lineno))
            except json.JSONDecodeError:
                rows.append((_MALFORMED, lineno))
    out: list[tuple[str | None, str, int]] = []
    for obj, lineno in rows:
        if obj is _MALFORMED:
            out.append((None, "malformed_json", lineno))
        elif not isinstance(obj, dict):
            out.append((None, "not_an_object", lineno))
        elif text_field not in obj:
            out.append((None, "missing_text_field", lineno))
        elif obj[text_field] is None:
            out.append((None, "null_text", lineno))
        elif not isinstance(obj[text_field], str):
            out.append((None, "non_string_text", lineno))
        else:
            out.append((obj[text_field], "", lineno))
    return out


_MALFORMED = object()


def _explode(
    batch: dict[str, list], *, is_json: set[int], doc_split: str, text_field: str
) -> dict[str, list]:
    out: dict[str, list[Any]] = {"text": [], "reason": [], "file": [], "line": []}
    for text, file_idx in zip(batch["text"], batch["file"]):
        if file_idx in is_json:
            records = _json_records(text, text_field)
        else:
            records = [(doc, "", line) for doc, line in _split_text(text, doc_split)]
        for doc, reason, line in records:
            out["text"].append(doc)
            out["reason"].append(reason)
            out["file"].append(file_idx)
            out["line"].append(line)
    return out


def explode_files(rows, *, is_json: set[int], doc_split: str, text_field: str, num_proc: int):
    """One row per file -> one row per document / JSON record (columns text, reason, file, line)."""
    import datasets

    features = datasets.Features(
        {
            "text": datasets.Value("string"),
            "reason": datasets.Value("string"),
            "file": datasets.Value("int32"),
            "line": datasets.Value("int32"),
        }
    )
    return rows.map(
        _explode,
        batched=True,
        batch_size=64,
        num_proc=min(num_proc, max(1, len(rows) // 64)),
        fn_kwargs={"is_json": is_json, "doc_split": doc_split, "text_field": text_field},
        remove_columns=rows.column_names,
        features=features,
        new_fingerprint=_fp(f"explode-{rows._fingerprint}-{doc_split}-{text_field}-{len(is_json)}"),
        desc="Reading documents",
    )


def _fp(key: str) -> str:
    """datasets caps fingerprints at 64 characters and appends a shard suffix with num_proc > 1: hash the key."""
    return hashlib.blake2b(key.encode(), digest_size=16).hexdigest()


def content_id(data: bytes) -> int:
    """Stable 63-bit id of a document's bytes (fits int64)."""
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little") >> 1


def split_coordinate(doc_id: int, seed: int) -> float:
    """A uniform number in [0, 1) that depends only on the content and the seed."""
    key = seed.to_bytes(8, "little")
    h = hashlib.blake2b(doc_id.to_bytes(8, "little"), digest_size=8, key=key).digest()
    return int.from_bytes(h, "little") / 2.0**64


def _clean(batch: dict[str, list], *, seed: int, bad_utf8: set[int]) -> dict[str, list]:
    n = len(batch["text"])
    out: dict[str, list[Any]] = {
        "text": [""] * n, "reason": list(batch["reason"]), "doc_id": [0] * n, "u": [0.0] * n,
        "num_bytes": [0] * n, "repaired": [False] * n, "file": batch["file"], "line": batch["line"],
    }  # fmt: skip
    for i, text in enumerate(batch["text"]):
        if out["reason"][i]:
            continue
        if text is None:
            out["reason"][i] = "null_text"
        elif not text.strip():
            out["reason"][i] = "empty"
        elif "\x00" in text:
            out["reason"][i] = "nul_bytes"
        else:
            data = text.encode("utf-8")
            doc_id = content_id(data)
            out["text"][i] = text
            out["doc_id"][i] = doc_id
            out["u"][i] = split_coordinate(doc_id, seed)
            out["num_bytes"][i] = len(data)
            out["repaired"][i] = batch["file"][i] in bad_utf8 and "\ufffd" in text
    return out


def clean(records, *, seed: int, bad_utf8: set[int], num_proc: int):
    """Apply the skip rules; every record stays (skipped ones with empty text) so reasons can be counted."""
    import datasets

    features = datasets.Features(
        {
            "text": datasets.Value("string"),
            "reason": datasets.Value("string"),
            "doc_id": datasets.Value("int64"),
            "u": datasets.Value("float64"),
            "num_bytes": datasets.Value("int64"),
            "repaired": datasets.Value("bool"),
            "file": datasets.Value("int32"),
            "line": datasets.Value("int32"),
        }
    )
    return records.map(
        _clean,
        batched=True,
        batch_size=256,
        num_proc=min(num_proc, max(1, len(records) // 256)),
        fn_kwargs={"seed": seed, "bad_utf8": bad_utf8},
        remove_columns=records.column_names,
        features=features,
        new_fingerprint=_fp(f"clean-{records._fingerprint}-{seed}"),
        desc="Checking documents",
    )
