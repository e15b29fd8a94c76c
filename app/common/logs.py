"""Rank-aware logging: every message carries its rank; library chatter stays at warning level."""

from __future__ import annotations

import logging
import os
import sys
import warnings

_NOISY = ("DeepSpeed", "deepspeed", "torch.distributed", "datasets", "wandb", "urllib3", "filelock")


def rank() -> int:
    return int(os.environ.get("RANK", "0"))


def setup_logging(verbose: bool = False) -> logging.Logger:
    """Configure the `mlstm` logger once per process with a `[rank N]` prefix.

    DeepSpeed logs every step and every config key at INFO; a user asked for a training log, not that,
    so its loggers (and a few other libraries') stay at WARNING unless `verbose`.
    """
    log = logging.getLogger("mlstm")
    if not log.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter(f"[rank {rank()}] %(levelname)s %(message)s"))
        log.addHandler(handler)
        log.propagate = False
    log.setLevel(logging.DEBUG if verbose else logging.INFO)
    for name in _NOISY:
        logging.getLogger(name).setLevel(logging.INFO if verbose else logging.WARNING)
    if not verbose:
        # DeepSpeed's logger has its own handler that ignores the root level.
        try:
            from deepspeed.utils import logger as ds_logger

            ds_logger.setLevel(logging.WARNING)
        except ImportError:
            pass
        warnings.filterwarnings("ignore", category=FutureWarning)
        warnings.filterwarnings("ignore", category=UserWarning, module=r"torch\..*")
    return log


def get_logger() -> logging.Logger:
    return logging.getLogger("mlstm")
