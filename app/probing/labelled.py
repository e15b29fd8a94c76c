"""Labelled texts from CSV / JSONL / Parquet (through `datasets`), checked row by row.

Every problem is one line naming the flag, the file and the row (1-based data row; for CSV the header is
line 1, so row r is line r + 1). A CSV or JSON file that is not UTF-8 (a Latin-1 export) is refused naming the
first bad byte's line, found by data prep's scan (`data_prep.csv_rows.scan`), before `datasets` reads it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from app.common.errors import UserError
from app.common.text import DEFAULT_TEXT_FIELD, SAMPLE_ROWS, text_column
from data_prep import csv_rows, readers

FORMATS = {".csv": "csv", ".jsonl": "json", ".json": "json", ".parquet": "parquet"}


@dataclass(frozen=True, slots=True)
class Labelled:
    path: Path
    texts: list[str]
    labels: list  # as given: str or int
    sha256: str  # of the file's bytes (the feature cache key)
    text_field: str = DEFAULT_TEXT_FIELD  # the column the texts came from
    multi_label: bool = False  # labels: a tuple of label names per row (app/probing/multilabel.py)


def _load(flag: str, p: Path):
    import datasets

    fmt = FORMATS.get(p.suffix.lower())
    if fmt is None:
        raise UserError(f"--{flag} {p}: unknown format {p.suffix!r}; use one of {', '.join(FORMATS)}")
    if not p.is_file():
        raise UserError(f"--{flag} {p}: no such file")
    if fmt in ("csv", "json"):
        _check_utf8(flag, p)
    if fmt == "parquet":  # a file that is not Parquet: our one line, before `datasets` logs its own
        _check_parquet(flag, p)
    datasets.disable_progress_bars()
    try:
        return datasets.load_dataset(fmt, data_files=str(p), split="train")
    except Exception as e:  # datasets wraps every parser error differently; the user needs the first line
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UserError(f"--{flag} {p}: cannot read it as {fmt} ({msg})") from None


def _check_parquet(flag: str, p: Path) -> None:
    import pyarrow.parquet as pq

    try:
        pq.ParquetFile(p).schema_arrow  # noqa: B018 - reading the footer is the check
    except Exception as e:  # pyarrow raises several kinds for a file that is not Parquet
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UserError(f"--{flag} {p}: cannot read it as parquet ({msg})") from None


def _check_utf8(flag: str, p: Path) -> None:
    """Refuse (one line) a text file with a byte that is not UTF-8, naming its line, offset and value."""
    utf8 = readers.Utf8State()
    try:
        csv_rows.scan(p, utf8)
    except OSError as e:
        raise UserError(f"--{flag} {p}: cannot read it ({e.strerror or e})") from None
    if utf8.first_bad is None:
        return
    line, offset = utf8.first_bad
    with p.open("rb") as f:
        f.seek(offset)
        byte = f.read(1)
    raise UserError(
        f"--{flag} {p}: line {line}: byte {offset} (0x{byte.hex()}) is not UTF-8 (a file saved as Latin-1 or "
        f"Windows-1252?): save it as UTF-8, e.g. iconv -f latin1 -t utf-8 {p} > utf8{p.suffix}"
    )


def _missing(y) -> bool:
    """An empty label cell: None, or NaN (pandas reads an integer column with an empty cell as floats)."""
    return y is None or (isinstance(y, float) and y != y) or (isinstance(y, str) and not y.strip())


def _text_column(ds, text_field: str, label_fields: list[str], say: Callable[[str], None] | None) -> str:
    """`text_field`, or where that is the default `text` and the file has no such column, its one column of
    text besides the labels (GLUE/SST's `sentence`; app.common.text.text_column, app/classify.py's rule
    too), said in one line through `say`."""
    head = ds.select(range(min(SAMPLE_ROWS, len(ds))))
    sample = {c: head[c] for c in ds.column_names}
    column, said = text_column(text_field, ds.column_names, sample, label_fields)
    if said is not None and say is not None:
        say(said)
    return column


def read_labelled(
    flag: str,
    path: str,
    text_field: str,
    label_field: str | list[str],
    say: Callable[[str], None] | None = None,
    multi: bool | None = None,
) -> Labelled:
    """The texts and labels of one file; a missing default `text` column is its only string column (said
    through `say`: pass it for the first file read, whose column the others then name). Several label
    fields, or one whose values are lists, make a multi-label set (`multi` None: found out from the file;
    True/False: as --train was read)."""
    fields = [label_field] if isinstance(label_field, str) else list(label_field)
    p = Path(path)
    ds = _load(flag, p)
    text_field = _text_column(ds, text_field, fields, say)
    for field, what in ((text_field, "--text-field"), *((f, "--label-field") for f in fields)):
        if field not in ds.column_names:
            raise UserError(
                f"--{flag} {p}: no column {field!r} ({what}); columns: {', '.join(ds.column_names) or 'none'}"
            )
    if len(ds) == 0:
        raise UserError(f"--{flag} {p}: no rows")
    texts = ds[text_field]
    for i, t in enumerate(texts, start=1):
        if not isinstance(t, str):
            raise UserError(f"--{flag} {p}: row {i}: {text_field!r} is {type(t).__name__}, not text")
        if not t.strip():
            raise UserError(f"--{flag} {p}: row {i}: {text_field!r} is empty")
    columns = [ds[f] for f in fields]
    if multi is None:
        multi = len(fields) > 1 or any(isinstance(v, list) for v in columns[0])
    labels = (
        _multi_labels(columns, fields, f"--{flag} {p}")
        if multi
        else _single_labels(columns[0], fields[0], flag, p)
    )
    return Labelled(p, list(texts), labels, hashlib.sha256(p.read_bytes()).hexdigest(), text_field, multi)


def _single_labels(labels: list, field: str, flag: str, p: Path) -> list:
    empty = next((i for i, y in enumerate(labels, start=1) if _missing(y)), None)
    if empty is not None:  # before the types: its NaN makes every integer of the column a float
        raise UserError(f"--{flag} {p}: row {empty}: the label ({field!r}) is empty")
    for i, y in enumerate(labels, start=1):
        if y is None or isinstance(y, float | list | dict) or (isinstance(y, str) and not y.strip()):
            raise UserError(f"--{flag} {p}: row {i}: label {y!r} is not a string or an integer")
    return list(labels)


def _multi_labels(columns: list[list], fields: list[str], where: str) -> list[tuple[str, ...]]:
    """Each row's labels (a tuple of names): the indicator columns that are on, or the list column's."""
    from app.probing.multilabel import indicator, list_labels

    if len(fields) == 1:
        return [list_labels(v, fields[0], i, where) for i, v in enumerate(columns[0], start=1)]
    return [
        tuple(f for f, v in zip(fields, row) if indicator(v, f, i, where))
        for i, row in enumerate(zip(*columns), start=1)
    ]


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
