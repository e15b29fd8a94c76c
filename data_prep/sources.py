"""Turn ``--input`` paths / ``--hub`` / the default corpus into one deterministic stream of records.

``Sources`` resolves the inputs once (names, formats, and per file its size and a digest of sampled
content, which a resumed run compares); ``records()`` streams ``(text | None, reason, file index, line, ends
document)`` through the readers in ``readers``, so nothing holds more than one bounded piece of a file.
A file with invalid UTF-8 is decoded with replacement characters and warned about (file, line, byte).
"""

from __future__ import annotations

import glob
import hashlib
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from data_prep import csv_rows, hub, readers
from data_prep.config import PrepConfig
from data_prep.default_corpus import default_corpus
from data_prep.errors import UserError
from data_prep.walk import walk

log = logging.getLogger(__name__)

EXTENSIONS = {
    ".txt": "text", ".text": "text", ".md": "text", ".rst": "text", ".py": "text",
    ".json": "json", ".jsonl": "json", ".ndjson": "json",
    ".csv": "csv", ".tsv": "csv",
    ".parquet": "parquet", ".pq": "parquet",
}  # fmt: skip
Record = tuple[str | None, str, int, int, bool]  # (text, skip reason or "", file index, line, ends document)


@dataclass(slots=True)
class Sources:
    """The resolved inputs of one run."""

    cfg: PrepConfig
    names: list[str]  # display name of each file index
    files: list[tuple[int, Path, str]]  # (file index, path, format) of files to read
    topics: list[str] = field(
        default_factory=list
    )  # default corpus: in-memory documents (file index = position)
    source: dict = field(default_factory=dict)  # for meta.json
    bad_utf8: set[int] = field(default_factory=set)  # file indices that needed replacement characters
    csv_clean: dict[int, bool] = field(default_factory=dict)  # CSV file index -> pandas reads it whole
    broken: dict[int, str] = field(
        default_factory=dict
    )  # file index -> where its compressed stream broke off

    def fingerprints(self) -> list[dict]:
        """Per input file: name, format, size and a digest of sampled content (no mtime: see _sample_digest)."""
        out = []
        for idx, path, fmt in self.files:
            try:
                size, sample = _sample_digest(path)
            except OSError as exc:
                raise UserError(f"{path}: cannot read file ({exc.strerror or exc})") from exc
            out.append({"name": self.names[idx], "format": fmt, "bytes": size, "sample": sample})
        return out

    def key(self, fingerprints: list[dict]) -> str:
        """Changes when the input list, a file's size or its sampled content changes (not its mtime)."""
        h = hashlib.blake2b(digest_size=16)
        h.update(repr(sorted(self.source.items())).encode())
        for f in fingerprints:
            h.update(f"{f['name']}|{f['format']}|{f['bytes']}|{f['sample']}\n".encode())
        h.update(hashlib.blake2b("\0".join(self.topics).encode(), digest_size=16).digest())
        return h.hexdigest()

    def records(self, parse_json: bool = True) -> Iterator[Record]:
        """Every record of every input, in a fixed order; warns once per run per file with invalid UTF-8.
        ``parse_json=False``: JSON Lines rows come unparsed (``readers.UNPARSED``)."""
        cfg = self.cfg
        if cfg.hub:
            for text, reason, line, eos in hub.hub_records(
                cfg.hub, cfg.hub_config, cfg.hub_split, cfg.text_field
            ):
                yield text, reason, 0, line, eos
            return
        for i, text in enumerate(self.topics):
            yield text, "", i, 0, True
        doc_split = cfg.doc_split if cfg.inputs else "file"
        warned = 0
        for idx, path, fmt in self.files:
            utf8 = readers.Utf8State()
            if fmt == "text":
                it = readers.text_records(path, doc_split, utf8)
            elif fmt == "json":
                it = readers.json_records(path, cfg.text_field, utf8, parse_json)
            elif fmt == "csv":
                _check_readable(path)
                sep = "\t" if path.suffix.lower() == ".tsv" else ","
                if idx not in self.csv_clean:  # scanned once per run, not once per pass
                    self.csv_clean[idx] = not csv_rows.scan(path, utf8)
                it = csv_rows.csv_records(path, cfg.text_field, sep, self.csv_clean[idx])
            else:
                _check_readable(path)
                it = readers.table_records("parquet", path, cfg.text_field, 0)
            for text, reason, line, eos in it:
                yield text, reason, idx, line, eos
            if utf8.broken_at is not None and idx not in self.broken:  # once per run, not per pass
                line, why = utf8.broken_at
                self.broken[idx] = f"{self.names[idx]}:{line}"
                log.warning(
                    "%s:%d: compressed stream truncated or corrupt (%s); the lines before it are kept",
                    self.names[idx], line, why,
                )  # fmt: skip
            if utf8.first_bad is not None and idx not in self.bad_utf8:  # once per run, not per pass
                self.bad_utf8.add(idx)
                warned += 1
                if warned <= 5:
                    log.warning(
                        "%s:%d: invalid UTF-8 at byte %d; decoded with replacement characters",
                        self.names[idx],
                        *utf8.first_bad,
                    )
        if warned > 5:
            log.warning("... %d more files with invalid UTF-8", warned - 5)


SAMPLE_EDGE = 1 << 16  # bytes hashed at each end of a file
SAMPLE_WINDOWS = 8  # and this many windows spread evenly in between
SAMPLE_WINDOW = 1 << 12


def _sample_digest(path: Path) -> tuple[int, str]:
    """(size, digest of the file's first and last 64 KiB and 8 windows of 4 KiB between them); small files whole.

    What a resumed run compares instead of reading every input again. Size and mtime alone (make's and
    rsync's quick check) refuse a corpus that was only copied or touched, which would throw away hours
    of finished shards, and accept a file rewritten at the same size with its mtime kept (``cp -p``,
    ``rsync -t``, a re-extracted archive); content samples do neither. What still passes: an edit that
    keeps the size and misses every window (an edit that changes the text's byte count is caught at
    the end, where the encoded byte total must equal the scan's)."""
    h = hashlib.blake2b(digest_size=16)
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size <= 2 * SAMPLE_EDGE + SAMPLE_WINDOWS * SAMPLE_WINDOW:
            h.update(f.read())
        else:
            span = size - 2 * SAMPLE_EDGE - SAMPLE_WINDOW
            offsets = [0, *(SAMPLE_EDGE + span * k // (SAMPLE_WINDOWS - 1) for k in range(SAMPLE_WINDOWS))]
            for off in [*offsets, size - SAMPLE_EDGE]:
                f.seek(off)
                h.update(f.read(SAMPLE_EDGE if off in (0, size - SAMPLE_EDGE) else SAMPLE_WINDOW))
    return size, h.hexdigest()


def describe_change(was: list[dict] | None, now: list[dict]) -> str:
    """What differs between the inputs of an unfinished run and this one, for a one-line refusal."""
    if not was:
        return "other inputs"
    old, new = {f["name"]: f for f in was}, {f["name"]: f for f in now}
    added = [n for n in new if n not in old]
    removed = [n for n in old if n not in new]
    if added or removed:
        parts = [f"{len(added)} added (first {added[0]})"] if added else []
        parts += [f"{len(removed)} gone (first {removed[0]})"] if removed else []
        return "input files " + ", ".join(parts)
    for name, f in new.items():
        o = old[name]
        if f["bytes"] != o["bytes"]:
            return f"input {name} was {o['bytes']} bytes, now {f['bytes']}"
        if f["sample"] != o["sample"] or f["format"] != o["format"]:
            return f"input {name} has other content (same size)"
    return "other inputs"


def _fmt_for(path: Path, forced: str) -> str:
    suffixes = [x.lower() for x in path.suffixes]
    compressed = bool(suffixes) and suffixes[-1] in readers.COMPRESSIONS
    fmt = (
        forced
        if forced != "auto"
        else EXTENSIONS.get(suffixes[-2] if compressed and len(suffixes) > 1 else path.suffix.lower())
    )
    if compressed and fmt in ("csv", "parquet"):
        raise UserError(
            f"{path}: compressed {fmt} is not supported; decompress it, or use JSON Lines (.jsonl{suffixes[-1]})"
        )
    if fmt is None:
        raise UserError(
            f"{path}: unknown format (extension {path.suffix or 'none'!r}); supported: "
            f"{' '.join(sorted(EXTENSIONS))} (text and JSON also as .gz/.xz/.zst); "
            "pass --format text to read it as plain text"
        )
    return fmt


def resolve_inputs(
    inputs: list[str], forced_format: str, problems: dict[str, list[str]]
) -> list[tuple[Path, str]]:
    """Expand paths, globs and directories (recursively, hidden entries skipped, see ``walk``) in a
    stable order; what a directory walk had to leave out is added to ``problems`` (kind -> paths)."""
    out: list[tuple[Path, str]] = []
    seen: set[Path] = set()
    for spec in inputs:
        if glob.has_magic(spec):
            paths = [Path(p) for p in sorted(glob.glob(spec, recursive=True)) if Path(p).is_file()]
            if not paths:
                raise UserError(f"{spec}: glob matches no files")
        elif os.path.isdir(spec):
            paths = walk(Path(spec), problems)
            if not paths:
                raise UserError(f"{spec}: directory contains no files")
        elif os.path.lexists(spec):
            if not os.path.exists(spec):
                raise UserError(f"{spec}: broken symbolic link")
            paths = [Path(spec)]
        else:
            raise UserError(f"{spec}: no such file or directory")
        for path in paths:
            if path.resolve() not in seen:  # the same file twice would put duplicates in every split
                seen.add(path.resolve())
                out.append((path, _fmt_for(path, forced_format)))
    return out


def resolve(cfg: PrepConfig) -> Sources:
    if cfg.hub:
        name = f"hub:{cfg.hub}" + (f"/{cfg.hub_config}" if cfg.hub_config else "") + f"[{cfg.hub_split}]"
        source = {"kind": "hub", "name": cfg.hub, "config": cfg.hub_config, "split": cfg.hub_split}
        return Sources(cfg, [name], [], source=source)
    if cfg.inputs:
        problems: dict[str, list[str]] = {}
        files = resolve_inputs(cfg.inputs, cfg.format, problems)
        for kind, paths in problems.items():
            log.warning("left out %d %s: %s", len(paths), kind.replace("_", " "), ", ".join(paths[:5]))
        source = {"kind": "files", "inputs": list(cfg.inputs), "files": len(files)}
        if problems:
            source["left_out"] = {kind: len(paths) for kind, paths in problems.items()}
        return Sources(
            cfg, [str(p) for p, _ in files], [(i, p, f) for i, (p, f) in enumerate(files)], source=source
        )
    corpus = default_corpus(cfg.default_max_mb)
    names = [f"pydoc_data.topics[{name!r}]" for name, _ in corpus.topics]
    base = len(names)
    names += [f"<stdlib>/{p.relative_to(corpus.root).as_posix()}" for p in corpus.files]
    source = {
        "kind": "default",
        "python": corpus.python,
        "stdlib": str(corpus.root),
        "topics": len(corpus.topics),
        "files": len(corpus.files),
        "default_max_mb": cfg.default_max_mb,
    }
    files = [(base + i, p, "text") for i, p in enumerate(corpus.files)]
    return Sources(cfg, names, files, topics=[t for _, t in corpus.topics], source=source)


def _check_readable(path: Path) -> None:
    try:
        with open(path, "rb") as f:
            f.read(1)
    except OSError as exc:
        raise UserError(f"{path}: cannot read file ({exc.strerror or exc})") from exc
