"""``python -m data_prep`` / ``mlstm-prep``: prepare tokenized, bucketed train/validation/test splits.

Exit codes: 0 success, 2 user error (one ``error:`` line on stderr, no traceback), 1 internal error.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import shlex
import sys
import time
from pathlib import Path

from app.common import outputs
from app.common.cli import field_docs
from app.common.errors import report_user_error
from app.common.version import __version__
from data_prep.config import DOC_SPLITS, FORMATS, MODEL_TYPES, TOKENIZERS, PrepConfig
from data_prep.errors import UserError
from data_prep.format import PreparedDataError
from data_prep.hub import set_hub_timeouts

log = logging.getLogger("data_prep")


def _help(name: str) -> str:
    """A field's docstring, read from the source, so config and --help never drift apart."""
    return field_docs(PrepConfig).get(name, "")


def build_parser() -> argparse.ArgumentParser:
    d = PrepConfig.__dataclass_fields__
    default = {k: f.default for k, f in d.items() if f.default is not dataclasses.MISSING}

    def h(name: str) -> str:
        return _help(name) + (
            f" (default: {default[name]})" if default.get(name) not in (None, False, []) else ""
        )

    p = argparse.ArgumentParser(
        prog="python -m data_prep",
        description="Prepare a text corpus for mLSTM training: read, clean, split, tokenize, chunk, bucket, save.",
        epilog="Without --input or --hub, prepares the embedded default corpus (CPython's docs and stdlib sources).",
    )
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    g = p.add_argument_group("input")
    g.add_argument("--input", dest="inputs", nargs="+", default=[], metavar="PATH", help=h("inputs"))
    g.add_argument("--hub", metavar="NAME", help=h("hub"))
    g.add_argument("--hub-config", metavar="CONFIG", help=h("hub_config"))
    g.add_argument("--hub-split", default="train", metavar="SPLIT", help=h("hub_split"))
    g.add_argument("--text-field", default="text", metavar="FIELD", help=h("text_field"))
    g.add_argument("--doc-split", default="file", choices=DOC_SPLITS, help=h("doc_split"))
    g.add_argument("--format", default="auto", choices=FORMATS, help=h("format"))
    g.add_argument(
        "--default-max-mb",
        type=float,
        default=default["default_max_mb"],
        metavar="MB",
        help=h("default_max_mb"),
    )
    g = p.add_argument_group("tokenizer")
    g.add_argument("--tokenizer", default="sentencepiece", choices=TOKENIZERS, help=h("tokenizer"))
    g.add_argument("--tokenizer-model", type=Path, metavar="FILE", help=h("tokenizer_model"))
    g.add_argument("--vocab-size", type=int, default=default["vocab_size"], metavar="N", help=h("vocab_size"))
    g.add_argument("--model-type", default="unigram", choices=MODEL_TYPES, help=h("model_type"))
    g.add_argument(
        "--tokenizer-train-mb",
        type=float,
        default=default["tokenizer_train_mb"],
        metavar="MB",
        help=h("tokenizer_train_mb"),
    )
    g = p.add_argument_group("processing")
    g.add_argument(
        "--max-seq-len", type=int, default=default["max_seq_len"], metavar="N", help=h("max_seq_len")
    )
    g.add_argument(
        "--val-fraction", type=float, default=default["val_fraction"], metavar="F", help=h("val_fraction")
    )
    g.add_argument(
        "--test-fraction", type=float, default=default["test_fraction"], metavar="F", help=h("test_fraction")
    )
    g.add_argument("--seed", type=int, default=default["seed"], help=h("seed"))
    g.add_argument(
        "--max-buckets", type=int, default=default["max_buckets"], metavar="N", help=h("max_buckets")
    )
    g.add_argument("--batch-size", type=int, default=default["batch_size"], metavar="N", help=h("batch_size"))
    g = p.add_argument_group("output")
    g.add_argument("--out", type=Path, required=True, metavar="DIR", help=h("out"))
    g.add_argument("--overwrite", action="store_true", help=h("overwrite"))
    g = p.add_argument_group("runtime")
    g.add_argument(
        "--num-proc", type=int, default=None, metavar="N", help=_help("num_proc") + " (default: min(2, CPUs))"
    )
    g.add_argument("--block-mb", type=float, default=default["block_mb"], metavar="MB", help=h("block_mb"))
    g.add_argument("--shard-mb", type=float, default=default["shard_mb"], metavar="MB", help=h("shard_mb"))
    g.add_argument("--quiet", action="store_true", help=h("quiet"))
    return p


def _setup_logging(quiet: bool) -> None:
    import datasets

    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        logging.Formatter("[data_prep %(asctime)s] %(levelname)s %(message)s", datefmt="%H:%M:%S")
    )
    log.handlers[:] = [handler]
    log.setLevel(logging.WARNING if quiet else logging.INFO)
    log.propagate = False
    datasets.logging.set_verbosity_error()
    # Bars on a terminal only, as the trainer's: in a log file they are carriage-return redraws. A user's
    # HF_DATASETS_DISABLE_PROGRESS_BARS (either value) wins: overriding it only makes datasets warn.
    if "HF_DATASETS_DISABLE_PROGRESS_BARS" not in os.environ:
        show = not quiet and sys.stderr.isatty()
        (datasets.enable_progress_bars if show else datasets.disable_progress_bars)()


def parse(argv: list[str]) -> PrepConfig:
    """The flags as a checked PrepConfig (ValueError naming the flag; argparse exits 2 on unknown flags)."""
    args = build_parser().parse_args(argv)
    return PrepConfig(**{k: v for k, v in vars(args).items() if v is not None})


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        cfg = parse(argv)
        reads = [("--input", p) for p in cfg.inputs] + [("--tokenizer-model", cfg.tokenizer_model)]
        outputs.check([outputs.folder("--out", cfg.out)], reads)  # before any work: no input in --out
    except (ValueError, UserError) as exc:
        return report_user_error(exc)
    set_hub_timeouts()  # before datasets/huggingface_hub are imported
    _setup_logging(cfg.quiet)
    from data_prep.pipeline import run
    from data_prep.summary import format_summary

    command = shlex.join(["python", "-m", "data_prep", *argv])
    t0 = time.perf_counter()
    try:
        meta = run(cfg, command)
    except (UserError, PreparedDataError) as exc:
        return report_user_error(exc)
    except KeyboardInterrupt:
        print(
            "error: interrupted; finished shards are kept in --out: run the same command again to resume",
            file=sys.stderr,
        )
        return 130
    if not cfg.quiet:
        print(format_summary(meta, str(cfg.out)))
        log.info("done in %.1f s", time.perf_counter() - t0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
