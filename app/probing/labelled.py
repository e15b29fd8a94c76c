"""Labelled texts from CSV / JSONL / Parquet (through `datasets`), checked row by row.

Every problem is one line naming the flag, the file and the row (1-based data row; for CSV the header is
line 1, so row r is line r + 1).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from app.common.errors import UserError

FORMATS = {".csv": "csv", ".jsonl": "json", ".json": "json", ".parquet": "parquet"}


@dataclass(frozen=True, slots=True)
class Labelled:
    path: Path
    texts: list[str]
    labels: list  # as given: str or int
    sha256: str  # of the file's bytes (the feature cache key)


def _load(flag: str, p: Path):
    import datasets

    fmt = FORMATS.get(p.suffix.lower())
    if fmt is None:
        raise UserError(f"--{flag} {p}: unknown format {p.suffix!r}; use one of {', '.join(FORMATS)}")
    if not p.is_file():
        raise UserError(f"--{flag} {p}: no such file")
    datasets.disable_progress_bars()
    try:
        return datasets.load_dataset(fmt, data_files=str(p), split="train")
    except Exception as e:  # datasets wraps every parser error differently; the user needs the first line
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UserError(f"--{flag} {p}: cannot read it as {fmt} ({msg})") from None


def read_labelled(flag: str, path: str, text_field: str, label_field: str) -> Labelled:
    p = Path(path)
    ds = _load(flag, p)
    for field, what in ((text_field, "--text-field"), (label_field, "--label-field")):
        if field not in ds.column_names:
            raise UserError(
                f"--{flag} {p}: no column {field!r} ({what}); columns: {', '.join(ds.column_names) or 'none'}"
            )
    if len(ds) == 0:
        raise UserError(f"--{flag} {p}: no rows")
    texts, labels = ds[text_field], ds[label_field]
    for i, (t, y) in enumerate(zip(texts, labels), start=1):
        if not isinstance(t, str):
            raise UserError(f"--{flag} {p}: row {i}: {text_field!r} is {type(t).__name__}, not text")
        if not t.strip():
            raise UserError(f"--{flag} {p}: row {i}: {text_field!r} is empty")
        if y is None or isinstance(y, float | list | dict) or (isinstance(y, str) and not y.strip()):
            raise UserError(f"--{flag} {p}: row {i}: label {y!r} is not a string or an integer")
    return Labelled(p, list(texts), list(labels), hashlib.sha256(p.read_bytes()).hexdigest())


@dataclass(frozen=True, slots=True)
class Classes:
    names: list[str]
    values: list  # the labels as given, in class-index order

    def encode(self, data: Labelled, flag: str):
        import numpy as np

        index = {v: i for i, v in enumerate(self.values)}
        for i, y in enumerate(data.labels, start=1):
            if y not in index:
                raise UserError(
                    f"--{flag} {data.path}: row {i}: label {y!r} does not occur in --train "
                    f"(its labels: {', '.join(self.names)})"
                )
        return np.asarray([index[y] for y in data.labels], dtype=np.int64)


def classes_of(train: Labelled) -> Classes:
    values = sorted(set(train.labels), key=lambda v: (isinstance(v, str), v))
    if len(values) < 2:
        raise UserError(
            f"--train {train.path}: every row has the label {values[0]!r}; a classifier needs two or more classes"
        )
    return Classes([str(v) for v in values], values)
