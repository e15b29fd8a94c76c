"""Write the output directory: splits, tokenizer, meta.json; atomically, and byte-identically for equal inputs.

Everything is written into a sibling temporary directory first and renamed into place at the end,
so a failed or interrupted run never leaves a half-written dataset that looks valid. Each split is
saved from a fresh in-memory table with a fingerprint derived from the run's content, so
``state.json``/``dataset_info.json`` carry no random ids, timestamps or input paths.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pyarrow as pa

from data_prep.errors import UserError
from data_prep.format import META_FILE, TOKENIZER_FILE, features


def check_out_dir(out: Path, overwrite: bool) -> None:
    """Fail before any work if ``out`` cannot be written (user error, one line)."""
    if out.exists() and not out.is_dir():
        raise UserError(f"{out}: --out exists and is not a directory")
    if out.is_dir() and any(out.iterdir()):
        if not overwrite:
            raise UserError(
                f"{out}: --out is not empty; pass --overwrite to replace it, or choose another --out"
            )
        if not (out / META_FILE).is_file():
            raise UserError(
                f"{out}: refusing to --overwrite a non-empty directory that is not a data_prep output (no {META_FILE})"
            )
    parent = out.resolve().parent
    if not os.access(parent if parent.exists() else Path.cwd(), os.W_OK):
        raise UserError(f"{parent}: cannot write here (permission denied) for --out {out}")


def write_output(
    out: Path, splits: dict[str, pa.Table], model_proto: bytes | None, meta: dict[str, Any], fingerprint: str
) -> None:
    import datasets

    out = out.resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        feats = features()
        for name, table in splits.items():
            table = table.select(list(feats)).cast(feats.arrow_schema)
            info = datasets.DatasetInfo(
                description="mlstm-ds prepared data; see ../meta.json", features=feats
            )
            fp = hashlib.blake2b(f"{fingerprint}-{name}".encode(), digest_size=8).hexdigest()
            ds = datasets.Dataset(datasets.table.InMemoryTable(table), info=info, split=name, fingerprint=fp)
            ds.save_to_disk(str(tmp / name))
        if model_proto is not None:
            (tmp / TOKENIZER_FILE).write_bytes(model_proto)
        (tmp / META_FILE).write_text(json.dumps(meta, indent=2, sort_keys=False) + "\n", encoding="utf-8")
        if out.exists():
            old = out.with_name(f".{out.name}.old-{os.getpid()}")
            out.rename(old)
            tmp.rename(out)
            shutil.rmtree(old)
        else:
            tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
