"""``python -m data_prep`` / ``mlstm-prep``: prepare tokenized, bucketed train/validation/test splits.

Exit codes: 0 success, 2 user error (one ``error:`` line on stderr, no traceback), 1 internal error.
"""

from __future__ import annotations

import logging
import os
import shlex
import sys
import time

from app.common import outputs
from app.common.cli import parse_config
from app.common.errors import exit_on_user_error
from data_prep.config import PrepConfig
from data_prep.hub import set_hub_timeouts

log = logging.getLogger("data_prep")
DESCRIPTION = "Prepare a text corpus for mLSTM training: read, clean, split, tokenize, chunk, bucket, save."
EPILOG = "Without --input or --hub, prepares the embedded default corpus (CPython's docs and stdlib sources)."


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


def parse(argv: list[str] | None) -> PrepConfig:
    """The flags (and --config FILE) as a checked PrepConfig, or one UserError line naming the flag."""
    return parse_config(PrepConfig, argv, DESCRIPTION, epilog=EPILOG)


@exit_on_user_error
def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    cfg = parse(argv)
    reads = [("--input", p) for p in cfg.inputs] + [("--tokenizer-model", cfg.tokenizer_model)]
    outputs.check([outputs.folder("--out", cfg.out)], reads)  # before any work: no input in --out
    set_hub_timeouts()  # before datasets/huggingface_hub are imported
    _setup_logging(cfg.quiet)
    from data_prep.pipeline import run
    from data_prep.summary import format_summary

    command = shlex.join(["python", "-m", "data_prep", *argv])
    t0 = time.perf_counter()
    try:
        meta = run(cfg, command)  # a UserError (PreparedDataError too) is one line, exit status 2
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
