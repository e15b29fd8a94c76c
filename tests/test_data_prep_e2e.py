"""End-to-end runs on the embedded default corpus: contract, invariants, determinism, format checks."""

from __future__ import annotations

import hashlib
import json
import pickle
from pathlib import Path

import numpy as np
import pytest

from data_prep.cli import main as prep_main
from data_prep.format import FORMAT_VERSION, SPLITS, PreparedDataError, load_prepared
from data_prep.tokenizer import ByteTokenizer, SentencePieceTokenizer, load_tokenizer_from_dir

META_KEYS = {
    "format_version", "tokenizer", "splits", "skipped", "buckets", "padding_efficiency",
    "padding_efficiency_unbucketed", "source", "command", "max_seq_len",
}  # fmt: skip


def _check_prepared(path: Path) -> None:
    data = load_prepared(path)
    meta = data.meta
    assert set(meta) >= META_KEYS
    assert meta["format_version"] == FORMAT_VERSION
    tok = load_tokenizer_from_dir(path)
    assert tok.pad_id == meta["tokenizer"]["pad_id"] == 0
    assert len(tok.token_bytes) == tok.vocab_size == meta["tokenizer"]["vocab_size"]
    bounds = meta["buckets"]
    assert bounds == sorted(bounds) and len(set(bounds)) == len(bounds)
    assert 0 < meta["padding_efficiency_unbucketed"] <= meta["padding_efficiency"] <= 1
    for name in SPLITS:
        ds = data.split(name)
        assert set(ds.column_names) == {"input_ids", "length", "num_bytes", "bucket", "doc_id"}
        assert str(ds.features["input_ids"].feature.dtype) == "int32"
        lengths, buckets, nbytes = (
            np.asarray(ds.data.table.column(c)) for c in ("length", "bucket", "num_bytes")
        )
        stats = meta["splits"][name]
        assert len(ds) == stats["examples"] and int(lengths.sum()) == stats["tokens"]
        assert int(nbytes.sum()) == stats["bytes"]
        flat_ids = np.asarray(ds.data.table.column("input_ids").combine_chunks().flatten())
        assert stats["docs"] == int(
            (flat_ids == tok.eos_id).sum()
        )  # one EOS per document (duplicates included)
        if len(ds) == 0:
            continue
        assert lengths.min() >= 1 and lengths.max() <= meta["max_seq_len"]
        # bucket = smallest i with length <= bounds[i]
        b = np.asarray(bounds)
        assert (lengths <= b[buckets]).all()
        assert ((buckets == 0) | (lengths > b[np.maximum(buckets - 1, 0)])).all()
        # per example: num_bytes is the UTF-8 size of what the tokens decode to; EOS ends each document
        docs: dict[int, list[int]] = {}
        for row in ds.select(range(min(len(ds), 400))):
            ids = row["input_ids"]
            assert len(ids) == row["length"] and ids.count(tok.eos_id) <= 1
            assert tok.bos_id not in ids and tok.pad_id not in ids
            assert int(tok.token_bytes[ids].sum()) == row["num_bytes"]
            docs.setdefault(row["doc_id"], []).extend(ids)
        for ids in list(docs.values())[:-1]:  # the last may be cut by the 400-row window
            assert ids[-1] == tok.eos_id and tok.eos_id not in ids[:-1]
            assert len(tok.decode(ids).encode("utf-8")) == int(tok.token_bytes[ids].sum())


def test_default_corpus_sentencepiece(prepared_dir):
    _check_prepared(prepared_dir)
    meta = load_prepared(prepared_dir).meta
    assert meta["tokenizer"]["type"] == "sentencepiece" and meta["tokenizer"]["vocab_size"] == 384
    assert (
        meta["source"]["kind"] == "default" and meta["source"]["topics"] > 0 and meta["source"]["files"] > 0
    )
    assert all(meta["splits"][s]["docs"] > 0 for s in SPLITS)
    assert load_prepared(prepared_dir).tokenizer_path == prepared_dir / "tokenizer.model"


def test_default_corpus_byte(prepared_byte_dir, prepared_dir):
    _check_prepared(prepared_byte_dir)
    meta = load_prepared(prepared_byte_dir).meta
    assert meta["tokenizer"]["vocab_size"] == 259 and meta["tokenizer"]["model_file"] is None
    assert not (prepared_byte_dir / "tokenizer.model").exists()
    # same documents, same splits, whatever the tokenizer
    spm_meta = load_prepared(prepared_dir).meta
    for s in SPLITS:
        assert (
            meta["splits"][s]["bytes"]
            == spm_meta["splits"][s]["bytes"]
            == meta["splits"][s]["tokens"] - meta["splits"][s]["docs"]
        )


def _tree_hash(path: Path) -> dict[str, str]:
    return {
        str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(path.rglob("*"))
        if p.is_file()
    }


def test_same_command_gives_identical_bytes(tmp_path, prepared_dir):
    out = tmp_path / "again"
    args = [
        "--out",
        str(out),
        "--vocab-size",
        "384",
        "--default-max-mb",
        "0.3",
        "--max-seq-len",
        "64",
        "--num-proc",
        "2",
        "--quiet",
    ]
    assert prep_main(args) == 0
    first = _tree_hash(out)
    # the fixture ran the same command into another directory: only meta.json (its command) may differ
    other = _tree_hash(prepared_dir)
    assert {k for k in first if first[k] != other.get(k)} == {"meta.json"}
    assert prep_main([*args, "--overwrite"]) == 0
    second = _tree_hash(out)
    assert {k for k in first if first[k] != second[k]} == {"meta.json"}  # --overwrite is in the command
    m1, m2 = json.loads((prepared_dir / "meta.json").read_text()), json.loads((out / "meta.json").read_text())
    assert {k for k in m1 if m1[k] != m2[k]} == {"command"}


def test_format_version_mismatch_says_rerun(tmp_path, prepared_byte_dir):
    import shutil

    copy = tmp_path / "old"
    shutil.copytree(prepared_byte_dir, copy)
    meta = json.loads((copy / "meta.json").read_text())
    meta["format_version"] = FORMAT_VERSION + 1
    (copy / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(
        PreparedDataError,
        match=rf"format_version {FORMAT_VERSION + 1}, this version reads {FORMAT_VERSION}: re-run `python -m data_prep",
    ):
        load_prepared(copy)
    (copy / "meta.json").write_text("{not json")
    with pytest.raises(PreparedDataError, match="corrupt"):
        load_prepared(copy)
    with pytest.raises(PreparedDataError, match="does not exist"):
        load_prepared(tmp_path / "missing")


def test_tokenizers_pickle_and_roundtrip(prepared_dir):
    text = "def f(x):\n\treturn  x  # caf\u00e9 \ufb01 \U0001f600\r\n\n    \u00a0end "
    for tok in (load_tokenizer_from_dir(prepared_dir), ByteTokenizer()):
        clone = pickle.loads(pickle.dumps(tok))
        ids = clone.encode(text)
        assert ids == tok.encode(text) == tok.encode_batch([text, "x"])[0]
        assert tok.decode(ids) == text
        assert tok.decode([tok.bos_id, *ids, tok.eos_id, tok.pad_id]) == text
        assert int(tok.token_bytes[ids].sum()) == len(text.encode("utf-8"))
    assert isinstance(load_tokenizer_from_dir(prepared_dir), SentencePieceTokenizer)


def test_a_long_file_says_why_it_became_several_documents(tmp_path, capsys):
    """A 1.1 MB text with line breaks, read as one document (--doc-split file), is 2 documents: parts of at
    most PART_CHARS characters cut at line ends. The summary and meta.json say so (the model card too:
    tests/test_checkpoints_model_card.py), and a file under the size says nothing."""
    from data_prep.readers import PART_CHARS

    line = "To be, or not to be, that is the question.\n"
    big = tmp_path / "play.txt"
    big.write_text(line * (1_100_000 // len(line)))
    small = tmp_path / "note.txt"
    small.write_text(line * 50)
    out = tmp_path / "data"
    assert prep_main(["--input", str(big), str(small), "--tokenizer", "byte", "--out", str(out)]) == 0
    said = capsys.readouterr().out
    meta = json.loads((out / "meta.json").read_text())
    assert meta["documents"]["kept"] == 3
    assert meta["documents"]["long_documents_cut"] == {"documents": 1, "parts": 2, "part_chars": PART_CHARS}
    assert f"2 of them are parts of 1 document(s) over {PART_CHARS:,} characters, cut at line ends" in said
