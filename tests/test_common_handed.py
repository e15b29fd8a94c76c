"""A handed-over folder is read only inside itself, and the numbers its JSON gives are checked first."""

from __future__ import annotations

import pytest

from app.common.errors import UserError
from app.common.handed import check_vocab, count, member
from data_prep.tokenizer import ByteTokenizer, SentencePieceTokenizer


def test_a_name_is_read_only_inside_the_folder(tmp_path):
    root, outside = tmp_path / "data", tmp_path / "outside.arrow"
    (root / "train").mkdir(parents=True)
    (root / "train" / "00000.arrow").write_text("in")
    outside.write_text("out")
    (root / "train" / "link.arrow").symlink_to(outside)
    (root / "train" / "inner.arrow").symlink_to(root / "train" / "00000.arrow")
    file = root / "manifest.json"
    assert member(root, "train/00000.arrow", file, "f") == root / "train" / "00000.arrow"
    assert member(root, "train/inner.arrow", file, "f") == root / "train" / "inner.arrow"  # a link inside
    assert member(root, "train/../train/00000.arrow", file, "f").read_text() == "in"
    for name, why in (
        ("../outside.arrow", "points outside"),
        (str(outside), "is an absolute path"),
        ("train/link.arrow", "points outside"),  # symbolic links count
        (".", "points outside"),
        ("", "must be a file name"),
        (None, "must be a file name"),
        (["train/00000.arrow"], "must be a file name"),
    ):
        with pytest.raises(UserError) as e:
            member(root, name, file, "groups[0].files.train.name")
        assert str(e.value).startswith(f"{file}: groups[0].files.train.name ") and why in str(e.value), name


def test_counts_are_integers_within_bounds(tmp_path):
    f = tmp_path / "meta.json"
    assert count(64, f, "max_seq_len", 1, 1 << 20) == 64
    for bad in (0, 10**12, 1.5, True, "64", None):
        with pytest.raises(UserError, match=r"meta.json: max_seq_len must be an integer in \[1, 1,048,576\]"):
            count(bad, f, "max_seq_len", 1, 1 << 20)


def test_the_vocabulary_is_the_tokenizer_files(prepared_dir, tmp_path):
    f = tmp_path / "meta.json"
    byte = ByteTokenizer().meta()
    assert check_vocab(byte, None, f) == 259
    model = prepared_dir / "tokenizer.model"
    spm = SentencePieceTokenizer.from_file(model).meta()
    assert check_vocab(spm, model, f) == spm["vocab_size"]
    for tok, model_file, needle in (
        ({**byte, "vocab_size": 10**12}, None, "tokenizer.vocab_size must be an integer in [1, 16,777,216]"),
        ({**byte, "vocab_size": 300}, None, "tokenizer.vocab_size is 300, but the byte tokenizer has"),
        ({**byte, "eos_id": 259}, None, "tokenizer.eos_id must be an integer in [0, 258]"),
        ({**spm, "vocab_size": spm["vocab_size"] + 1}, model, f"but {model} has {spm['vocab_size']:,} ids"),
        (spm, tmp_path / "none.model", "is sentencepiece, but the model file"),
        (spm, f, "which is not a SentencePiece model"),
        ({**byte, "type": "bpe"}, None, "tokenizer.type must be sentencepiece or byte"),
        ("byte", None, "tokenizer must be an object"),
    ):
        f.write_text("{}")
        with pytest.raises(UserError) as e:
            check_vocab(tok, model_file, f)
        assert str(e.value).startswith(f"{f}: ") and needle in str(e.value), (tok, str(e.value))
