"""The on-disk format of a prepared dataset, and its loader.

Layout of ``--out``::

    meta.json            counts, tokenizer ids, buckets, source fingerprint, command (see ``build_meta``)
    train/ validation/ test/
                         ``datasets.Dataset.save_to_disk`` directories, one row per example:
                         input_ids  list<int32>  target tokens (EOS ends a document's last chunk; no BOS)
                         length     int32        len(input_ids), 1..max_seq_len
                         num_bytes  int64        UTF-8 bytes these tokens decode to (EOS counts 0)
                         bucket     int32        smallest i with length <= meta["buckets"][i]
                         doc_id     int64        content hash of the source document (stable across runs)
    tokenizer.model      SentencePiece model (absent for the byte tokenizer)

``FORMAT_VERSION`` changes whenever any of that changes meaning; readers refuse other versions
with an error that says to re-run data prep, rather than training on misread data.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from data_prep.errors import UserError

FORMAT_VERSION: int = 1
SPLITS: tuple[str, ...] = ("train", "validation", "test")
META_FILE = "meta.json"
TOKENIZER_FILE = "tokenizer.model"
RERUN_HINT = "re-run `python -m data_prep --out DIR ...` to prepare the data again"


class PreparedDataError(UserError):
    """A prepared-data directory is missing, corrupt or of another format version (one actionable line)."""


def features():
    """The ``datasets.Features`` of every split (imported lazily: ``datasets`` is slow to import)."""
    import datasets

    return datasets.Features(
        {
            "input_ids": datasets.Sequence(datasets.Value("int32")),
            "length": datasets.Value("int32"),
            "num_bytes": datasets.Value("int64"),
            "bucket": datasets.Value("int32"),
            "doc_id": datasets.Value("int64"),
        }
    )


@dataclass(slots=True)
class PreparedData:
    """A validated prepared-data directory; ``split(name)`` loads one split."""

    path: Path
    meta: dict[str, Any]

    def split(self, name: str):
        """Load split ``name`` (train, validation or test) as a ``datasets.Dataset``."""
        if name not in SPLITS:
            raise ValueError(f"unknown split {name!r}; expected one of {', '.join(SPLITS)}")
        import datasets

        split_dir = self.path / name
        if not split_dir.is_dir():
            raise PreparedDataError(f"{split_dir}: split directory is missing; {RERUN_HINT}")
        try:
            return datasets.load_from_disk(str(split_dir))
        except Exception as exc:  # corrupt arrow files, missing state.json, ...
            raise PreparedDataError(f"{split_dir}: cannot load split ({exc}); {RERUN_HINT}") from exc

    @property
    def tokenizer_path(self) -> Path | None:
        """Path of the SentencePiece model, or None for the byte tokenizer."""
        name = self.meta["tokenizer"].get("model_file")
        return None if name is None else self.path / name


def load_prepared(path: str | Path) -> PreparedData:
    """Open a directory written by ``python -m data_prep``; raises PreparedDataError with a fix if unusable."""
    path = Path(path)
    if not path.is_dir():
        raise PreparedDataError(f"{path}: prepared-data directory does not exist; {RERUN_HINT}")
    meta_path = path / META_FILE
    if not meta_path.is_file():
        raise PreparedDataError(f"{meta_path}: missing, so {path} is not a data_prep output; {RERUN_HINT}")
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise PreparedDataError(f"{meta_path}: unreadable or corrupt ({exc}); {RERUN_HINT}") from exc
    if not isinstance(meta, dict) or "format_version" not in meta:
        raise PreparedDataError(f"{meta_path}: no format_version field; {RERUN_HINT}")
    version = meta["format_version"]
    if version != FORMAT_VERSION:
        raise PreparedDataError(
            f"{path} was written by format_version {version}, this version reads {FORMAT_VERSION}: {RERUN_HINT}"
        )
    data = PreparedData(path=path, meta=meta)
    tok_path = data.tokenizer_path
    if tok_path is not None and not tok_path.is_file():
        raise PreparedDataError(f"{tok_path}: tokenizer model is missing; {RERUN_HINT}")
    return data
