"""Resumable output: each chunk of --chunk-rows input rows becomes a part file in the work folder, and the
output is the parts joined in order once every chunk has one.

    <work>/manifest.json          what the parts were made from: the input's path, the classifier (its
                                  files' names, sizes and times), every setting that changes a byte of
                                  the output
    <work>/part-00000012.<ext>    chunk 12's output rows (csv/jsonl without a header, or parquet)
    <work>/part-00000012.npy      its features (--features-out)
    <work>/part-00000012.json     its counts and bad rows and the digest of the input bytes it was made
                                  from: written last, so a part with its .json is whole

A rerun of the same command (any number of ranks) reads the input again, as it must to reach its chunks,
and skips each chunk whose part was made from the bytes it reads now (their digest); it classifies the
rest afresh, so a rewritten input that keeps its path, size and modification time never mixes old labels
into the output. Chunks are the same whatever the ranks, so the joined output is byte for byte the
uninterrupted run's. A manifest that does not match (another input, classifier or setting) is said in one line and the
old parts are removed. The work folder is removed once the output is written.

Only our files are ever deleted (app.common.outputs): the folder carries our mark, which lists the names
we write (OWNED); a --work-dir that already holds files we did not write is used through its subfolder
SUBFOLDER, and a --work-dir that holds the input is refused before any work (app/classify.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from app.common import outputs
from app.common.errors import UserError
from app.common.files import atomic_write

MANIFEST = "manifest.json"
VERSION = 1
PROGRAM = "mlstm-classify"
OWNED = (MANIFEST, "part-[0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9].*")  # the names we write (and their .tmp)
SUBFOLDER = "mlstm-classify.parts"


def _earlier_work_dir(path: Path) -> bool:
    """A work folder of a version from before the mark: its manifest is one of ours."""
    try:
        m = json.loads((path / MANIFEST).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(m, dict) and {"version", "input", "model", "chunk_rows"} <= set(m)


class WorkDir:
    def __init__(self, path: Path, key: dict, ext: str | None, say=None) -> None:
        """`path`: --work-dir (or its default); one that holds files we did not write is used through its
        subfolder SUBFOLDER (said by `say`)."""
        where = outputs.Out("--work-dir", Path(path), outputs.FOLDER)
        self.path = outputs.claim(where, SUBFOLDER, _earlier_work_dir, say)
        self.key, self.ext = {"version": VERSION, **key}, ext

    def _name(self, chunk: int, ext: str) -> Path:
        return self.path / f"part-{chunk:08d}.{ext}"

    def part(self, chunk: int) -> Path:
        return self._name(chunk, self.ext)

    def features(self, chunk: int) -> Path:
        return self._name(chunk, "npy")

    def made_from(self, chunk: int) -> str | None:
        """The digest of the input bytes the chunk's part was made from (None: no whole part; a record
        unreadable or of an older version is no part either: the chunk is classified again)."""
        try:
            return json.loads(self._name(chunk, "json").read_text()).get("input_sha256")
        except (OSError, ValueError, AttributeError):
            return None

    def parts_done(self) -> int:
        """Whole parts in the folder (a record each)."""
        return len(list(self.path.glob("part-*.json"))) if self.path.is_dir() else 0

    def stats(self, chunk: int) -> dict:
        p = self._name(chunk, "json")
        try:
            return json.loads(p.read_text())
        except (OSError, ValueError) as e:
            raise UserError(
                f"{p}: a part's record is unreadable ({e}); remove {self.path} and run again"
            ) from None

    def prepare(self, say) -> int:
        """Rank 0, before any work: the folder and its manifest; parts of another command removed (one line).
        -> the number of parts already done (a resumed run)."""
        if self.path.exists() and not self.path.is_dir():
            raise UserError(f"--work-dir {self.path}: exists and is not a folder")
        outputs.ensure_marked(self.path, PROGRAM, OWNED)
        m = self.path / MANIFEST
        old = None
        if m.is_file():
            try:
                old = json.loads(m.read_text())
            except ValueError:
                old = {}
        ours = self._ours()
        if old != self.key and ours:
            changed = sorted(
                k for k in set(self.key) | set(old or {}) if (old or {}).get(k) != self.key.get(k)
            )
            say(
                f"{self.path}: {len(ours)} part files of another command (it differs in: "
                f"{', '.join(changed) or 'the manifest'}); starting over"
            )
            for p in ours:
                p.unlink()
        if old != self.key:
            atomic_write(m, json.dumps(self.key, indent=1, sort_keys=True))
        return len(list(self.path.glob("part-*.json")))

    def check(self) -> None:
        """Every rank: the manifest rank 0 wrote is this command's (a launch that mixes commands stops)."""
        m = self.path / MANIFEST
        try:
            same = json.loads(m.read_text()) == self.key
        except (OSError, ValueError):
            same = False
        if not same:
            raise UserError(f"{m}: not this command's manifest (another run is using {self.path}?)")

    def _ours(self) -> list[Path]:
        return [p for p in outputs.listed(self.path) if p.name != MANIFEST]

    def write(self, chunk: int, data: bytes | None, feats: np.ndarray | None, stats: dict) -> None:
        """A chunk's part (and features), then its record: the record says the part is whole."""
        if data is not None:
            atomic_write(self.part(chunk), data)
        if feats is not None:
            tmp = self.features(chunk).with_suffix(".tmp")
            with tmp.open("wb") as f:
                np.save(f, np.ascontiguousarray(feats, dtype=np.float32), allow_pickle=False)
            tmp.replace(self.features(chunk))
        atomic_write(self._name(chunk, "json"), json.dumps(stats))

    def remove(self) -> None:
        """What the mark lists (parts, manifest), then the mark and the folder; other files stay."""
        outputs.remove_listed(self.path)
