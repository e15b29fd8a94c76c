"""What `app/evaluate.py` evaluates: one typed config, checked at start-up (errors name the flag)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from app.common.numbers import check_numbers
from data_prep.format import SPLITS

Split = Literal["train", "validation", "test"]  # data_prep.format.SPLITS, spelled out for --help


@dataclass(kw_only=True, slots=True)
class EvalConfig:
    checkpoint: str = ""
    """A run directory (its latest complete checkpoint), <run>/best (the checkpoint with the lowest validation
    loss), its checkpoints/ folder, a step_XXXXXXXX folder, or an export folder."""
    data: str | None = None
    """Prepared data directory (python -m data_prep) whose --split is evaluated; needs the checkpoint's
    tokenizer."""
    split: Split = "test"
    """Split of --data to evaluate: train, validation or test."""
    text: list[str] = field(default_factory=list)
    """Raw UTF-8 text files to evaluate (bits/byte beside gzip/bzip2/xz)."""
    text_chunk_len: int = 256
    """--text files are read in pieces of this many tokens, each from a fresh state after BOS (and --stream and
    --cache read in pieces of this many). Capped, in one line, at the longest sequence it cuts."""
    stream: bool = True
    """Also score each --text file, and each document of --split, as one stream, the state carried from
    piece to piece (every token predicted from the whole file or document before it), beside the pieces'
    figure; on rank 0."""
    pipeline_stages: int = 1
    """Pipeline stages P for the evaluation (world size / P data-parallel replicas); any P works with any
    checkpoint."""
    micro_batch: int = 8
    """Sequences per micro-batch; capped, in one line, at the most sequences evaluated together (a bucket of
    the split, a file's pieces). An evaluation whose memory cannot fit is refused in one line."""
    partition_method: str = "cost"
    """How layers are split into stages when P > 1 (as in training)."""
    out: str | None = None
    """JSON result file (default: <run>/eval/<tag>.json for a checkpoint, <export>/eval.json)."""
    dynamic: bool = False
    """Also evaluate dynamically (Krause et al. 2018): each sequence / --text file read in order, segment by
    segment, the state carried, the weights adapted after each scored segment (in memory only). One process."""
    dyn_lr: list[float] = field(default_factory=lambda: [3e-4, 1e-3, 3e-3])
    """Dynamic evaluation: step size(s) of the RMS-normalised update. With several, one learner reads the
    text at each and the figure is their Bayesian mixture (each token predicted by the learners weighted by
    how well each predicted the text before it): within ln K nats of the best step size for the text, at K
    times the time; the JSON gives each alone (bench/README.md)."""
    dyn_decay: float = 0.005
    """Dynamic evaluation: pull towards the trained weights per update (scaled per weight by its RMS)."""
    dyn_segment: int = 32
    """Dynamic evaluation: tokens scored per update; capped, in one line, at the longest sequence read."""
    cache: bool = False
    """Also score each --text file, and each document of --split, with a neural cache (Grave et al. 2017):
    read as one stream, each token predicted by the model mixed with a copy of the tokens that followed
    earlier states like the current one (no weight changes; app/evaluation/cache.py); on rank 0."""
    cache_window: int = 4096
    """Neural cache: earlier positions it holds; capped, in one line, at the longest sequence read with it."""
    cache_lambda: list[float] = field(default_factory=lambda: [0.05, 0.1, 0.2, 0.3])
    """Neural cache: weights of the cache in the mixture with the model; with --cache-theta a grid whose
    settings are scored as their Bayesian mixture (within ln K nats of the best for the text)."""
    cache_theta: list[float] = field(default_factory=lambda: [0.03, 0.1, 0.3, 1.0])
    """Neural cache: sharpness of its softmax over earlier states (dot products of top-layer outputs)."""
    verbose: bool = False
    """Let DeepSpeed log at INFO."""

    def __post_init__(self) -> None:
        for name in ("dyn_lr", "cache_lambda", "cache_theta"):
            value = getattr(self, name)  # one number given in code: a list of one
            setattr(self, name, [value] if isinstance(value, (int, float)) else list(value))
        check_numbers(self)
        if not self.checkpoint:
            raise ValueError("--checkpoint is required (a run directory, checkpoint or export folder)")
        if self.data is None and not self.text:
            raise ValueError("nothing to evaluate: give --data DIR (with --split) and/or --text FILE...")
        if self.split not in SPLITS:
            raise ValueError(f"--split must be one of {', '.join(SPLITS)}, got {self.split!r}")
        for name in ("text_chunk_len", "pipeline_stages", "micro_batch", "dyn_segment", "cache_window"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        for name in ("dyn_lr", "cache_lambda", "cache_theta"):  # each value one predictor of a mixture
            values = getattr(self, name)
            if not values:
                raise ValueError(f"--{name.replace('_', '-')} needs at least one value")
            if len(set(values)) < len(values):  # a repeat would double that predictor's prior weight
                raise ValueError(f"--{name.replace('_', '-')}: each value once, got {values}")
        if not all(lam < 1 for lam in self.cache_lambda):  # 1: a token not in the cache has probability 0
            raise ValueError(f"--cache-lambda: each must be in [0, 1), got {self.cache_lambda}")
