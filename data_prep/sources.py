"""Turn ``--input`` paths / ``--hub`` / the default corpus into one table of raw records.

Every file is read by ``datasets.load_dataset``: plain text and JSON through the ``text`` builder one
row per file (then split into documents or JSON records by ``documents.explode_files``, which can
skip and count a malformed JSON line where pyarrow's JSON reader would fail the whole file), CSV/TSV
and Parquet through their builders. The record table has columns ``text`` (string or null),
``reason`` (a skip reason decided while parsing, "" if none), ``file`` and ``line`` (for messages).

Text is decoded as UTF-8 with replacement characters; files that needed it are found by a quick
strict decode beforehand, warned about (file, line, byte) and counted per document.
"""

from __future__ import annotations

import glob
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa

from data_prep import documents, hub
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
RECORD_SCHEMA = pa.schema(
    [("text", pa.string()), ("reason", pa.string()), ("file", pa.int32()), ("line", pa.int32())]
)


@dataclass(slots=True)
class Records:
    dataset: object  # datasets.Dataset with RECORD_SCHEMA columns
    names: list[str]  # display name of each file index
    bad_utf8: list[int] = field(default_factory=list)  # file indices that needed replacement characters
    source: dict = field(default_factory=dict)  # for meta.json


def _fmt_for(path: Path, forced: str) -> str:
    if forced != "auto":
        return forced
    fmt = EXTENSIONS.get(path.suffix.lower())
    if fmt is None:
        raise UserError(
            f"{path}: unknown format (extension {path.suffix or 'none'!r}); supported: "
            f"{' '.join(sorted(EXTENSIONS))}; pass --format text to read it as plain text"
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


def _check_utf8(path: Path) -> tuple[int, int] | None:
    """(line, byte offset) of the first invalid UTF-8 byte, or None; raises UserError if unreadable."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise UserError(f"{path}: cannot read file ({exc.strerror or exc})") from exc
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as exc:
        return data.count(b"\n", 0, exc.start) + 1, exc.start
    return None


def _load(builder: str, files: list[str], cache_dir: str, **kwargs):
    import datasets

    try:
        return datasets.load_dataset(builder, data_files=files, split="train", cache_dir=cache_dir, **kwargs)
    except Exception as exc:
        where = files[0] if len(files) == 1 else f"one of {len(files)} {builder} files"
        msg = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
        cause = exc.__cause__ or exc.__context__
        if cause is not None and str(cause).strip():
            msg = str(cause).strip().splitlines()[-1]
        raise UserError(f"{where}: cannot load as {builder}: {msg}") from exc


def _table_records(ds, field_name: str, file_idx: int, where: str, first_line: int) -> pa.Table:
    """Records from a structured dataset (CSV/Parquet/Hub): the text column or nulls if not strings."""
    if field_name not in ds.column_names:
        raise UserError(
            f"{where}: no column {field_name!r} (columns: {', '.join(ds.column_names)}); pick one with --text-field"
        )
    col = ds.data.table.column(field_name).combine_chunks()
    n = len(col)
    if pa.types.is_large_string(col.type):
        col = col.cast(pa.string())
    if pa.types.is_string(col.type):
        reason = pa.array([""] * n, pa.string())
    else:
        col = pa.nulls(n, pa.string())
        reason = pa.array(["non_string_text"] * n, pa.string())
    lines = pa.array(np.arange(first_line, first_line + n, dtype=np.int32))
    return pa.Table.from_arrays(
        [col, reason, pa.array(np.full(n, file_idx, np.int32)), lines], schema=RECORD_SCHEMA
    )


def load_records(cfg: PrepConfig, cache_dir: str) -> Records:
    import datasets

    if cfg.hub:
        ds = hub.load_hub(cfg.hub, cfg.hub_config, cfg.hub_split)
        table = _table_records(ds, cfg.text_field, 0, f"hub dataset {cfg.hub}", 0)
        name = f"hub:{cfg.hub}" + (f"/{cfg.hub_config}" if cfg.hub_config else "") + f"[{cfg.hub_split}]"
        source = {"kind": "hub", "name": cfg.hub, "config": cfg.hub_config, "split": cfg.hub_split}
        return Records(datasets.Dataset(table), [name], source=source)

    tables: list = []
    names: list[str] = []
    if cfg.inputs:
        files = resolve_inputs(cfg.inputs, cfg.format)
        doc_split = cfg.doc_split
        source = {"kind": "files", "inputs": list(cfg.inputs), "files": len(files)}
    else:
        corpus = default_corpus(cfg.default_max_mb)
        files = [(p, "text") for p in corpus.files]
        doc_split = "file"
        names = [f"pydoc_data.topics[{name!r}]" for name, _ in corpus.topics]
        n = len(corpus.topics)
        tables.append(
            pa.Table.from_arrays(
                [
                    pa.array([t for _, t in corpus.topics], pa.string()),
                    pa.array([""] * n, pa.string()),
                    pa.array(np.arange(n, dtype=np.int32)),
                    pa.array(np.zeros(n, np.int32)),
                ],
                schema=RECORD_SCHEMA,
            )
        )
        source = {
            "kind": "default",
            "python": corpus.python,
            "stdlib": str(corpus.root),
            "topics": len(corpus.topics),
            "files": len(corpus.files),
            "default_max_mb": cfg.default_max_mb,
        }
    base = len(names)
    if cfg.inputs:
        names.extend(str(p) for p, _ in files)
    else:
        names.extend(f"<stdlib>/{p.relative_to(corpus.root).as_posix()}" for p, _ in files)
    datasets_ = [datasets.Dataset(pa.concat_tables(tables))] if tables else []

    # Plain text and JSON: one row per file, exploded into records in parallel.
    textlike = [(base + i, p, fmt) for i, (p, fmt) in enumerate(files) if fmt in ("text", "json")]
    bad_utf8: list[int] = []
    for idx, path, _ in textlike:
        where = _check_utf8(path)
        if where is not None:
            bad_utf8.append(idx)
            if len(bad_utf8) <= 5:
                log.warning(
                    "%s:%d: invalid UTF-8 at byte %d; decoded with replacement characters", names[idx], *where
                )
    if len(bad_utf8) > 5:
        log.warning("... %d more files with invalid UTF-8", len(bad_utf8) - 5)
    if textlike:
        rows = _load(
            "text", [str(p) for _, p, _ in textlike], cache_dir,
            sample_by="document", keep_linebreaks=True, encoding_errors="replace",
        )  # fmt: skip
        if len(rows) != len(textlike):
            raise RuntimeError(f"text builder returned {len(rows)} rows for {len(textlike)} files")
        rows = rows.add_column("file", np.array([i for i, _, _ in textlike], np.int32))
        is_json = {i for i, _, fmt in textlike if fmt == "json"}
        datasets_.append(
            documents.explode_files(
                rows, is_json=is_json, doc_split=doc_split, text_field=cfg.text_field, num_proc=cfg.num_proc
            )
        )

    for idx, (path, fmt) in enumerate(files, start=base):
        if fmt in ("text", "json"):
            continue
        _check_readable(path)
        if fmt == "csv":
            sep = "\t" if path.suffix.lower() == ".tsv" else ","
            ds = _load("csv", [str(path)], cache_dir, sep=sep, keep_default_na=False, na_values=[])
            table = _table_records(ds, cfg.text_field, idx, str(path), 2)  # line 1 is the header
        else:
            ds = _load("parquet", [str(path)], cache_dir)
            table = _table_records(ds, cfg.text_field, idx, str(path), 0)
        datasets_.append(datasets.Dataset(table))

    records = datasets.concatenate_datasets(datasets_) if len(datasets_) > 1 else datasets_[0]
    return Records(records, names, bad_utf8, source)


def _check_readable(path: Path) -> None:
    try:
        with open(path, "rb") as f:
            f.read(1)
    except OSError as exc:
        raise UserError(f"{path}: cannot read file ({exc.strerror or exc})") from exc
