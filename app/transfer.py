"""Sentiment-neuron style transfer: a trained LM's features of labelled texts -> L1 logistic regression.

    python app/transfer.py --checkpoint runs/big --train train.csv --test test.csv [--validation val.csv]
        [--text-field text] [--label-field label]
        [--features auto|final_cell|final_hidden|mean_hidden|max_hidden] [--layer -1|0|0,1|all] [--out DIR]
        [--finetune-epochs 4] [--finetune-lr 1e-3] [--finetune-rows 32] [--finetune-max-tokens 1024]
        [--finetune-from-scratch]

Texts are tokenized with the checkpoint's tokenizer and run through the recurrent prefill path in
length-sorted batches; the feature is read after each text's last token (Radford et al. 2017 use the
final cell state); --features auto (the default) reads every kind in the same pass and lets the validation
split pick one. C is chosen on --validation (or a seeded split of --train). Beside it, a bag-of-n-grams
logistic regression on the same splits (app/probing/ngram.py). Reports test accuracy,
non-zero weights, the top neurons and the accuracy of the top neuron alone; writes transfer.json, a
histogram of that neuron by class and its value per character over a few test texts (PNG).
Beside the probe, the LM's layers and a linear head on their mean output are fine-tuned on the same
splits (app/probing/finetune.py; --finetune-epochs 0 skips it); the validation split picks probe or
fine-tuned, and transfer.json reports both. Fine-tuning costs about --finetune-epochs forward and backward
passes over --train.
The classifier the validation split picks is kept in --out/classifier (docs/classify.md; app/classify.py
labels new text with it). Several --label-field columns, or one of label lists, make a multi-label task:
one-vs-rest probes with a threshold per label chosen on validation, per-label F1, macro F1 and Jaccard.
Needs the `transfer` extra: pip install 'mlstm-ds[transfer]'.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: import the repo, not app/
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

from app.common.cli import parse_config
from app.common.errors import exit_on_user_error
from app.common.logs import setup_logging
from app.common.resources import steady_heap
from app.probing.config import TransferConfig


@exit_on_user_error
def main(argv: list[str] | None = None) -> int:
    cfg = parse_config(TransferConfig, argv, __doc__)
    steady_heap()  # memory its estimates bound (app.common.resources)
    setup_logging(False)
    from app.probing.run import Transfer, summary

    transfer = Transfer(cfg)
    print(summary(transfer.run(), transfer.out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
