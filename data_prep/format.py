"""The on-disk format of a prepared dataset, and its loader.

Layout of ``--out``::

    meta.json            counts, tokenizer ids, buckets, source fingerprint, command (written last)
    manifest.json        every shard file with its size and XXH3-128 digest, and what resuming needs
    inputs.json          each input file's name, size and a digest of sampled content (resume checks)
    train/ validation/ test/
                         NNNNN.arrow: Arrow IPC streams (shard groups of about --shard-mb), one row per
                         example, in input order:
                         input_ids  list<int32>  target tokens (EOS ends a document's last chunk; no BOS)
                         length     int32        len(input_ids), 1..max_seq_len
                         num_bytes  int64        UTF-8 bytes these tokens decode to (EOS counts 0)
                         doc_id     int64        content hash of the source document (stable across runs)
                         A document longer than max_seq_len is consecutive rows of one split, its chunks
                         in order, sharing doc_id; only the last ends with EOS (what --carry-state and
                         evaluate's split streams read back, app/batching/carry_schedule.chains).
    tokenizer.model      SentencePiece model (absent for the byte tokenizer)

``split(name)`` memory-maps the shards (nothing is read until used) and adds the column
``bucket`` (int32: smallest i with length <= meta["buckets"][i]), computed from ``length``.

``FORMAT_VERSION`` changes whenever any of that changes meaning; readers refuse other versions
with an error that says to re-run data prep, rather than training on misread data.
Version 1 was one ``save_to_disk`` directory per split with a stored ``bucket`` column.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.common import handed
from data_prep import arrow_numpy, integrity
from data_prep.errors import UserError

FORMAT_VERSION: int = 2
MAX_SEQ_LEN = 1 << 20  # data prep's own bound on --max-seq-len
SPLITS: tuple[str, ...] = ("train", "validation", "test")
META_FILE = "meta.json"
MANIFEST_FILE = "manifest.json"
INPUTS_FILE = "inputs.json"
TOKENIZER_FILE = "tokenizer.model"
RERUN_HINT = "re-run `python -m data_prep --out DIR ...` to prepare the data again"


class PreparedDataError(UserError):
    """A prepared-data directory is missing, corrupt or of another format version (one actionable line)."""


def shard_features():
    """The ``datasets.Features`` stored in every shard (imported lazily: ``datasets`` is slow to import)."""
    import datasets

    return datasets.Features(
        {
            "input_ids": datasets.Sequence(datasets.Value("int32")),
            "length": datasets.Value("int32"),
            "num_bytes": datasets.Value("int64"),
            "doc_id": datasets.Value("int64"),
        }
    )


@dataclass(slots=True)
class PreparedData:
    """A validated prepared-data directory; ``split(name)`` loads one split."""

    path: Path
    meta: dict[str, Any]
    manifest: dict[str, Any]

    def table(self, name: str):
        """Split ``name`` (train, validation or test) as a ``pyarrow.Table`` over memory-mapped shards, with the
        ``bucket`` column added. What training and evaluation read: ``pyarrow`` alone, since importing
        ``datasets`` costs every rank of every launch over a second."""
        import pyarrow as pa

        files = self._checked_files(name)
        try:
            parts = [pa.ipc.open_stream(pa.memory_map(str(f))).read_all() for f in files]
        except Exception as exc:  # unreadable despite the digest (another writer's file)
            raise PreparedDataError(f"{self.path / name}: cannot load split ({exc}); {RERUN_HINT}") from exc
        self._check_parts(name, files, parts)
        table = pa.concat_tables(parts) if len(parts) > 1 else parts[0]
        lengths = arrow_numpy.view(table.column("length"))
        return table.append_column("bucket", arrow_numpy.int32_array(self._buckets(lengths)))

    def split(self, name: str):
        """Split ``name`` as a ``datasets.Dataset`` over the same memory-mapped shards, ``bucket`` added."""
        import datasets

        files = self._checked_files(name)
        try:
            parts = [datasets.Dataset.from_file(str(f), in_memory=False) for f in files]
        except Exception as exc:  # unreadable despite the digest (another writer's file)
            raise PreparedDataError(f"{self.path / name}: cannot load split ({exc}); {RERUN_HINT}") from exc
        self._check_parts(name, files, [part.data for part in parts])
        ds = datasets.concatenate_datasets(parts) if len(parts) > 1 else parts[0]
        lengths = arrow_numpy.view(ds.data.column("length"))
        fingerprint = f"{self.meta['source']['fingerprint']}-{name}"
        return ds.add_column("bucket", self._buckets(lengths), new_fingerprint=fingerprint)

    def _checked_files(self, name: str) -> list[Path]:
        """The shard files of split `name`, each at its manifest size and digest before any byte is used
        (integrity's docstring)."""
        if name not in SPLITS:
            raise ValueError(f"unknown split {name!r}; expected one of {', '.join(SPLITS)}")
        entries = [g["files"][name] for g in self.manifest["groups"]]
        files = [self.shard_path(i, name) for i in range(len(entries))]
        for f, e in zip(files, entries):
            _refuse(integrity.size_problem(f, e["bytes"]) or integrity.digest_problem(f, e["xxh3_128"]))
        return files

    def _check_parts(self, name: str, files: list[Path], tables: list) -> None:
        """The shards' ids are inside the vocabulary and their count is meta.json's."""
        vocab = self.meta["tokenizer"]["vocab_size"]
        for f, part in zip(files, tables):
            _refuse(integrity.id_problem(f, part.column("input_ids"), vocab, self.path / META_FILE))
        total = sum(len(t) for t in tables)
        if total != self.meta["splits"][name]["examples"]:
            raise PreparedDataError(
                f"{self.path / name}: {total} examples on disk, meta.json says "
                f"{self.meta['splits'][name]['examples']}; {RERUN_HINT}"
            )

    def _buckets(self, lengths):
        """(n,) int32: each example's length bucket, the smallest i with length <= buckets[i]."""
        import numpy as np

        return np.searchsorted(np.asarray(self.meta["buckets"]), lengths, side="left").astype(np.int32)

    def shard_path(self, group: int, split: str) -> Path:
        """The file of `split` in shard group `group`, as manifest.json names it (inside the folder)."""
        where = f"groups[{group}].files.{split}.name"
        try:
            name = self.manifest["groups"][group]["files"][split]["name"]
        except (KeyError, IndexError, TypeError):
            raise handed.refuse(self.path / MANIFEST_FILE, where, "is missing") from None
        return handed.member(self.path, name, self.path / MANIFEST_FILE, where)

    @property
    def tokenizer_path(self) -> Path | None:
        """Path of the SentencePiece model (inside the folder), or None for the byte tokenizer."""
        name = self.meta["tokenizer"].get("model_file")
        where = "tokenizer.model_file"
        return None if name is None else handed.member(self.path, name, self.path / META_FILE, where)


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
    try:
        manifest = json.loads((path / MANIFEST_FILE).read_text(encoding="utf-8"))
        manifest["groups"][0]["files"]["train"]["name"]
    except (OSError, ValueError, KeyError, IndexError, TypeError) as exc:
        raise PreparedDataError(f"{path / MANIFEST_FILE}: missing or corrupt ({exc}); {RERUN_HINT}") from exc
    data = PreparedData(path=path, meta=meta, manifest=manifest)
    try:
        tok_path = data.tokenizer_path
        if tok_path is not None and not tok_path.is_file():
            raise PreparedDataError(f"{tok_path}: tokenizer model is missing; {RERUN_HINT}")
        _check_numbers(data)
        _check_sizes(data)
    except PreparedDataError:
        raise
    except UserError as e:  # a name leading out of the folder, a number out of bounds: one line, the flag's
        raise PreparedDataError(str(e)) from None
    return data


def _refuse(problem: str | None) -> None:
    if problem is not None:
        raise PreparedDataError(f"{problem}; {RERUN_HINT}")


def _check_numbers(data: PreparedData) -> None:
    """What meta.json states, before anything is sized by it (app.common.handed): the vocabulary against the
    tokenizer file (a model's embedding and head are that wide), the longest example and the length
    buckets against data prep's bounds, the example counts as counts."""
    meta, file = data.meta, data.path / META_FILE
    handed.check_vocab(meta.get("tokenizer"), data.tokenizer_path, file)
    longest = handed.count(meta.get("max_seq_len"), file, "max_seq_len", 1, MAX_SEQ_LEN)
    bounds = meta.get("buckets")
    if not isinstance(bounds, list) or not 1 <= len(bounds) <= longest:
        raise handed.refuse(file, "buckets", f"must be a list of 1 to {longest} lengths, got {bounds!r:.80}")
    for i, b in enumerate(bounds):
        handed.count(b, file, f"buckets[{i}]", bounds[i - 1] + 1 if i else 1, longest)
    splits = meta.get("splits")
    for name in SPLITS:
        if not isinstance(splits, dict) or not isinstance(splits.get(name), dict):
            raise handed.refuse(file, f"splits.{name}", "is missing")
        handed.count(splits[name].get("examples"), file, f"splits.{name}.examples", 0)


def _check_sizes(data: PreparedData) -> None:
    """Every shard the manifest lists is inside the folder, and for a non-empty split there at its size (a
    stat each). An empty split is left to its users, which refuse it in their own words (training needs a
    validation split)."""
    file = data.path / MANIFEST_FILE
    for i, group in enumerate(data.manifest["groups"]):
        for name in SPLITS:
            path = data.shard_path(i, name)
            size = handed.count(group["files"][name].get("bytes"), file, f"groups[{i}].files.{name}.bytes", 0)
            if data.meta["splits"][name]["examples"]:
                _refuse(integrity.size_problem(path, size))
