"""Turn ``--input`` paths / ``--hub`` / the default corpus into one deterministic stream of records.

``Sources`` resolves the inputs once (names, formats, and a key of their sizes and modification times
that a resumed run compares); ``records()`` streams ``(text | None, reason, file index, line, ends
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

from data_prep import hub, readers
from data_prep.config import PrepConfig
from data_prep.default_corpus import default_corpus
from data_prep.errors import UserError

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

    def key(self) -> str:
        """Changes when any input file changes (size or modification time) or the input list does."""
        h = hashlib.blake2b(digest_size=16)
        h.update(repr(sorted(self.source.items())).encode())
        for _, path, fmt in self.files:
            st = path.stat()
            h.update(f"{path.resolve()}|{fmt}|{st.st_size}|{st.st_mtime_ns}\n".encode())
        h.update(hashlib.blake2b("\0".join(self.topics).encode(), digest_size=16).digest())
        return h.hexdigest()

    def records(self) -> Iterator[Record]:
        """Every record of every input, in a fixed order; warns once per file with invalid UTF-8."""
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
            if fmt in ("text", "json"):
                utf8 = readers.Utf8State()
                it = (
                    readers.text_records(path, doc_split, utf8)
                    if fmt == "text"
                    else readers.json_records(path, cfg.text_field, utf8)
                )
                for text, reason, line, eos in it:
                    yield text, reason, idx, line, eos
                if utf8.first_bad is not None:
                    self.bad_utf8.add(idx)
                    warned += 1
                    if warned <= 5:
                        log.warning(
                            "%s:%d: invalid UTF-8 at byte %d; decoded with replacement characters",
                            self.names[idx],
                            *utf8.first_bad,
                        )
                continue
            _check_readable(path)
            if fmt == "csv":
                sep = "\t" if path.suffix.lower() == ".tsv" else ","
                it = readers.table_records(
                    "csv", path, cfg.text_field, 2, sep=sep, keep_default_na=False, na_values=[]
                )  # line 1 is the header
            else:
                it = readers.table_records("parquet", path, cfg.text_field, 0)
            for text, reason, line, eos in it:
                yield text, reason, idx, line, eos
        if warned > 5:
            log.warning("... %d more files with invalid UTF-8", warned - 5)


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


def resolve_inputs(inputs: list[str], forced_format: str) -> list[tuple[Path, str]]:
    """Expand paths, globs and directories (recursively, hidden entries skipped) in a stable order."""
    out: list[tuple[Path, str]] = []
    seen: set[Path] = set()
    for spec in inputs:
        if glob.has_magic(spec):
            paths = [Path(p) for p in sorted(glob.glob(spec, recursive=True)) if Path(p).is_file()]
            if not paths:
                raise UserError(f"{spec}: glob matches no files")
        elif os.path.isdir(spec):
            paths = sorted(
                p for p in Path(spec).rglob("*")
                if p.is_file() and not any(part.startswith(".") or part == "__pycache__" for part in p.relative_to(spec).parts)
            )  # fmt: skip
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
        files = resolve_inputs(cfg.inputs, cfg.format)
        source = {"kind": "files", "inputs": list(cfg.inputs), "files": len(files)}
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
