"""Records -> documents: the skip rules, content ids and split coordinates.

A record is skipped (and counted under its reason) when it is:

* ``empty``: empty or whitespace-only text;
* ``nul_bytes``: contains NUL characters (binary data, or a mangled file);
* ``lone_surrogate``: holds a UTF-16 surrogate that is not half of a pair (valid JSON, ``"\\ud800"``, as
  scraped dumps carry from text cut mid-emoji): it has no UTF-8 form, so no token;
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
from collections.abc import Iterable, Iterator

SKIP_REASONS = (
    "empty",
    "nul_bytes",
    "lone_surrogate",
    "malformed_json",
    "not_an_object",
    "missing_text_field",
    "null_text",
    "non_string_text",
)


def content_id(data: bytes) -> int:
    """Stable 63-bit id of a document's bytes (fits int64)."""
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little") >> 1


def split_coordinate(doc_id: int, seed: int) -> float:
    """A uniform number in [0, 1) that depends only on the content and the seed."""
    key = seed.to_bytes(8, "little")
    h = hashlib.blake2b(doc_id.to_bytes(8, "little"), digest_size=8, key=key).digest()
    return int.from_bytes(h, "little") / 2.0**64


def check(records: Iterable[tuple], seed: int) -> Iterator[tuple]:
    """Apply the skip rules to ``(text, reason, file, line, eos)`` records, yielding
    ``(text, reason, doc_id, u, num_bytes, eos, file, line)``; skipped records have reason != "" and text ""."""
    for text, reason, file, line, eos in records:
        if not reason:
            if text is None:
                reason = "null_text"
            elif not text.strip():
                reason = "empty"
            elif "\x00" in text:
                reason = "nul_bytes"
        if not reason:
            try:  # only a lone surrogate has no UTF-8 form (a pair decodes to one code point)
                data = text.encode("utf-8")
            except UnicodeEncodeError:
                reason = "lone_surrogate"
        if reason:
            yield "", reason, 0, 0.0, 0, eos, file, line
            continue
        doc_id = content_id(data)
        yield text, "", doc_id, split_coordinate(doc_id, seed), len(data), eos, file, line
