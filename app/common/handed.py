"""A folder a user is handed (prepared data, a run, a checkpoint, an export) is read only inside itself, and
the numbers its JSON files give are checked before anything is sized by them.

One place for data (`data_prep.format`), checkpoints and runs (`app.checkpoints.training`, `.loader`) and
exports alike:

- `member`: a file name read from one of the folder's JSON files is a relative path that resolves inside
  the folder, symbolic links included; an absolute name, a `..` that leads out, a link to elsewhere or a
  non-string is refused in one line naming the file and the field.
- `count`: a size or count is an integer within its bounds (not a bool, not a float, not 10^12).
- `check_vocab`: the vocabulary a folder states is the one its tokenizer file has: the SentencePiece
  model's piece count, or 256 byte ids plus the special ids for the byte tokenizer; every special id lies in
  it. A model's embedding and head are sized by this number, so it is checked before any of them exists.

The sizes of files (shards, checkpoint files) are checked against their manifests where those are read
(`data_prep.integrity`, `app.checkpoints.training`); the model's dimensions against its weights in
`app.checkpoints.consolidate` (both through `count` first, so no loop or allocation runs on a wild number).
"""

from __future__ import annotations

import os
from pathlib import Path, PurePath

from app.common.errors import UserError

MAX_VOCAB = 1 << 24  # a SentencePiece model this large is 100s of MB; data prep makes at most 1,000,000


def refuse(file: Path, field: str, problem: str) -> UserError:
    return UserError(f"{file}: {field} {problem}")


def member(root: Path, name: object, file: Path, field: str) -> Path:
    """`name`, read from `field` of `file` (a JSON file of the folder `root`), as a path inside `root`."""
    if not isinstance(name, str) or not name or "\0" in name:
        raise refuse(file, field, f"must be a file name inside {root}, got {name!r}")
    if PurePath(name).is_absolute():
        raise refuse(file, field, f"{name!r} is an absolute path; only names inside {root} are read")
    path = Path(root) / name
    real, top = Path(os.path.realpath(path)), Path(os.path.realpath(root))
    if real == top or top not in real.parents:
        raise refuse(
            file, field, f"{name!r} points outside {root} (to {real}); only files inside the folder are read"
        )
    return path


def count(value: object, file: Path, field: str, lo: int = 1, hi: int = 1 << 62) -> int:
    """`value`, read from `field` of `file`, as an integer in [lo, hi]."""
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise refuse(file, field, f"must be an integer in [{lo:,}, {hi:,}], got {value!r}")
    return value


def _pieces(model_file: Path, file: Path, field: str) -> int:
    import sentencepiece as spm

    try:
        return spm.SentencePieceProcessor(model_file=str(model_file)).get_piece_size()
    except (OSError, RuntimeError, ValueError) as e:
        raise refuse(file, field, f"names {model_file}, which is not a SentencePiece model ({e})") from None


def check_vocab(tok: object, model_file: Path | None, file: Path, field: str = "tokenizer") -> int:
    """The tokenizer entry `tok` of `file` (type, vocab_size, pad/bos/eos ids), checked against its tokenizer
    file `model_file` (None for the byte tokenizer) -> vocab_size."""
    if not isinstance(tok, dict):
        raise refuse(file, field, f"must be an object (type, vocab_size, ids), got {tok!r}")
    vocab = count(tok.get("vocab_size"), file, f"{field}.vocab_size", 1, MAX_VOCAB)
    ids = {k: count(tok.get(k), file, f"{field}.{k}", 0, vocab - 1) for k in ("pad_id", "bos_id", "eos_id")}
    kind = tok.get("type")
    if kind == "byte":
        have, what = 256 + len(set(ids.values())), "the byte tokenizer has (256 bytes + the special ids)"
    elif kind == "sentencepiece":
        if model_file is None or not model_file.is_file():
            raise refuse(
                file, f"{field}.type", f"is sentencepiece, but the model file {model_file} is missing"
            )
        have, what = _pieces(model_file, file, field), f"{model_file} has"
    else:
        raise refuse(file, f"{field}.type", f"must be sentencepiece or byte, got {kind!r}")
    if vocab != have:
        raise refuse(file, f"{field}.vocab_size", f"is {vocab:,}, but {what} {have:,} ids")
    return vocab
