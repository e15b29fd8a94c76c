"""Typed training configuration, validated at start-up. Field docstrings are the `--help` text."""

from __future__ import annotations

import dataclasses
import math
import typing
from dataclasses import dataclass
from typing import Literal

from app.common.numbers import check_numbers
from app.parallel.layout import PRECISIONS, Precision, is_partition_method

LrDecay = Literal["cosine", "linear", "constant"]
WandbMode = Literal["online", "offline", "disabled"]
LR_DECAYS = typing.get_args(LrDecay)
WANDB_MODES = typing.get_args(WandbMode)
WandbArtifacts = Literal["none", "final", "saves"]
SamplesAt = Literal["validation", "end"]
WANDB_ARTIFACTS = typing.get_args(WandbArtifacts)


@dataclass(kw_only=True, slots=True, frozen=True)
class TrainConfig:
    """A run's settings; frozen: the resolve step (app.training.plan's `plan_run`) makes the one in force, with
    every cap applied and the step counts filled in, and nothing changes it afterwards."""

    data: str = ""
    """Required: the directory written by `python -m data_prep` (holds meta.json and the train/validation/test
    splits)."""
    model_config: str | None = None
    """A model preset (listed at the end of --help) or a JSON file with a ModelConfig; default: the `small`
    preset, sized for the data's vocabulary."""
    pipeline_stages: int = 1
    """Pipeline stages P. P > 1 splits the layers across P ranks (ZeRO 0/1); P = 1 allows ZeRO 0-3."""
    partition_method: str = "time"
    """How layers are split into stages: time (balance each layer's measured forward + backward time,
    timed once on rank 0; a resumed run keeps its split), cost (balance estimated FLOPs), parameters,
    uniform, type:REGEX."""
    out: str = "runs/default"
    """Run directory: resolved config, metrics.jsonl, checkpoints/, wandb/. Rerunning resumes from it."""
    max_steps: int | None = None
    """Stop after this many optimizer steps (overrides --epochs)."""
    epochs: float | None = None
    """Train for this many passes over the training split (default 1 when neither --max-steps nor
    --time-budget is given)."""
    time_budget: float | None = None
    """Minutes of training on the wall clock: the lr decays over the elapsed share of the budget, to its
    floor on the last step, and the run stops in time for its final evaluation and save, estimated from
    measured evaluation and save times. Warmup, validation and saves default to shares of the steps the
    budget is expected to hold, measured after the first 3 steps. Counts the loop from the first step, not
    start-up or the sanity evaluation; carried across resumes, with its schedule.
    --max-steps/--epochs, when given, stop it earlier. Not step-reproducible (the clock decides)."""
    eval_every: int | None = None
    """Evaluate on the validation split every N steps (0: only at the end). Default: 200; with --time-budget,
    every 10% of the steps the budget is expected to hold."""
    eval_max_batches: int = 0
    """Cap on validation batches per periodic evaluation (0: the whole split). Final evaluations use all.
    Capped, in one line, at the validation split's batches."""
    sanity_eval_batches: int = 2
    """Validation batches evaluated before the first step, so a broken setup fails in seconds (0: skip);
    at most the validation split's."""
    save_every: int | None = None
    """Save a checkpoint every N steps (0: only at the end). Default: 500; with --time-budget, at each
    validation."""
    keep_last: int = 3
    """Keep the newest K complete checkpoints; older ones are deleted (never the one `latest` names)."""
    resume: str | None = None
    """Checkpoint tag under --out/checkpoints to resume from (e.g. step_00000100). Default: the latest complete one."""
    init_from: str | None = None
    """Start from these weights (a run directory, checkpoint or export folder, whatever layout wrote it) with
    a fresh optimizer, lr schedule and step count: fine-tuning. Its tokenizer and layer shapes must match the
    run's. Ignored when --out already holds a checkpoint (the run resumes)."""
    allow_data_change: bool = False
    """Resume even though --data differs from the data the checkpoint was trained on (its order changes too)."""
    seed: int = 1234
    """Seed for weights, data order and dropout."""
    log_every: int = 10
    """Print one metrics line every N steps."""
    warmup_steps: int | None = None
    """Linear learning-rate warmup steps. Default: 100; with --time-budget, 5% of the steps the budget is
    expected to hold (at most 100), measured after the first 3 steps."""
    lr_decay: LrDecay = "cosine"
    """Decay after warmup: cosine, linear or constant."""
    min_lr_ratio: float = 0.1
    """Floor of the decayed learning rate, as a fraction of the peak lr (--lr)."""
    lr: float | None = None
    """Peak learning rate, written into the DeepSpeed config (optimizer.params.lr); default: the value there.
    The run's config.json records the one used."""
    micro_batch: int | None = None
    """Sequences per micro-batch per data-parallel rank (DeepSpeed's train_micro_batch_size_per_gpu).
    Batch flags given replace the DeepSpeed config's keys; the rest come from it in the order micro-batch,
    grad-accum, global batch, and global = micro x accum x (world / P) is checked. Capped, in one line, at the
    largest split's examples (no micro-batch holds more); a model and micro-batch whose memory cannot fit are
    refused in one line."""
    grad_accum: int | None = None
    """Micro-batches per optimizer step on each rank (DeepSpeed's gradient_accumulation_steps). Capped, in
    one line, where one step holds the train split's whole epoch (so is the global batch it comes from)."""
    global_batch: int | None = None
    """Sequences per optimizer step over all ranks (DeepSpeed's train_batch_size)."""
    precision: Precision | None = None
    """fp32, bf16 or fp16: written into the DeepSpeed config's bf16/fp16 sections; default: what it enables."""
    tokens_per_micro_batch: int = 0
    """Token budget per micro-batch: shorter buckets get more sequences (0: fixed micro-batch size). Capped, in
    one line, at the largest split's tokens padded to its buckets."""
    carry_state: bool = False
    """Truncated BPTT across chunks: a document longer than the data's max_seq_len is trained as its chunks in
    order, in one row of one micro-batch slot, each chunk starting from the recurrent state the one before
    ended with (detached); one-chunk documents are bucketed as without it. Off: every chunk from a zero state."""
    max_consecutive_skips: int = 8
    """Stop the run after this many consecutive skipped (non-finite) steps."""
    test_eval: bool = True
    """Evaluate on the test split at the end."""
    wandb_project: str = "mlstm-ds"
    """Weights & Biases project."""
    wandb_mode: WandbMode | None = None
    """online, offline or disabled. Default: $WANDB_MODE, else online with an API key, else offline."""
    wandb_run_name: str | None = None
    """Run name shown in W&B (default: the run directory's name)."""
    wandb_system_metrics: bool = True
    """Let W&B record system metrics (CPU, memory, GPU use) beside the run's own."""
    wandb_artifacts: WandbArtifacts = "final"
    """Model artifacts logged to W&B (an export: safetensors weights, config, tokenizer; a third to a quarter
    of a checkpoint, which also holds optimizer state): none, final (the last step's, alias "final"), or
    saves (one version per checkpoint save, aliases "step-N"). The newest version is aliased "latest", the one
    whose checkpoint has the lowest validation loss so far "best"."""
    samples: int = 4
    """Texts sampled per prompt at each validation (rank 0, from the whole model; written to samples.jsonl
    and a W&B table). 0: none."""
    sample_tokens: int = 128
    """New tokens per sample (fewer at end of document). --samples x prompts x --sample-tokens that rank 0's
    CPU cannot hold (beside the gathered model) are refused in one line at start-up."""
    samples_at: SamplesAt | None = None
    """When samples are drawn: at every validation, or only at the final one ("end"). Default: every
    validation on CPU, the end on CUDA, where gathering the weights to rank 0 and sampling on its CPU
    holds every GPU at the next collective (seconds per validation for the large preset)."""
    sample_prompts: str | None = None
    """File with one prompt per line for the samples (default: one empty prompt, a document's start)."""
    plots: bool = True
    """Write PNG plots of metrics.jsonl to <out>/plots/ (matplotlib) at each validation and at the end."""
    deterministic: bool | None = None
    """Use deterministic algorithms, so a resumed run repeats the uninterrupted one bit for bit (not with
    --time-budget, where the clock sets the lr and the last step). Default: on for CPU runs, off on CUDA,
    where deterministic kernels (and cuBLAS's workspace setting) cost speed; --deterministic turns it on."""
    progress: bool = True
    """Show a progress bar on rank 0 when stderr is a terminal (never in a log file or pipe)."""
    verbose: bool = False
    """Let DeepSpeed and other libraries log at INFO."""
    dist_timeout_s: float = 600.0
    """Seconds a collective waits for a peer before every rank stops with one line (a rank died or stalled).
    Must exceed the longest pause of any rank, e.g. rank 0 writing a checkpoint. Also how long a rank whose
    launcher is gone may take to save before it is killed. Capped at a day (86400), in one line."""

    def __post_init__(self) -> None:
        def need(cond: bool, flag: str, msg: str) -> None:
            if not cond:
                raise ValueError(f"--{flag.replace('_', '-')}: {msg}")

        check_numbers(self)  # nan, inf, negatives: the shared rule; the bounds of each field follow
        need(bool(self.data), "data", "is required (a directory written by `python -m data_prep`)")
        need(self.pipeline_stages >= 1, "pipeline_stages", f"must be >= 1, got {self.pipeline_stages}")
        need(
            self.partition_method == "time" or is_partition_method(self.partition_method),
            "partition_method",
            f"must be time, cost, parameters, uniform or type:REGEX, got {self.partition_method!r}",
        )
        need(
            self.max_steps is None or self.max_steps >= 1, "max_steps", f"must be >= 1, got {self.max_steps}"
        )
        need(self.epochs is None or self.epochs > 0, "epochs", f"must be > 0, got {self.epochs}")
        need(
            self.time_budget is None or self.time_budget > 0,
            "time_budget",
            f"must be > 0 minutes, got {self.time_budget}",
        )
        for name in ("eval_every", "eval_max_batches", "sanity_eval_batches", "save_every", "warmup_steps"):
            value = getattr(self, name)  # None: the default that follows the run's length (run_schedule)
            need(value is None or value >= 0, name, f"must be >= 0, got {value}")
        need(self.keep_last >= 1, "keep_last", f"must be >= 1, got {self.keep_last}")
        need(self.log_every >= 1, "log_every", f"must be >= 1, got {self.log_every}")
        need(
            self.lr_decay in LR_DECAYS,
            "lr_decay",
            f"must be one of {', '.join(LR_DECAYS)}, got {self.lr_decay!r}",
        )
        need(0.0 <= self.min_lr_ratio <= 1.0, "min_lr_ratio", f"must be in [0, 1], got {self.min_lr_ratio}")
        need(self.tokens_per_micro_batch >= 0, "tokens_per_micro_batch", "must be >= 0")
        need(self.lr is None or (math.isfinite(self.lr) and self.lr > 0), "lr", f"must be > 0, got {self.lr}")
        for name in ("micro_batch", "grad_accum", "global_batch"):
            value = getattr(self, name)
            need(value is None or value >= 1, name, f"must be >= 1, got {value}")
        need(
            self.precision is None or self.precision in PRECISIONS,
            "precision",
            f"must be one of {', '.join(PRECISIONS)}, got {self.precision!r}",
        )
        need(self.dist_timeout_s > 0, "dist_timeout_s", f"must be > 0 seconds, got {self.dist_timeout_s}")
        need(self.max_consecutive_skips >= 1, "max_consecutive_skips", "must be >= 1")
        need(
            self.wandb_artifacts in WANDB_ARTIFACTS,
            "wandb_artifacts",
            f"must be one of {', '.join(WANDB_ARTIFACTS)}, got {self.wandb_artifacts!r}",
        )
        need(self.samples >= 0, "samples", f"must be >= 0, got {self.samples}")
        need(self.sample_tokens >= 1, "sample_tokens", f"must be >= 1, got {self.sample_tokens}")
        need(
            self.wandb_mode is None or self.wandb_mode in WANDB_MODES,
            "wandb_mode",
            f"must be one of {', '.join(WANDB_MODES)}, got {self.wandb_mode!r}",
        )

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)
