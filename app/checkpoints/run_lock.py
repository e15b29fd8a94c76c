"""One run per directory: an exclusive `flock` on `<out>/run.lock`, held for the whole run.

The kernel drops a flock when its holder dies (even on SIGKILL), so a lock left by a dead run is simply
taken over; the host/pid/start time written into the file only names the holder in the error. The file
is rewritten in place (not through atomic_write): the lock lives on its inode.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from pathlib import Path

from app.common.errors import UserError
from data_prep.format import MANIFEST_FILE, META_FILE

LOCK_FILE = "run.lock"


def check_run_dir(run_dir: Path) -> None:
    """--out is a directory of its own (or not there yet): not a file, not a prepared-data directory."""
    if run_dir.exists() and not run_dir.is_dir():
        raise UserError(f"--out {run_dir}: exists and is not a directory; give the run a directory")
    if (run_dir / META_FILE).is_file() and (run_dir / MANIFEST_FILE).is_file():
        raise UserError(
            f"--out {run_dir}: holds prepared data (data_prep's {META_FILE}, {MANIFEST_FILE}); give the run "
            "its own directory and this one as --data"
        )


def acquire_run_lock(run_dir: Path):
    """Take the run directory's lock or raise a one-line UserError naming its holder; keep the result open."""
    check_run_dir(run_dir)
    path = run_dir / LOCK_FILE
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        f = open(path, "a+")  # noqa: SIM115 - held open for the run's life
    except OSError as e:  # a read-only directory or disk, a path under a file
        raise UserError(
            f"--out {run_dir}: cannot write the run directory ({e.strerror}: {e.filename})"
        ) from None
    try:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        holder = f.read().strip() or "unknown holder"
        f.close()
        try:
            h = json.loads(holder)
            holder = f"host {h['host']}, pid {h['pid']}, started {h['started']}"
        except (ValueError, KeyError, TypeError):
            pass
        raise UserError(
            f"--out {run_dir}: another run is using this directory ({holder}; lock {path}); wait for it to "
            f"finish or stop it, or use another --out"
        ) from None
    info = {"host": socket.gethostname(), "pid": os.getpid(), "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    f.seek(0)
    f.truncate()
    f.write(json.dumps(info) + "\n")
    f.flush()
    os.fsync(f.fileno())
    return f
