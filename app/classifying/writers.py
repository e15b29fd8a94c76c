"""The output's rows in CSV, JSON Lines or Parquet: one part file per chunk, then the parts joined in order.

Columns: `row` (the input's 1-based row), the --keep-fields, `predicted` (the class; multi-label: every
label at or over its threshold, a list in JSONL and Parquet; in CSV the labels joined with ";", a ";" or
"\\" inside a label escaped with a "\\" before it, so a label `a;b` reads `a\\;b`: `split_labels` reads it
back), `p_<label>` (each class's or label's probability) and `neuron_<n>` (the value of feature column n,
the classifier's strongest first). Numbers are float32, written as the shortest decimal that reads back
to the same float32, so equal arrays give equal bytes. Parquet keeps a Parquet input's --keep-fields
types; other inputs' kept values are text there (JSON for a JSONL number or object).
"""

from __future__ import annotations

import contextlib
import csv
import errno
import io
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from app.common.errors import UserError


@dataclass(frozen=True, slots=True)
class Columns:
    keep: list[str]
    labels: list[str]
    multi_label: bool
    neurons: list[int]
    kept_types: dict  # Parquet input: the --keep-fields' arrow types

    label_column = "predicted"

    def names(self) -> list[str]:
        return [
            "row",
            *self.keep,
            self.label_column,
            *(f"p_{n}" for n in self.labels),
            *(f"neuron_{n}" for n in self.neurons),
        ]

    def check(self) -> None:
        """A --keep-fields column named like one the output writes is one line."""
        made = set(self.names()[1 + len(self.keep) :]) | {"row"}
        clash = [k for k in self.keep if k in made]
        if clash:
            raise UserError(f"--keep-fields {', '.join(clash)}: the output writes a column of that name")

    def arrow_schema(self):
        import pyarrow as pa

        label = pa.list_(pa.string()) if self.multi_label else pa.string()
        fields = [pa.field("row", pa.int64())]
        fields += [pa.field(k, self.kept_types.get(k, pa.string())) for k in self.keep]
        fields += [pa.field(self.label_column, label)]
        fields += [pa.field(f"p_{n}", pa.float32()) for n in self.labels]
        fields += [pa.field(f"neuron_{n}", pa.float32()) for n in self.neurons]
        return pa.schema(fields)


@dataclass(frozen=True, slots=True)
class Rows:
    """One chunk's classified rows, in input order."""

    number: np.ndarray  # (n,) int64
    kept: list[dict]
    labels: list  # per row: a class name, or a list of label names
    probs: np.ndarray  # (n, K) float32
    neurons: np.ndarray  # (n, t) float32


def join_labels(labels: list[str]) -> str:
    """A multi-label CSV cell: the labels joined with ";", each ";" and "\\" in a label escaped by a "\\"."""
    return ";".join(s.replace("\\", "\\\\").replace(";", "\\;") for s in labels)


def split_labels(cell: str) -> list[str]:
    """`join_labels`' cell -> the labels (the reading docs/classify.md shows)."""
    labels, cur, escape = [], [], False
    for c in cell:
        if escape:
            cur.append(c)
            escape = False
        elif c == "\\":
            escape = True
        elif c == ";":
            labels.append("".join(cur))
            cur = []
        else:
            cur.append(c)
    return [*labels, "".join(cur)] if cell else []


def _floats(a: np.ndarray) -> list[list[str]]:
    return [[str(v) for v in row] for row in a.astype(np.float32)]


def _text(v: object) -> str | None:
    return v if v is None or isinstance(v, str) else json.dumps(v, ensure_ascii=False, default=str)


def part_bytes(kind: str, cols: Columns, rows: Rows) -> bytes:
    """A part's content in `kind` (csv and jsonl: no header; parquet: a whole file)."""
    probs, neurons = _floats(rows.probs), _floats(rows.neurons)
    if kind == "csv":
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        for i, n in enumerate(rows.number):
            label = join_labels(rows.labels[i]) if cols.multi_label else rows.labels[i]
            kept = ["" if rows.kept[i][k] is None else _text(rows.kept[i][k]) for k in cols.keep]
            w.writerow([int(n), *kept, label, *probs[i], *neurons[i]])
        return buf.getvalue().encode("utf-8")
    if kind == "jsonl":
        names = cols.names()[1 + len(cols.keep) + 1 :]
        lines = []
        for i, n in enumerate(rows.number):
            rec = {"row": int(n), **rows.kept[i], cols.label_column: rows.labels[i]}
            rec.update(zip(names, (float(v) for v in [*probs[i], *neurons[i]])))
            lines.append(json.dumps(rec, ensure_ascii=False, default=str) + "\n")
        return "".join(lines).encode("utf-8")
    return _parquet_part(cols, rows)


def _parquet_part(cols: Columns, rows: Rows) -> bytes:
    import pyarrow as pa
    import pyarrow.parquet as pq

    data = {"row": rows.number.astype(np.int64)}
    for k in cols.keep:
        values = [r[k] for r in rows.kept]
        data[k] = values if k in cols.kept_types else [_text(v) for v in values]
    data[cols.label_column] = rows.labels
    for j, n in enumerate(cols.labels):
        data[f"p_{n}"] = rows.probs[:, j].astype(np.float32)
    for j, n in enumerate(cols.neurons):
        data[f"neuron_{n}"] = rows.neurons[:, j].astype(np.float32)
    table = pa.table(data, schema=cols.arrow_schema())
    buf = pa.BufferOutputStream()
    pq.write_table(table, buf)
    return buf.getvalue().to_pybytes()


def join_parts(kind: str, cols: Columns, parts: list[Path], out: Path) -> None:
    """Write `out` (a fresh file: the caller renames it into place) from the parts, in order."""
    if kind == "parquet":
        import pyarrow.parquet as pq

        with pq.ParquetWriter(out, cols.arrow_schema()) as w:
            for p in parts:
                w.write_table(pq.read_table(p, schema=cols.arrow_schema()))
        return
    with out.open("wb") as f:
        if kind == "csv":
            buf = io.StringIO()
            csv.writer(buf, lineterminator="\n").writerow(cols.names())
            f.write(buf.getvalue().encode("utf-8"))
        for p in parts:
            with p.open("rb") as src:
                shutil.copyfileobj(src, f, 1 << 20)


def join_features(parts: list[Path], widths: tuple[int, int], out: Path) -> None:
    """The parts' float32 feature rows (each a .npy) as one .npy of (rows, width), written part by part."""
    rows, width = widths
    if rows == 0:
        with out.open("wb") as f:
            np.save(f, np.zeros((0, width), dtype=np.float32), allow_pickle=False)
        return
    arr = np.lib.format.open_memmap(out, mode="w+", dtype=np.float32, shape=(rows, width))
    with out.open("r+b") as f, contextlib.suppress(AttributeError):  # (no posix_fallocate: not Linux)
        try:  # the room taken now: a full disk is ENOSPC here, not a SIGBUS in the copy below
            os.posix_fallocate(f.fileno(), 0, f.seek(0, 2))
        except OSError as e:
            if e.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):  # a file system without it
                raise
    at = 0
    for p in parts:
        a = np.load(p, allow_pickle=False)
        arr[at : at + len(a)] = a
        at += len(a)
    arr.flush()
    del arr
