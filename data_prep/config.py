"""Typed, validated configuration of one data-prep run; each field's docstring is its ``--help``.

Errors name the flag and the offending value, and are raised before any work starts.
"""

from __future__ import annotations

import os
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Literal

from app.common import cli
from app.common.numbers import check_numbers

DocSplit = Literal["file", "paragraph", "line"]
Format = Literal["auto", "text", "json", "csv", "parquet"]
Tokenizer = Literal["sentencepiece", "byte"]
ModelType = Literal["unigram", "bpe"]
DOC_SPLITS, FORMATS = typing.get_args(DocSplit), typing.get_args(Format)
TOKENIZERS, MODEL_TYPES = typing.get_args(Tokenizer), typing.get_args(ModelType)


def default_num_proc() -> int:
    return max(1, min(2, os.cpu_count() or 1))


@dataclass(kw_only=True, slots=True)
class PrepConfig:
    FLAG_GROUPS: ClassVar[dict[str, tuple[str, ...]]] = {
        "input": ("inputs", "hub", "hub_config", "hub_split", "text_field", "doc_split", "format", "default_max_mb"),
        "tokenizer": ("tokenizer", "tokenizer_model", "vocab_size", "model_type", "tokenizer_train_mb"),
        "processing": ("max_seq_len", "val_fraction", "test_fraction", "seed", "max_buckets", "batch_size"),
        "output": ("out", "overwrite"),
        "runtime": ("num_proc", "block_mb", "shard_mb", "quiet"),
    }  # fmt: skip

    inputs: list[str] = field(default_factory=list, metadata=cli.flag(name="input", metavar="PATH"))
    """Files, globs or directories (text, JSON/JSONL, CSV/TSV, Parquet). None and no --hub: the embedded CPython corpus."""
    hub: str | None = None
    """Hugging Face Hub dataset name, loaded through the same pipeline (needs network or a warm cache)."""
    hub_config: str | None = None
    """Hub dataset configuration name."""
    hub_split: str = "train"
    """Hub dataset split to read; data_prep makes its own train/validation/test split from it."""
    text_field: str = "text"
    """Field holding the document text in JSON/CSV/Parquet/Hub rows."""
    doc_split: DocSplit = "file"
    """How plain-text files become documents: one per file, per blank-line paragraph, or per line."""
    format: Format = "auto"
    """Input format; auto picks it from the file extension."""
    default_max_mb: float = 4.0
    """Size cap (MB of UTF-8) of the embedded default corpus."""
    tokenizer: Tokenizer = "sentencepiece"
    """Tokenizer kind: a trained SentencePiece model, or raw bytes (256 ids + specials)."""
    tokenizer_model: Path | None = field(default=None, metadata=cli.flag(metavar="FILE"))
    """Reuse this SentencePiece .model instead of training one (must be lossless, pad_id 0)."""
    vocab_size: int = 0
    """SentencePiece vocabulary size (including 4 specials and 256 byte-fallback pieces); 0 (the default)
    sizes it from the corpus: 64 * round(8 * sqrt(corpus bytes) / 64), within [512, 4096] (why: data_prep/vocab.py)."""
    model_type: ModelType = "unigram"
    """SentencePiece model type."""
    tokenizer_train_mb: float = 4.0
    """At most this many MB of training documents (a fixed hash-ordered sample) train SentencePiece."""
    max_seq_len: int = 256
    """Longer documents are cut into consecutive chunks of at most this many tokens (nothing dropped)."""
    val_fraction: float = 0.05
    """Expected fraction of documents in the validation split."""
    test_fraction: float = 0.05
    """Expected fraction of documents in the test split."""
    seed: int = 1234
    """Seeds the per-document split hash (and nothing else: all other steps are deterministic)."""
    max_buckets: int = 64
    """Most length buckets; the fewest that reach 0.985 expected padding efficiency at --batch-size are used."""
    batch_size: int = 16
    """Batch size the padding-efficiency figures assume (match the trainer's micro batch)."""
    out: Path | None = field(default=None, metadata=cli.flag(metavar="DIR"))
    """Output directory (empty, absent, or an unfinished run of the same command, which is resumed)."""
    overwrite: bool = False
    """Replace an existing data_prep output in --out."""
    num_proc: int = field(default_factory=default_num_proc, metadata=cli.flag(default_text="min(2, CPUs)"))
    """Encoding worker processes (the output is the same for any number)."""
    block_mb: float = 4.0
    """MB of documents per work unit; bounds memory (each process holds a few units) and is the resume grain."""
    shard_mb: float = 256.0
    """Approximate MB of token data per output shard group; finished groups survive a kill and are reused."""
    quiet: bool = False
    """No progress bars, no summary; warnings and errors only."""

    def __post_init__(self) -> None:
        check_numbers(self)

        def bad(flag: str, value: object, why: str) -> ValueError:
            return ValueError(f"{flag} {value}: {why}")

        if self.out is None:
            raise ValueError("--out is required: the directory to write the prepared data to")
        self.out = Path(self.out)
        if self.inputs and self.hub:
            raise ValueError("can't use both --input and --hub; choose one")
        if self.hub_config and not self.hub:
            raise ValueError("--hub-config needs --hub")
        for flag, value, choices in (
            ("--doc-split", self.doc_split, DOC_SPLITS),
            ("--format", self.format, FORMATS),
            ("--tokenizer", self.tokenizer, TOKENIZERS),
            ("--model-type", self.model_type, MODEL_TYPES),
        ):
            if value not in choices:
                raise bad(flag, value, f"expected one of {', '.join(choices)}")
        if self.tokenizer_model is not None:
            self.tokenizer_model = Path(self.tokenizer_model)
            if self.tokenizer != "sentencepiece":
                raise ValueError("--tokenizer-model needs --tokenizer sentencepiece")
            if not self.tokenizer_model.is_file():
                raise bad("--tokenizer-model", self.tokenizer_model, "file does not exist")
        if self.vocab_size != 0 and not 261 <= self.vocab_size <= 1_000_000:
            raise bad(
                "--vocab-size",
                self.vocab_size,
                "must be 0 (sized from the corpus) or in [261, 1000000] (4 specials + 256 bytes + pieces)",
            )
        if not 1 <= self.max_seq_len <= 1 << 20:
            raise bad("--max-seq-len", self.max_seq_len, "must be in [1, 1048576]")
        for flag, value in (("--val-fraction", self.val_fraction), ("--test-fraction", self.test_fraction)):
            if not 0.0 <= value < 1.0:
                raise bad(flag, value, "must be in [0, 1)")
        if self.val_fraction + self.test_fraction >= 1.0:
            raise ValueError(
                f"--val-fraction {self.val_fraction} + --test-fraction {self.test_fraction} "
                f"= {self.val_fraction + self.test_fraction:g} leaves no training data; keep the sum below 1"
            )
        if not 0 <= self.seed < 2**63:
            raise bad("--seed", self.seed, "must be in [0, 2**63)")
        for flag, value in (
            ("--default-max-mb", self.default_max_mb),
            ("--tokenizer-train-mb", self.tokenizer_train_mb),
            ("--block-mb", self.block_mb),
            ("--shard-mb", self.shard_mb),
        ):
            if not value > 0:
                raise bad(flag, value, "must be > 0")
        for flag, value in (
            ("--max-buckets", self.max_buckets),
            ("--batch-size", self.batch_size),
            ("--num-proc", self.num_proc),
        ):
            if value < 1:
                raise bad(flag, value, "must be >= 1")
