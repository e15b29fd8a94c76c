"""Evaluate any checkpoint (or export) exactly, with any parallel layout, or as one plain process.

    python app/evaluate.py --checkpoint runs/big --data data/mine --split test --text notes.txt
    deepspeed --num_gpus 4 app/evaluate.py --checkpoint runs/big --data data/mine --pipeline-stages 2

Split: loss (nats/token), perplexity and bits per byte over every real token of the split, each counted
once (pads excluded, the uneven last batch included): the same numbers whatever layout trained the
checkpoint and whatever layout evaluates it (world = P stages x world/P data-parallel replicas).

--text FILE...: each file is one document the model never saw, tokenized with the checkpoint's own
tokenizer, EOS appended, cut into --text-chunk-len pieces each read from a fresh state after BOS.
bits/byte = (summed cross-entropy in nats, EOS included) / ln 2 / (the file's size in bytes), printed
beside what gzip -9, bzip2 -9 and xz -9 achieve on the same bytes (8 * compressed size / size). Beside
it, "stream bits/byte" reads each file as ONE stream, the recurrent state carried from piece to piece
(rank 0, one plain model; app/evaluation/stream.py), so every token is predicted from the whole file
before it, as in generation (--no-stream leaves it out). The split gets the same column: each of its
documents (its chunks, consecutive examples in data_prep's order) read as one stream.

--dynamic (one process): each split row / --text file is also read in order, --dyn-segment tokens at a
time with the state carried, the weights adapting after each scored segment (Krause et al. 2018; see
app/evaluation/dynamic.py); the table adds bits/byte with the state carried and static weights
("static carried"), dynamically ("dynamic") and the gain over the static figure. Several --dyn-lr step
sizes (the default: 3e-4 1e-3 3e-3) each adapt a learner from the trained weights; "dynamic" is their
Bayesian mixture (within ln K nats of the best one for the text, chosen as it is read), and the JSON's
dynamic_by_lr has each learner's figure and final weight. K step sizes take K times as long as one.

--cache (rank 0): each split document / --text file is also read as one stream with a neural cache (Grave
et al. 2017; app/evaluation/cache.py): no weight changes, each token predicted by the model mixed with
the tokens that followed the --cache-window earlier states most like the current one. "cache" is the
Bayesian mixture of the --cache-lambda x --cache-theta grid (cache_by_setting in the JSON), with its gain
over the static figure.

Results: a small table on stdout and a JSON file (--out; default <run>/eval/<tag>.json).
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script by the deepspeed launcher: import the repo, not app/
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

from app.common.cli import parse_config
from app.common.errors import exit_on_user_error
from app.common.logs import setup_logging
from app.common.resources import steady_heap
from app.evaluation.config import EvalConfig


def parse_args(argv: list[str] | None) -> EvalConfig:
    return parse_config(EvalConfig, argv, __doc__, launcher=True)


@exit_on_user_error
def main(argv: list[str] | None = None) -> int:
    cfg = parse_args(argv)
    steady_heap()  # memory its estimates bound (app.common.resources)
    log = setup_logging(cfg.verbose)
    from app.evaluation.evaluator import Evaluator  # DeepSpeed is imported only for a valid request

    evaluator = Evaluator(cfg)
    evaluator.setup()
    result, rows = evaluator.run()
    evaluator.report(result, rows, log)
    return 0


if __name__ == "__main__":
    sys.exit(main())
