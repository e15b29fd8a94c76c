"""What `app/classify.py` does: one typed config, checked at start-up (errors name the flag)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from app.classifier.spec import Feature
from app.common.numbers import check_numbers

InputFormat = Literal["auto", "csv", "jsonl", "parquet", "lines"]
INPUT_SUFFIXES = {".csv": "csv", ".jsonl": "jsonl", ".json": "jsonl", ".parquet": "parquet", ".txt": "lines"}
COMPRESSED = (".gz", ".bz2", ".xz", ".zst")  # app.classifying.streams.COMPRESSED: read as a stream
OUTPUT_SUFFIXES = {".csv": "csv", ".jsonl": "jsonl", ".parquet": "parquet"}


@dataclass(kw_only=True, slots=True)
class ClassifyConfig:
    classifier: str | None = None
    """The classifier folder app/transfer.py keeps (<transfer --out>/classifier): labels for --output."""
    checkpoint: str | None = None
    """Instead of --classifier: a language model (run directory, checkpoint or export folder) whose raw
    features go to --features-out (no labels; --features and --layer say which)."""
    input: str = "-"
    """Texts to read: a .csv, .jsonl/.json, .parquet or plain-text (.txt, one text a line) file, the text
    ones also compressed (.gz, .bz2, .xz, .zst: huge.jsonl.zst), or - for stdin (one text a line unless
    --input-format says otherwise)."""
    input_format: InputFormat = "auto"
    """auto (from --input's suffix, the one before a compression's; stdin: lines), csv, jsonl, parquet or
    lines."""
    text_field: str = "text"
    """Column (CSV, Parquet) or key (JSONL) holding the text; plain lines have no fields. Where it is the
    default and the file has no `text` column, its one column of text besides --keep-fields (SST's
    `sentence`), said in one line: the rule app/transfer.py follows."""
    keep_fields: list[str] = field(default_factory=list)
    """Input columns copied to each output row beside the labels (an id, a gold label)."""
    output: str | None = None
    """The labels: a .csv, .jsonl or .parquet file, one row per text in input order: row (the input's
    1-based row), the --keep-fields, predicted (the class; multi-label: the labels at or over their
    thresholds), p_<label> per label, neuron_<n> per top neuron. Written once every text is classified;
    until then the parts live in --work-dir."""
    features_out: str | None = None
    """Also write the raw features the classifier reads (or --checkpoint's), one float32 row per text in
    output order, as a .npy file: what OpenAI's encoder `transform` gives."""
    features: Feature = "final_cell"
    """With --checkpoint: the feature kind of --features-out (a classifier says its own)."""
    layer: str = "-1"
    """With --checkpoint: the recurrent layer(s) read, as app/transfer.py's --layer (-1, 0, 0,1 or all)."""
    top_neurons: int = 3
    """Output columns of the top neurons' values (the feature columns the classifier weighs most; at most
    the 32 a classifier keeps)."""
    batch_tokens: int = 16384
    """Padded tokens per batch: texts are sorted by length within a chunk, so padding stays small."""
    chunk_rows: int = 1024
    """Input rows per part: the unit a rank classifies, writes and, after a kill, skips on the rerun (chunk c
    is rank c mod world's: an input of fewer chunks than ranks leaves some idle)."""
    work_dir: str | None = None
    """Where the parts and their manifest live until the output is written (default: <output>.parts)."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """auto (cuda when available: each rank its LOCAL_RANK device), cpu or cuda."""
    verbose: bool = False
    """Library log lines too (DeepSpeed's start-up)."""

    def __post_init__(self) -> None:
        check_numbers(self)
        if (self.classifier is None) == (self.checkpoint is None):
            raise ValueError("give --classifier (labels) or --checkpoint (raw features only), one of them")
        if self.checkpoint is not None and self.output is not None:
            raise ValueError(
                "--output needs --classifier (the labels come from it); --checkpoint gives --features-out"
            )
        if self.output is None and self.features_out is None:
            raise ValueError("nothing to write: give --output (labels) and/or --features-out (features)")
        if self.output is not None and Path(self.output).suffix.lower() not in OUTPUT_SUFFIXES:
            raise ValueError(
                f"--output {self.output}: the suffix says the format: one of {', '.join(OUTPUT_SUFFIXES)}"
            )
        if self.features_out is not None and Path(self.features_out).suffix.lower() != ".npy":
            raise ValueError(f"--features-out {self.features_out}: a .npy file")
        for name in ("batch_tokens", "chunk_rows"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        if self.top_neurons < 0:
            raise ValueError(f"--top-neurons must be >= 0, got {self.top_neurons}")
        kind = self.input_kind()
        self.check_compression()
        if self.input == "-" and kind == "parquet":
            raise ValueError("--input -: stdin can be csv, jsonl or lines; a Parquet file must be a file")
        if len(set(self.keep_fields)) != len(self.keep_fields):
            raise ValueError(f"--keep-fields names a column twice: {self.keep_fields}")

    def input_kind(self) -> str:
        """The input's format: --input-format, or its suffix (stdin: lines)."""
        if self.input_format != "auto":
            return self.input_format
        if self.input == "-":
            return "lines"
        suffixes = [s.lower() for s in Path(self.input).suffixes]
        packed = bool(suffixes) and suffixes[-1] in COMPRESSED
        if packed:  # huge.jsonl.zst: the suffix before the compression's says the format
            suffixes = suffixes[:-1]
        kind = INPUT_SUFFIXES.get(suffixes[-1]) if suffixes else None
        if kind is None:
            raise ValueError(
                f"--input {self.input}: cannot tell its format from the suffix; give --input-format "
                "csv, jsonl, parquet or lines"
            )
        return kind

    def check_compression(self) -> None:
        """A Parquet file is compressed inside; it is never read through a .gz/.bz2/.xz/.zst stream."""
        packed = self.input != "-" and Path(self.input).suffix.lower() in COMPRESSED
        if packed and self.input_kind() == "parquet":
            raise ValueError(
                f"--input {self.input}: a Parquet file is read whole, not through {Path(self.input).suffix}; "
                "decompress it first"
            )

    def output_kind(self) -> str | None:
        return None if self.output is None else OUTPUT_SUFFIXES[Path(self.output).suffix.lower()]
