"""Logging: every line of ours carries the time and its rank; library chatter stays at warning level.

    2026-01-31 12:00:00 [rank 0] INFO step 10/150 | loss 5.1234 | ...

Our loggers: `mlstm`, the app's messages (INFO); `app.*`, module loggers such as the matmul kernel choices,
whose INFO lines are detail (shown with --verbose; their warnings always).
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator

_NOISY = ("DeepSpeed", "deepspeed", "torch.distributed", "datasets", "wandb", "urllib3", "filelock")
FORMAT = "%(asctime)s [rank %(rank)s] %(levelname)s %(message)s"
# app loggers that speak at INFO although the rest of app/ stays at WARNING: each says once what was chosen
ANNOUNCE = ("app.model.core", "app.model.gpu_tuning", "app.parallel.engine")
DATE_FORMAT = "%Y-%m-%d %H:%M:%S"
HEARTBEAT_S = 20.0  # long work says how far it is at least this often in a log: never silent over 30 s


def rank() -> int:
    return int(os.environ.get("RANK", "0"))


class _RankFilter(logging.Filter):
    """Reads RANK when a line is written, not when logging is set up: under srun the rank is only known
    once app.parallel.runtime has mapped Slurm's variables, after the first lines."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.rank = os.environ.get("RANK", "0")
        return True


class _BarAwareHandler(logging.StreamHandler):
    """Writes to the process's stderr as it is when a line is written (a program that swaps sys.stderr, as
    pytest's capture or a caller of `main()` in-process does, gets its lines), through tqdm while a progress
    bar is on screen, so a line never lands inside the bar."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:  # StreamHandler.__init__ and setStream: the stream is always sys.stderr
        pass

    def emit(self, record: logging.LogRecord) -> None:
        try:
            from tqdm import tqdm

            if getattr(tqdm, "_instances", None):
                tqdm.write(self.format(record), file=self.stream)
                return
        except ImportError:
            pass
        super().emit(record)


def setup_logging(verbose: bool = False) -> logging.Logger:
    """Configure our loggers once per process; returns the `mlstm` logger.

    DeepSpeed logs every step and every config key at INFO; a user asked for a training log, not that,
    so its loggers (and a few other libraries') stay at WARNING unless `verbose`.
    """
    handler = _BarAwareHandler()
    handler.setFormatter(logging.Formatter(FORMAT, datefmt=DATE_FORMAT))
    handler.addFilter(_RankFilter())
    for name, quiet_level in (("mlstm", logging.INFO), ("app", logging.WARNING)):
        logger = logging.getLogger(name)
        if not logger.handlers:
            logger.addHandler(handler)
            logger.propagate = False
        logger.setLevel(logging.DEBUG if verbose else quiet_level)
    for name in ANNOUNCE:  # our own one-off lines a user needs in the run log: which core, loop and Adam run
        logging.getLogger(name).setLevel(logging.DEBUG if verbose else logging.INFO)
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
    return logging.getLogger("mlstm")


def get_logger() -> logging.Logger:
    return logging.getLogger("mlstm")


@contextlib.contextmanager
def library_prints() -> Iterator[None]:
    """Hold what a library `print`s to stdout (DeepSpeed: "SEED_LAYERS=...", "Using topology: ...", "... built
    successfully") and pass it on as DEBUG lines: shown with --verbose, not in every run's log."""
    buf = io.StringIO()
    try:
        with contextlib.redirect_stdout(buf):
            yield
    finally:
        log = get_logger()
        for line in buf.getvalue().splitlines():
            if line.strip():
                log.debug(line)


def progress_bar(total: int | None, desc: str, unit: str):
    """A tqdm bar on stderr for long work, shown only on a terminal: in a log file or a pipe it would be
    hundreds of carriage-return redraws on one line (the lines the work prints are the log there)."""
    from tqdm import tqdm

    return tqdm(
        total=total, desc=desc, unit=unit, dynamic_ncols=True, leave=False, file=sys.stderr,
        disable=not sys.stderr.isatty(),
    )  # fmt: skip


def heartbeat_s() -> float:
    """Seconds between the lines of long work in a log (HEARTBEAT_S; MLSTM_HEARTBEAT_S overrides it)."""
    raw = os.environ.get("MLSTM_HEARTBEAT_S", "")
    try:
        return float(raw) if raw and float(raw) > 0 else HEARTBEAT_S
    except ValueError:
        return HEARTBEAT_S


class Progress:
    """Long work's progress, said where it is seen: a tqdm bar on a terminal; in a log file or a pipe, a line
    at least every `heartbeat_s()` seconds (`desc: 3/10 texts, 41 s`), written from a timer thread, so one
    slow unit of work is no silence either. `say` writes a line (default: the `mlstm` logger's info).

        with Progress(len(docs), "stream", "doc") as p:
            for doc in docs:
                ...
                p.update()
    """

    def __init__(
        self,
        total: int | None,
        desc: str,
        unit: str,
        say: Callable[[str], None] | None = None,
        bar: bool = True,
        detail: Callable[[], str] | None = None,
    ) -> None:
        """`total` None: a count with no end known; `bar` False: lines only, on a terminal too; `detail`:
        what else the line says (and the bar beside its count), read each time one is written."""
        self.total, self.desc, self.unit, self.n = total, desc, unit, 0
        self.say = say or get_logger().info
        self.detail = detail
        self.bar = progress_bar(total, desc, unit) if bar else None
        self.t0 = time.monotonic()
        self._done = threading.Event()
        self._thread = None
        if self.bar is None or self.bar.disable:  # no terminal: the lines are the log
            self._thread = threading.Thread(target=self._beat, name=f"progress {desc}", daemon=True)
            self._thread.start()

    def status(self) -> str:
        seconds = f"{time.monotonic() - self.t0:.0f} s"
        more = f", {self.detail()}" if self.detail is not None else ""
        if self.total is None and self.n == 0:
            return f"{self.desc}: {seconds} so far{more}"
        of = f"/{self.total}" if self.total else ""
        return f"{self.desc}: {self.n}{of} {self.unit}s, {seconds}{more}"

    def _beat(self) -> None:
        while not self._done.wait(heartbeat_s()):
            self.say(self.status())

    def update(self, n: int = 1) -> None:
        """`n` more units done (0: none, but the bar's detail is redrawn)."""
        self.n += n
        if self.bar is not None and not self.bar.disable:
            if self.detail is not None:
                self.bar.set_postfix_str(self.detail(), refresh=False)
            self.bar.update(n)

    def close(self) -> None:
        self._done.set()
        if self._thread is not None:
            self._thread.join()
        if self.bar is not None:
            self.bar.close()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


@contextlib.contextmanager
def heartbeat(desc: str, say: Callable[[str], None] | None = None) -> Iterator[Progress]:
    """Work with nothing to count (a check, a fit): `desc` said when it starts, and `desc: N s so far` at
    least every heartbeat_s() until it ends (a terminal too: there is no bar to watch)."""
    p = Progress(None, desc, "step", say, bar=False)
    p.say(f"{desc} ...")
    with p:
        yield p
