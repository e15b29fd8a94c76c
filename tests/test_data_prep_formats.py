"""Every input format (compressed included) x --doc-split x --num-proc x tokenizer, on real text we did not write.

The public-domain novels in tests/fixtures/corpora and their format variants (tests/corpus_variants.py),
cut to a slice so the matrix stays cheap; expected counts come from a plain reference reading of each file,
and compressed variants must give byte-identical shards to their plain twins.
"""

from __future__ import annotations

import csv
import gzip
import hashlib
import json
import lzma
import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard
from corpus_variants import write_variants

from data_prep.cli import main as prep_main
from data_prep.format import SPLITS, load_prepared

TEXT_SLICE = 60_000  # characters of each novel
ROWS = 120


def _compress(src: Path) -> list[Path]:
    data = src.read_bytes()
    out = []
    for ext, fn in (
        (".gz", lambda b: gzip.compress(b, mtime=0)),
        (".xz", lzma.compress),
        (".zst", zstandard.ZstdCompressor().compress),
    ):
        p = src.with_name(src.name + ext)
        p.write_bytes(fn(data))
        out.append(p)
    return out


@pytest.fixture(scope="module")
def variants(tmp_path_factory) -> dict[str, Path]:
    full = tmp_path_factory.mktemp("variants_full")
    write_variants(full)
    d = tmp_path_factory.mktemp("variants")
    v: dict[str, Path] = {}
    # text: the English book as shipped (BOM, CRLF) and with blank-line paragraphs, and Japanese lines
    for name, src in (("en", "botchan.txt"), ("en_para", "botchan_paragraphs.txt"), ("ja", "wagahaiwa.txt")):
        raw = (full / src).read_bytes()[: TEXT_SLICE * 3]
        text = raw.decode("utf-8", errors="ignore")[:TEXT_SLICE]
        p = d / f"{name}.txt"
        p.write_bytes(text.encode("utf-8"))
        v[name] = p
    for p in _compress(v["en_para"]):
        v["en_para" + p.suffix] = p
    rows = [json.loads(line) for line in (full / "rows.jsonl").read_text(encoding="utf-8").splitlines()]
    rows = rows[: ROWS // 2] + rows[-ROWS // 2 :]  # English and Japanese rows
    v["jsonl"] = d / "rows.jsonl"
    v["jsonl"].write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    for p in _compress(v["jsonl"]):
        v["jsonl" + p.suffix] = p
    v["json_array"] = d / "array.json"
    v["json_array"].write_text(json.dumps(rows, ensure_ascii=False, indent=1), encoding="utf-8")
    for name, delim in (("csv", ","), ("tsv", "\t")):
        v[name] = d / f"rows.{name}"
        with open(v[name], "w", encoding="utf-8", newline="") as f:
            w = csv.DictWriter(f, fieldnames=["id", "text", "lang"], delimiter=delim)
            w.writeheader()
            w.writerows(rows)
    v["parquet"] = d / "rows.parquet"
    pq.write_table(pa.Table.from_pylist(rows), v["parquet"])
    v["_rows"] = rows  # type: ignore[assignment]
    return v


def _reference_docs(path: Path, doc_split: str) -> list[str]:
    """What each document should be: the whole file read at once, split as the documentation says."""
    text = path.read_bytes().decode("utf-8", errors="replace").replace("\r\n", "\n").replace("\r", "\n")
    text = text.removeprefix("\ufeff")  # a byte-order mark is no text (data_prep.readers drops it)
    if doc_split == "file":
        docs = [text]
    elif doc_split == "line":
        docs = text.split("\n")
    else:
        docs = re.split(r"\n(?:[ \t\r\f\v]*\n)+", text)
        docs = [d.rstrip("\n") for d in docs]
    return [d for d in docs if d.strip()]


def _shard_hashes(out: Path) -> dict[str, str]:
    return {
        str(p.relative_to(out)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(out.rglob("*.arrow"))
    }


def _prep(src: Path, out: Path, *extra: str) -> dict:
    args = ["--input", str(src), "--out", str(out), "--block-mb", "0.01", "--max-seq-len", "64", "--quiet"]
    assert prep_main([*args, *extra]) == 0
    return load_prepared(out).meta


def _check_counts(meta: dict, docs: list[str]) -> None:
    assert meta["documents"]["kept"] == len(docs)
    assert sum(meta["splits"][s]["bytes"] for s in SPLITS) == sum(len(d.encode()) for d in docs)
    assert all(meta["splits"][s]["examples"] > 0 for s in SPLITS)


@pytest.mark.parametrize("doc_split", ["file", "paragraph", "line"])
@pytest.mark.parametrize("name", ["en", "en_para", "ja"])
def test_text_doc_split_and_workers(variants, tmp_path, name, doc_split):
    """Counts agree with a whole-file reading; --num-proc 1 and 2 write the same bytes."""
    src = variants[name]
    m1 = _prep(src, tmp_path / "p1", "--tokenizer", "byte", "--doc-split", doc_split, "--num-proc", "1")
    m2 = _prep(src, tmp_path / "p2", "--tokenizer", "byte", "--doc-split", doc_split, "--num-proc", "2")
    _check_counts(m1, _reference_docs(src, doc_split))
    assert _shard_hashes(tmp_path / "p1") == _shard_hashes(tmp_path / "p2")
    assert {k for k in m1 if m1[k] != m2[k]} == {"command"}


@pytest.mark.parametrize("ext", [".gz", ".xz", ".zst"])
@pytest.mark.parametrize("doc_split", ["file", "paragraph", "line"])
def test_compressed_text_equals_plain(variants, tmp_path, ext, doc_split):
    plain = _prep(variants["en_para"], tmp_path / "plain", "--tokenizer", "byte", "--doc-split", doc_split)
    packed = _prep(
        variants["en_para" + ext], tmp_path / "packed", "--tokenizer", "byte", "--doc-split", doc_split
    )
    assert _shard_hashes(tmp_path / "plain") == _shard_hashes(tmp_path / "packed")
    assert (
        plain["splits"] == packed["splits"]
        and plain["source"]["fingerprint"] == packed["source"]["fingerprint"]
    )


@pytest.mark.parametrize("num_proc", ["1", "2"])
@pytest.mark.parametrize(
    "name", ["jsonl", "jsonl.gz", "jsonl.xz", "jsonl.zst", "json_array", "csv", "tsv", "parquet"]
)
def test_row_formats(variants, tmp_path, name, num_proc):
    meta = _prep(variants[name], tmp_path / "o", "--tokenizer", "byte", "--num-proc", num_proc)
    _check_counts(meta, [r["text"] for r in variants["_rows"] if r["text"].strip()])
    ref = tmp_path / "ref"
    _prep(variants["jsonl"], ref, "--tokenizer", "byte", "--num-proc", "1")
    if name.startswith("jsonl"):  # compressed or not, workers or not: the same bytes
        assert _shard_hashes(tmp_path / "o") == _shard_hashes(ref)
    # any format: the same examples (JSON Lines rows are cut into blocks by their raw size, the others
    # by their text's, so the Arrow record batches may be cut elsewhere)
    for s in SPLITS:
        got, want = load_prepared(tmp_path / "o").split(s), load_prepared(ref).split(s)
        assert got.data.table.equals(want.data.table)


@pytest.mark.parametrize(
    "name,doc_split",
    [("en_para", "paragraph"), ("ja", "line"), ("en_para.zst", "paragraph"), ("jsonl.gz", "file")],
)
def test_sentencepiece_on_real_text(variants, tmp_path, name, doc_split):
    """A trained tokenizer, two workers: documents decode back to the reference text exactly."""
    from data_prep.tokenizer import load_tokenizer_from_dir

    out = tmp_path / "o"
    vocab = "2500" if name.startswith("ja") or name.startswith("jsonl") else "400"
    meta = _prep(variants[name], out, "--vocab-size", vocab, "--doc-split", doc_split, "--num-proc", "2")
    data, tok = load_prepared(out), load_tokenizer_from_dir(out)
    assert meta["tokenizer"]["type"] == "sentencepiece"
    decoded = []
    for s in SPLITS:  # the token stream of a split, cut at EOS, is its documents in input order
        ids = np.concatenate([np.asarray(x, np.int64) for x in data.split(s)["input_ids"]] or [np.zeros(0)])
        ends = np.flatnonzero(ids == tok.eos_id)
        decoded += [tok.decode(d.tolist()) for d in np.split(ids, ends + 1)[: len(ends)]]
    if name.startswith("jsonl"):
        expected = [r["text"] for r in variants["_rows"] if r["text"].strip()]
    else:
        expected = _reference_docs(variants[name.split(".")[0]], doc_split)
    assert sorted(decoded) == sorted(expected)
    lengths = np.concatenate([np.asarray(data.split(s).data.column("length")) for s in SPLITS])
    assert lengths.max() <= 64 and lengths.sum() == sum(meta["splits"][s]["tokens"] for s in SPLITS)


def test_sentencepiece_output_is_the_same_for_any_worker_count(variants, tmp_path):
    """Tokenizer training and encoding: --num-proc 1, 2 and 3 write identical bytes, across several
    shard groups (the workers' spilled blocks are appended in input order whichever finishes first)."""
    common = ("--vocab-size", "400", "--doc-split", "paragraph", "--shard-mb", "0.02")
    metas = {n: _prep(variants["en_para"], tmp_path / f"p{n}", *common, "--num-proc", n) for n in "123"}
    manifest = json.loads((tmp_path / "p1" / "manifest.json").read_text())
    assert len(manifest["groups"]) >= 3
    for n in "23":
        assert (tmp_path / "p1" / "tokenizer.model").read_bytes() == (
            tmp_path / f"p{n}" / "tokenizer.model"
        ).read_bytes()
        assert _shard_hashes(tmp_path / "p1") == _shard_hashes(tmp_path / f"p{n}")
        assert json.loads((tmp_path / f"p{n}" / "manifest.json").read_text()) == manifest
        assert {k for k in metas["1"] if metas["1"][k] != metas[n][k]} == {"command"}
