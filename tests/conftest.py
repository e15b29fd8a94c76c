"""Shared fixtures: tiny prepared datasets (built once per session) for data-prep and trainer tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from data_prep.cli import main as prep_main

TINY_PREP_ARGS = ["--default-max-mb", "0.3", "--max-seq-len", "64", "--num-proc", "2", "--quiet"]


@pytest.fixture(scope="session")
def prepared_dir(tmp_path_factory) -> Path:
    """SentencePiece (vocab 384) on 0.3 MB of the embedded default corpus, max_seq_len 64."""
    out = tmp_path_factory.mktemp("prepared") / "spm"
    assert prep_main(["--out", str(out), "--vocab-size", "384", *TINY_PREP_ARGS]) == 0
    return out


@pytest.fixture(scope="session")
def prepared_byte_dir(tmp_path_factory) -> Path:
    """Byte tokenizer on the same corpus, max_seq_len 64."""
    out = tmp_path_factory.mktemp("prepared") / "byte"
    assert prep_main(["--out", str(out), "--tokenizer", "byte", *TINY_PREP_ARGS]) == 0
    return out
