"""User errors: one clear line and a non-zero exit, never a traceback; the same path for every entry point.

Under the `deepspeed` launcher every rank runs the entry point, so a user error may be raised on one rank,
on some or on all. The line is printed once per node: by the first rank of the node to report (the ranks of
a node share the launcher process that started them, so a marker file keyed by it tells the others), with
that rank's number. The full traceback goes to a log file the line names, for bug reports: the run's
`<out>/logs/rank<R>.log` once the trainer has accepted `--out` (`set_log_dir`), else
`$TMPDIR/mlstm-ds/<program>-<pid>.log`. Anything else (a bug) keeps its traceback.
"""

from __future__ import annotations

import datetime
import errno
import functools
import os
import sys
import tempfile
import traceback
from collections.abc import Callable
from pathlib import Path

EXIT_USER_ERROR = 2
DISK_ERRORS = {
    errno.ENOSPC: "no space left on the device",
    errno.EDQUOT: "the disk quota is exceeded",
    errno.EROFS: "the file system is read-only",
    errno.EFBIG: "the file is larger than the file system allows",
}
_log_dir: Path | None = None


class UserError(Exception):
    """A problem with what the user asked for (flags, config files, data paths).

    The message is printed as one line; the process exits with status 2.
    """


def set_log_dir(path: Path) -> None:
    """Where this process's error tracebacks go from now on (`rank<R>.log` in it): the run's own folder."""
    global _log_dir
    _log_dir = Path(path)


def _rank() -> tuple[int, int]:
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


def write_traceback(e: BaseException) -> Path | None:
    """Append `e`'s traceback to this process's log file; None when no file could be written."""
    rank, _ = _rank()
    argv0 = Path(sys.argv[0] if sys.argv and sys.argv[0] else "python")
    program = argv0.parent.name if argv0.stem == "__main__" else argv0.stem  # python -m data_prep: data_prep
    fallback = Path(tempfile.gettempdir()) / "mlstm-ds" / f"{program}-{os.getpid()}.log"
    stamp = datetime.datetime.now().strftime("%Y-%m-%d %H:%M:%S")
    text = f"{stamp} [rank {rank}] {' '.join(sys.argv)}\n{''.join(traceback.format_exception(e))}\n"
    for path in ([_log_dir / f"rank{rank}.log"] if _log_dir else []) + [fallback]:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with path.open("a") as f:
                f.write(text)
            return path
        except OSError:
            continue
    return None


def _marker() -> Path:
    """A file that exists once a rank of this launch on this node has reported an error: keyed by the
    parent process (DeepSpeed's per-node launcher) and its start time, so a later launch never sees it."""
    ppid = os.getppid()
    try:
        stat = Path(f"/proc/{ppid}/stat").read_text()
        start = stat[stat.rindex(")") + 2 :].split()[19]
    except (OSError, ValueError, IndexError):
        start = "0"
    return Path(tempfile.gettempdir()) / "mlstm-ds" / f"reported-{ppid}-{start}"


def claim_report() -> bool:
    """True for the first rank of this node's launch to report an error (it prints the line)."""
    if _rank()[1] <= 1:
        return True
    path = _marker()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
        return True
    except FileExistsError:
        return False
    except OSError:
        return True  # cannot tell: better a line twice than none


def peer_reported() -> bool:
    """A rank of this launch on this node has already printed an error: a lost peer is its consequence."""
    return _rank()[1] > 1 and _marker().exists()


def report_user_error(e: BaseException) -> int:
    """One line on stderr (once per node of a launch), the traceback in a log file; returns the exit status."""
    log = write_traceback(e)
    if claim_report():
        rank, world = _rank()
        msg = " ".join(str(e).split())
        where = [f"rank {rank} of {world}"] if world > 1 else []
        where += [f"traceback in {log}"] if log else []
        print(f"error: {msg}" + (f" ({'; '.join(where)})" if where else ""), file=sys.stderr, flush=True)
    return EXIT_USER_ERROR


def disk_problem(e: BaseException) -> str | None:
    """The words for a write that failed for lack of room or on a read-only file system (DISK_ERRORS); None
    for any other error. Libraries that lose the errno (pyarrow, torch) still carry the OS's message."""
    if isinstance(e, OSError) and e.errno in DISK_ERRORS:
        return DISK_ERRORS[e.errno]
    text = str(e)
    for code, words in DISK_ERRORS.items():
        if os.strerror(code) in text:
            return words
    return None


def exit_on_user_error(fn: Callable[..., int]) -> Callable[..., int]:
    """Every entry point's `main`: `UserError` (data_prep's included) becomes `report_user_error`'s line and
    exit status 2, and so does a write that found the disk full or read-only (the commands say what they
    kept where they write: app.common.outputs; this is the net under them); any other exception propagates
    with its traceback (a bug must show)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs) -> int:
        try:
            return fn(*args, **kwargs)
        except UserError as e:
            return report_user_error(e)
        except OSError as e:
            words = disk_problem(e)
            if words is None:
                raise
            where = f" (writing {e.filename})" if getattr(e, "filename", None) else ""
            fix = "write elsewhere" if e.errno == errno.EROFS else "free some space and run the command again"
            return report_user_error(UserError(f"{words}{where}; {fix}"))

    return wrapper
