"""The output directory while it is being written: Arrow shard groups, and the manifest that makes a run resumable.

Examples are appended, block by block in input order, to one open *shard group*: the files
``train/NNNNN.arrow``, ``validation/NNNNN.arrow`` and ``test/NNNNN.arrow`` (Arrow IPC streams, the
files ``datasets.Dataset.from_file`` memory-maps). A group closes when it holds about ``--shard-mb``
of data; its files are then hashed and recorded in ``manifest.json`` (size, XXH3-128 digest, the number of
input blocks it completes, its counts), which is replaced atomically. A killed run leaves at most one
unfinished group, which a rerun deletes; it keeps every group whose files still match the manifest and
skips the input blocks they cover. ``meta.json`` is written last, so a directory without it is never
mistaken for finished data.

The files are written as raw bytes of IPC messages (``pieces``) rather than through ``datasets``'
``ArrowWriter`` or a pyarrow writer: the record batches are serialised in the worker processes, so the
parent only appends bytes, and a file is closed and hashed at a point we choose.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from app.common.handed import member
from data_prep import pieces
from data_prep.errors import UserError
from data_prep.format import INPUTS_FILE, MANIFEST_FILE, META_FILE, SPLITS, TOKENIZER_FILE, shard_features
from data_prep.integrity import file_digest

log = logging.getLogger(__name__)
MANIFEST_VERSION = 2  # 2: shard digests are XXH3-128 (were SHA-256)
SPOOL_DIR = ".spool"
SHARD_GLOB = "[0-9][0-9][0-9][0-9][0-9].arrow"  # a split folder's shard files (f"{index:05d}.arrow")


def _write_json(path: Path, obj: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(tmp, path)


OUR_FILES = (META_FILE, MANIFEST_FILE, INPUTS_FILE, TOKENIZER_FILE)


def _clear(out: Path) -> None:
    """--overwrite: what data prep writes (its JSON files, the tokenizer, the shards, the spool), and only
    that: a file someone else put in the folder stays (app.common.outputs: we delete only our own)."""
    for name in OUR_FILES:
        for p in (out / name, out / f"{name}.tmp"):
            p.unlink(missing_ok=True)
    shutil.rmtree(out / SPOOL_DIR, ignore_errors=True)
    for split in SPLITS:
        folder = out / split
        if folder.is_dir() and not folder.is_symlink():
            for p in folder.glob(SHARD_GLOB):
                p.unlink()
            with contextlib.suppress(OSError):
                folder.rmdir()


def open_out(
    out: Path, overwrite: bool, key: dict[str, Any], input_change: Callable[[], str]
) -> dict[str, Any]:
    """Check ``--out`` and return its manifest: a fresh one, or the one of an unfinished run of the
    same command (resume). One-line UserError for everything the user must decide (``input_change``
    says how the inputs differ from those of the unfinished run, when they do)."""
    if out.exists() and not out.is_dir():
        raise UserError(f"{out}: --out exists and is not a directory")
    parent = out.resolve().parent
    if not os.access(parent if parent.exists() else Path.cwd(), os.W_OK):
        raise UserError(f"{parent}: cannot write here (permission denied) for --out {out}")
    fresh = {"manifest_version": MANIFEST_VERSION, "key": key, "scan": None, "groups": []}
    if out.is_dir() and any(out.iterdir()):
        ours = (out / META_FILE).is_file() or (out / MANIFEST_FILE).is_file()
        if not ours:
            if overwrite:
                raise UserError(
                    f"{out}: refusing to --overwrite a non-empty directory that is not a data_prep output (no {META_FILE})"
                )
            raise UserError(
                f"{out}: --out is not empty; pass --overwrite to replace it, or choose another --out"
            )
        if overwrite:
            _clear(out)
        elif (out / META_FILE).is_file():
            raise UserError(
                f"{out}: --out is not empty; pass --overwrite to replace it, or choose another --out"
            )
        else:
            try:
                old = json.loads((out / MANIFEST_FILE).read_text(encoding="utf-8"))
            except (OSError, ValueError):
                old = {}
            if old.get("manifest_version") != MANIFEST_VERSION or old.get("key") != key:
                raise UserError(
                    f"{out}: holds an unfinished data_prep run of another command ({_difference(old, key, input_change)}); "
                    "rerun that command to resume it, or pass --overwrite to start again"
                )
            return old
    return fresh  # the directory is made when there is something to keep (save_manifest)


def _difference(old: dict[str, Any], key: dict[str, Any], input_change: Callable[[], str]) -> str:
    if not old:
        return f"{MANIFEST_FILE} unreadable"
    if old.get("manifest_version") != MANIFEST_VERSION:
        return "written by another data_prep version"
    was = old.get("key") or {}
    changed = [input_change()] if was.get("input") != key["input"] else []
    settings = was.get("settings") or {}
    for k, v in key["settings"].items():
        if settings.get(k) == v:
            continue
        if k == "tokenizer_model_sha256":
            changed.append("another --tokenizer-model file")
        elif k == "format_version":
            changed.append(f"format_version was {settings.get(k)}, now {v}")
        else:
            changed.append(f"--{k.replace('_', '-')} was {settings.get(k)}, now {v}")
    return "; ".join(changed or ["other settings"])


def keep_finished(out: Path, manifest: dict[str, Any]) -> int:
    """Drop groups whose files no longer match (and any file no group lists); return the blocks they cover."""
    kept = []
    for i, group in enumerate(manifest["groups"]):
        where = f"groups[{i}].files.{{}}.name"  # names read only inside --out (app.common.handed)
        paths = {
            k: member(out, f["name"], out / MANIFEST_FILE, where.format(k)) for k, f in group["files"].items()
        }
        ok = all(
            paths[k].is_file()
            and paths[k].stat().st_size == f["bytes"]
            and file_digest(paths[k]) == f["xxh3_128"]
            for k, f in group["files"].items()
        )
        if not ok:
            break
        kept.append(group)
    manifest["groups"] = kept
    listed = {f["name"] for g in kept for f in g["files"].values()}
    for name in SPLITS:
        d = out / name
        if d.is_dir():
            for p in d.glob(SHARD_GLOB):  # the shard files we write, nothing else
                if f"{name}/{p.name}" not in listed:
                    p.unlink()
    _write_json(out / MANIFEST_FILE, manifest)
    return kept[-1]["blocks_end"] if kept else 0


def spool_dir(out: Path) -> Path:
    """An empty folder in ``out`` for the blocks sent to the workers and their results (the same file system:
    copies stay in the kernel). Only its owner may write there: the workers unpickle the blocks."""
    spool = out / SPOOL_DIR
    shutil.rmtree(spool, ignore_errors=True)  # a killed run's leftovers
    spool.mkdir(mode=0o700, parents=True, exist_ok=True)
    return spool


def save_manifest(out: Path, manifest: dict[str, Any], inputs: list[dict] | None = None) -> None:
    """Replace the manifest (with ``inputs``: first record the input fingerprints, unless kept from before)."""
    out.mkdir(parents=True, exist_ok=True)
    if inputs is not None and not (out / INPUTS_FILE).is_file():
        _write_json(out / INPUTS_FILE, inputs)
    _write_json(out / MANIFEST_FILE, manifest)


def read_inputs(out: Path) -> list[dict] | None:
    """The input fingerprints an unfinished run recorded (None if unreadable)."""
    try:
        inputs = json.loads((out / INPUTS_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return inputs if isinstance(inputs, list) else None


class GroupWriter:
    """Appends encoded blocks (``pieces.Piece``) to the open shard group; closes groups of about ``shard_bytes``.

    Each split file is written as raw bytes: the schema message, the pieces' record-batch messages in
    input order, the end-of-stream marker (see ``pieces``)."""

    def __init__(self, out: Path, manifest: dict[str, Any], shard_bytes: int, max_seq_len: int) -> None:
        self.out, self.manifest, self.shard_bytes = out, manifest, shard_bytes
        self.max_seq_len = max_seq_len
        self.schema_message = shard_features().arrow_schema.serialize().to_pybytes()
        self._fds: list[int] | None = None
        self._reset()

    def _reset(self) -> None:
        self.bytes = 0
        self.stats = {n: {"docs": 0, "examples": 0, "tokens": 0, "bytes": 0} for n in SPLITS}
        self.hist = np.zeros(self.max_seq_len + 1, np.int64)

    def _paths(self) -> list[Path]:
        index = len(self.manifest["groups"])
        return [self.out / name / f"{index:05d}.arrow" for name in SPLITS]

    def _open(self) -> list[int]:
        if self._fds is None:
            self._fds = []
            for path in self._paths():
                path.parent.mkdir(exist_ok=True)
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                self._fds.append(fd)
                pieces.write_all(fd, self.schema_message)
        return self._fds

    def add(self, piece: pieces.Piece, blocks_end: int) -> None:
        fds = self._open()
        for i, (name, fd) in enumerate(zip(SPLITS, fds)):
            pieces.append(piece, i, fd)
            s = self.stats[name]
            s["docs"] += piece.docs[i]
            s["examples"] += piece.examples[i]
            s["tokens"] += piece.tokens[i]
            s["bytes"] += piece.bytes[i]
        self.bytes += piece.table_bytes
        self.hist += piece.hist
        if self.bytes >= self.shard_bytes:
            self.close(blocks_end)

    def close(self, blocks_end: int, force: bool = False) -> None:
        """Finish the open group (or, with ``force``, write an empty one when none was ever written)."""
        if self._fds is None and not (force and not self.manifest["groups"]):
            return
        for fd in self._open():
            pieces.write_all(fd, pieces.END_OF_STREAM)
            os.close(fd)
        files = {}
        for name, path in zip(SPLITS, self._paths()):
            files[name] = {
                "name": f"{name}/{path.name}",
                "bytes": path.stat().st_size,
                "xxh3_128": file_digest(path),
            }
        self.manifest["groups"].append(
            {"blocks_end": blocks_end, "files": files, "stats": self.stats, "hist": self.hist.tolist()}
        )
        save_manifest(self.out, self.manifest)
        self._fds = None
        self._reset()
