"""The run folder (--out) checked before any work, through app.common.outputs: it holds no input (--data,
--init-from, --sample-prompts), it can be written, and it holds no files mlstm-ds did not write; a folder
that does gets the run in its subfolder run/ (said once), never a user's config.json or metrics.jsonl
written over. Rank 0 marks the folder as ours before the first file of the run is written. Our launch scripts'
files (launch/slurm_train.sbatch writes its hostfile and links its job log there before the run starts) are
the run's own: a folder holding only those is ours."""

from __future__ import annotations

import dataclasses
import fnmatch
import os
from pathlib import Path

from app.common import outputs
from app.training.config import TrainConfig

PROGRAM = "mlstm-train"
RUN_FILES = ("config.json", "metrics.jsonl", "run.lock")  # a run's top-level files (the rest are folders)
LAUNCH_FILES = ("hostfile-*", "slurm-*.out")  # launch/slurm_train.sbatch's, written before the run starts
SUBFOLDER = "run"


def _earlier_run(path: Path) -> bool:
    """A run folder of a version from before the mark, or one our launch script has just made (its files only:
    the job's hostfile and the link to its log)."""
    if any((path / name).exists() for name in ("checkpoints", "metrics.jsonl", "run.lock")):
        return True
    try:
        names = [p.name for p in path.iterdir()]
    except OSError:
        return False
    return bool(names) and all(any(fnmatch.fnmatchcase(n, pat) for pat in LAUNCH_FILES) for n in names)


def claim_run_folder(cfg: TrainConfig) -> TrainConfig:
    """Every rank, before any work: `cfg.out` checked -> the config with the folder the run writes into."""
    say = print if os.environ.get("RANK", "0") == "0" else None
    inputs = [("--data", cfg.data), ("--init-from", cfg.init_from), ("--sample-prompts", cfg.sample_prompts)]
    out = outputs.output_folder("--out", cfg.out, inputs, SUBFOLDER, _earlier_run, say)
    return dataclasses.replace(cfg, out=str(out))


def mark_run_folder(cfg: TrainConfig) -> None:
    """Rank 0, once the request is accepted: the folder created and marked as a run of ours."""
    outputs.ensure_marked(Path(cfg.out), PROGRAM, RUN_FILES + LAUNCH_FILES)
