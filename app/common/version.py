"""The code version: the installed release (`__version__`) and, run from a git checkout, its commit.

`__version__` comes from app/__init__.py. `code_version()` is what runs record (config.json, checkpoints'
app state, final_metrics.json, the W&B config): {"version", "git_commit" (or None), "git_dirty" (or None)}.
"""

from __future__ import annotations

import functools
import subprocess
from pathlib import Path

from app import __version__

SOURCE_ROOT = Path(__file__).resolve().parents[2]  # the checkout (or site-packages, installed)


def _git(*args: str) -> str | None:
    try:
        p = subprocess.run(
            ["git", "-C", str(SOURCE_ROOT), *args], capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.SubprocessError):  # no git installed
        return None
    return p.stdout.strip() if p.returncode == 0 else None


@functools.cache
def code_version() -> dict:
    """The release, and the commit of the checkout this code runs from (None when it is not one: an
    installed wheel's site-packages belongs to no repository of ours)."""
    commit = None
    top = _git("rev-parse", "--show-toplevel")
    if top is not None and Path(top).resolve() == SOURCE_ROOT:
        commit = _git("rev-parse", "HEAD")
    dirty = None
    if commit is not None:  # tracked files changed since the commit (untracked ones do not count)
        dirty = bool(_git("status", "--porcelain", "--untracked-files=no"))
    return {"version": __version__, "git_commit": commit, "git_dirty": dirty}
