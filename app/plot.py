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

import argparse
import logging

from app.common import outputs
from app.common.errors import exit_on_user_error
from app.common.version import __version__
from app.training.plots import plot_runs


@exit_on_user_error
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="+", metavar="RUN", help="A run directory (or its metrics.jsonl file).")
    p.add_argument("--out", default="runs.png", help="PNG file to write (default: runs.png).")
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    args = p.parse_args(argv)
    read = [("RUN", r) for r in args.runs] + [("RUN", Path(r) / "metrics.jsonl") for r in args.runs]
    outputs.check([outputs.file("--out", args.out)], read)  # before any work: no input written over
    logging.basicConfig(format="%(levelname)s %(message)s")  # not setup_logging: no DeepSpeed import here
    curves = plot_runs(args.runs, Path(args.out))
    print(f"{len(curves)} run(s) plotted to {args.out}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
