"""A command's `main(argv)` called in the test process, for its refusals: the exit status and what it wrote.

A refusal is read from the same code a launch runs (every entry point's `main` turns a UserError into one
line and exit status 2: app/common/errors.py), without the seconds a Python process with torch and
DeepSpeed takes to start. One launched test per command keeps the real entry point honest (its own
process, its `if __name__ == "__main__"`, the launcher's environment).

`app/train.py` gets as far as the process group before some refusals (the resume checks come after it):
what it sets for the rest of a process's life is put back here, so the next test in the worker starts as
the suite left it. The process group itself stays (one of world size 1 per worker, as the in-process
evaluations make).
"""

from __future__ import annotations

import contextlib
import gc
import io
import os
import random
import signal
import socket
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import torch
from launcher import env as launch_env

from app.common import errors
from app.training.preemption import SIGNALS


@dataclass
class Ran:
    """What `main(argv)` returned and wrote."""

    code: int
    out: str
    err: str

    # read as a subprocess.CompletedProcess is (a helper may take either)
    returncode = property(lambda self: self.code)
    stdout = property(lambda self: self.out)
    stderr = property(lambda self: self.err)

    def error_line(self, needle: str = "") -> str:
        """The one `error:` line of a refusal (exit status 2, no traceback), holding `needle`."""
        lines = [ln for ln in self.err.splitlines() if ln.startswith("error: ")]
        assert self.code == 2 and len(lines) == 1, (self.code, self.err[-3000:])
        assert needle in lines[0], (needle, lines[0])
        assert "Traceback" not in self.err, self.err[-3000:]
        return lines[0]


def call(main: Callable[[list[str]], int], argv: list, capsys=None) -> Ran:
    """`main(argv)` in this process. What it printed is read from `capsys` (pytest's capture; anything
    printed before the call is dropped), or without it from sys.stdout and sys.stderr swapped for the call
    (what Python code prints: the logs of app/common/logs.py follow the swap)."""
    if capsys is not None:
        capsys.readouterr()
        with kept_process_state():
            code = main([str(a) for a in argv])
        captured = capsys.readouterr()
        return Ran(code, captured.out, captured.err)
    out, err = io.StringIO(), io.StringIO()
    with kept_process_state(), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([str(a) for a in argv])
    return Ran(code, out.getvalue(), err.getvalue())


@contextlib.contextmanager
def kept_process_state() -> Iterator[None]:
    """The call sees the environment a launched command gets (tests/launcher.py's `env`: one thread, one
    matmul kernel, no injected faults), and what an entry point sets for its process's life is put back:
    the environment, torch's threads and deterministic mode, the RNGs, the signal handlers preemption
    installs, the folder tracebacks go to, sys.argv. A process group not yet made gets a free port (the
    default one is derived from the pid, and may be taken)."""
    import torch.distributed as dist

    threads, debug_mode = torch.get_num_threads(), torch.get_deterministic_debug_mode()
    fill = torch.utils.deterministic.fill_uninitialized_memory
    rng = (random.getstate(), np.random.get_state(), torch.random.get_rng_state())
    handlers = {s: signal.getsignal(s) for s in SIGNALS}
    log_dir, argv, environ = errors._log_dir, list(sys.argv), dict(os.environ)
    os.environ.clear()
    os.environ.update(launch_env())
    if not (dist.is_available() and dist.is_initialized()) and "MASTER_PORT" not in os.environ:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(s.getsockname()[1]))
    try:
        yield
    finally:
        gc.collect()  # a refused run's objects (its --out lock among them) go now, not in a later test
        torch.set_num_threads(threads)
        torch.set_deterministic_debug_mode(debug_mode)
        torch.utils.deterministic.fill_uninitialized_memory = fill
        random.setstate(rng[0])
        np.random.set_state(rng[1])
        torch.random.set_rng_state(rng[2])
        for s, handler in handlers.items():
            signal.signal(s, handler)
        errors._log_dir = log_dir
        sys.argv[:] = argv
        os.environ.clear()
        os.environ.update(environ)
