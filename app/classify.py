"""Label new text with a kept classifier, at scale: streamed, data-parallel, resumable.

    python app/classify.py --classifier runs/big/transfer/step_00001000/classifier --input reviews.csv \\
        --output labels.csv [--text-field text] [--keep-fields id] [--features-out features.npy]
    deepspeed --num_gpus 8 app/classify.py --classifier CLF --input huge.jsonl --output labels.parquet
    cat texts.txt | python app/classify.py --classifier CLF --output labels.jsonl
    python app/classify.py --checkpoint runs/big --features final_cell --input texts.txt --features-out f.npy

--classifier is the folder app/transfer.py --out DIR writes to DIR/classifier (the one the validation split
chose: a probe on the language model's features, or the fine-tuned model with its head). --input is a
.csv, .jsonl, .parquet or plain-text file (one text a line; .gz/.bz2/.xz/.zst read as streams) or stdin. The
output (.csv, .jsonl or .parquet) has one row per text in input order: its input row, the --keep-fields,
the label (multi-label: every label at or over its threshold), each label's probability and the top
neurons' values. --features-out writes the raw features (a .npy of float32 rows), what OpenAI's encoder
`transform` returns; with --checkpoint instead of --classifier, a language model's.

The input is read as a stream in chunks of --chunk-rows rows, each classified into a part file (texts
sorted by length within it and batched under --batch-tokens); under the deepspeed launcher chunk c is rank
c mod world's. Once every chunk has its part the output is written from them in order: the same bytes from
1 rank or N. A run that is killed continues where it stopped when the same command is run again (the
parts live in --work-dir, <output>.parts by default). Bad rows (an empty or missing text, a line that is
not JSON, invalid UTF-8) are counted and named by row, never classified. A progress bar on a terminal (a
line every 20 s in a log), texts/s and bytes/s at the end.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script (by the deepspeed launcher too): import the repo, not app/
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

from app.classifying.config import ClassifyConfig
from app.common import outputs
from app.common.cli import parse_config
from app.common.errors import exit_on_user_error
from app.common.logs import setup_logging


def classify_paths(cfg: ClassifyConfig) -> tuple[list, list]:
    """(what the command writes, what it reads), for app.common.outputs.check."""
    work = cfg.work_dir or f"{cfg.output or cfg.features_out}.parts"
    writes = [
        outputs.file("--output", cfg.output),
        outputs.file("--features-out", cfg.features_out),
        outputs.folder("--work-dir", work),
    ]
    return writes, [
        ("--input", cfg.input),
        ("--classifier", cfg.classifier),
        ("--checkpoint", cfg.checkpoint),
    ]


@exit_on_user_error
def main(argv: list[str] | None = None) -> int:
    cfg = parse_config(ClassifyConfig, argv, __doc__, launcher=True)
    outputs.check(*classify_paths(cfg))  # before any work: no input overwritten, every output writable
    setup_logging(cfg.verbose)
    from app.classifying.run import Classify, interrupted, summary  # torch and the model: a valid request

    job = None
    try:
        job = Classify(cfg)
        result = job.run()
    except KeyboardInterrupt:  # Ctrl-C: what is kept and how to go on, in one line
        return interrupted(job)
    if result is not None:
        print(summary(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
