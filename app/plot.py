"""Compare one or more runs in one titled figure (no W&B needed: each run's metrics.jsonl).

    python app/plot.py runs/spm runs/bytes --out compare.png

Panels: bits per byte (train as a line, validation as points) against the MB of text seen and against the
training time, so runs with different tokenizers or batch sizes compare on one scale; the gradient norm,
the learning rate and tokens/s against steps; the training time against steps. A run's own plots are in
<run>/plots/ (written by training).
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: import the repo, not app/
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

import logging
from dataclasses import dataclass, field

from app.common import outputs
from app.common.cli import flag, parse_config
from app.common.errors import exit_on_user_error
from app.training.plots import plot_runs


@dataclass(kw_only=True, slots=True)
class PlotConfig:
    runs: list[str] = field(default_factory=list, metadata=flag(positional=True, metavar="RUN"))
    """A run directory (or its metrics.jsonl file); one or more (`runs:` in a --config file)."""
    out: str = "runs.png"
    """PNG file to write."""

    def __post_init__(self) -> None:
        if not self.runs:
            raise ValueError("give at least one RUN (a run directory or its metrics.jsonl file)")


@exit_on_user_error
def main(argv: list[str] | None = None) -> int:
    cfg = parse_config(PlotConfig, argv, __doc__)
    read = [("RUN", r) for r in cfg.runs] + [("RUN", Path(r) / "metrics.jsonl") for r in cfg.runs]
    outputs.check([outputs.file("--out", cfg.out)], read)  # before any work: no input written over
    logging.basicConfig(format="%(levelname)s %(message)s")  # not setup_logging: no DeepSpeed import here
    curves = plot_runs(cfg.runs, Path(cfg.out))
    print(f"{len(curves)} run(s) plotted to {cfg.out}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
