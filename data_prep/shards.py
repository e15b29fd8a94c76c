"""The output directory while it is being written: Arrow shard groups, and the manifest that makes a run resumable.

Examples are appended, block by block in input order, to one open *shard group*: the files
``train/NNNNN.arrow``, ``validation/NNNNN.arrow`` and ``test/NNNNN.arrow`` (Arrow IPC streams, the
files ``datasets.Dataset.from_file`` memory-maps). A group closes when it holds about ``--shard-mb``
of data; its files are then hashed and recorded in ``manifest.json`` (size, sha256, the number of
input blocks it completes, its counts), which is replaced atomically. A killed run leaves at most one
unfinished group, which a rerun deletes; it keeps every group whose files still match the manifest and
skips the input blocks they cover. ``meta.json`` is written last, so a directory without it is never
mistaken for finished data.

The writer is pyarrow's IPC stream writer rather than ``datasets``' ``ArrowWriter``: we need the
file closed and hashed at a point we choose, and nothing else (no cache, no fingerprints) in the way.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from data_prep.errors import UserError
from data_prep.format import MANIFEST_FILE, META_FILE, SPLITS, shard_features

log = logging.getLogger(__name__)
MANIFEST_VERSION = 1


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def _write_json(path: Path, obj: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def _clear(out: Path) -> None:
    for p in out.iterdir():
        shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()


def open_out(out: Path, overwrite: bool, key: dict[str, Any]) -> dict[str, Any]:
    """Check ``--out`` and return its manifest: a fresh one, or the one of an unfinished run of the
    same command (resume). One-line UserError for everything the user must decide."""
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
                was = old.get("key") or {}
                changed = ["input files"] if was.get("input") != key["input"] else []
                changed += [
                    "--" + k.replace("_", "-")
                    for k, v in key["settings"].items()
                    if (was.get("settings") or {}).get(k) != v
                ]
                changed = changed or ["format"]
                raise UserError(
                    f"{out}: holds an unfinished data_prep run with other {', '.join(changed)}; "
                    "rerun that command to resume it, or pass --overwrite to start again"
                )
            return old
    return fresh  # the directory is made when there is something to keep (save_manifest)


def keep_finished(out: Path, manifest: dict[str, Any]) -> int:
    """Drop groups whose files no longer match (and any file no group lists); return the blocks they cover."""
    kept = []
    for group in manifest["groups"]:
        ok = all(
            (out / f["name"]).is_file()
            and (out / f["name"]).stat().st_size == f["bytes"]
            and _sha256(out / f["name"]) == f["sha256"]
            for f in group["files"].values()
        )
        if not ok:
            break
        kept.append(group)
    manifest["groups"] = kept
    listed = {f["name"] for g in kept for f in g["files"].values()}
    for name in SPLITS:
        d = out / name
        if d.is_dir():
            for p in d.iterdir():
                if f"{name}/{p.name}" not in listed:
                    p.unlink()
    _write_json(out / MANIFEST_FILE, manifest)
    return kept[-1]["blocks_end"] if kept else 0


def save_manifest(out: Path, manifest: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    _write_json(out / MANIFEST_FILE, manifest)


class GroupWriter:
    """Appends encoded blocks to the open shard group; closes groups of about ``shard_bytes``."""

    def __init__(self, out: Path, manifest: dict[str, Any], shard_bytes: int, max_seq_len: int) -> None:
        self.out, self.manifest, self.shard_bytes = out, manifest, shard_bytes
        self.max_seq_len = max_seq_len
        self.schema = shard_features().arrow_schema
        self._writers: list[pa.ipc.RecordBatchStreamWriter] | None = None
        self._reset()

    def _reset(self) -> None:
        self.bytes = 0
        self.stats = {n: {"docs": 0, "examples": 0, "tokens": 0, "bytes": 0} for n in SPLITS}
        self.hist = np.zeros(self.max_seq_len + 1, np.int64)

    def _paths(self) -> list[Path]:
        index = len(self.manifest["groups"])
        return [self.out / name / f"{index:05d}.arrow" for name in SPLITS]

    def add(self, encoded, blocks_end: int) -> None:
        if self._writers is None:
            self._writers = []
            for path in self._paths():
                path.parent.mkdir(exist_ok=True)
                self._writers.append(pa.ipc.new_stream(str(path), self.schema))
        for name, writer, table, docs in zip(SPLITS, self._writers, encoded.tables, encoded.docs):
            if len(table):
                writer.write_table(table.cast(self.schema))
            s = self.stats[name]
            s["docs"] += int(docs)
            s["examples"] += len(table)
            s["tokens"] += int(pa.compute.sum(table.column("length")).as_py() or 0)
            s["bytes"] += int(pa.compute.sum(table.column("num_bytes")).as_py() or 0)
            self.bytes += table.nbytes
        self.hist += encoded.hist
        if self.bytes >= self.shard_bytes:
            self.close(blocks_end)

    def close(self, blocks_end: int, force: bool = False) -> None:
        """Finish the open group (or, with ``force``, write an empty one when none was ever written)."""
        if self._writers is None:
            if not (force and not self.manifest["groups"]):
                return
            self.add_empty()
        assert self._writers is not None
        for w in self._writers:
            w.close()
        files = {}
        for name, path in zip(SPLITS, self._paths()):
            files[name] = {
                "name": f"{name}/{path.name}",
                "bytes": path.stat().st_size,
                "sha256": _sha256(path),
            }
        self.manifest["groups"].append(
            {"blocks_end": blocks_end, "files": files, "stats": self.stats, "hist": self.hist.tolist()}
        )
        save_manifest(self.out, self.manifest)
        self._writers = None
        self._reset()

    def add_empty(self) -> None:
        self._writers = []
        for path in self._paths():
            path.parent.mkdir(exist_ok=True)
            self._writers.append(pa.ipc.new_stream(str(path), self.schema))
