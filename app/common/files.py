"""Files the app writes and reads: crash-safe writes, JSON-object files with errors that name line:col."""

from __future__ import annotations

import json
import os
from pathlib import Path

from app.common.errors import UserError


def atomic_write(path: Path, data: str | bytes) -> None:
    """Write `path` so a crash leaves the old content or the new one, never a torn file.

    The temporary file is fsynced before the rename and the directory after it: without both, a power
    loss can persist the rename but not the data (an empty "latest" pointer or manifest). A write that
    fails (a full disk) removes the temporary file and leaves `path` as it was.
    """
    path = Path(path)
    tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:  # a full disk, Ctrl-C: no half-written temporary file is left behind
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def fsync_dir(path: Path) -> None:
    """Persist a directory's entries (a rename into it); a no-op where directories cannot be opened."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def read_json_object(path: Path, what: str) -> dict:
    """The JSON object in `path`, or a UserError "<what>: <path>:<line>:<col>: ..." naming the problem."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UserError(f"{what}: file not found: {path}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"{what}: cannot read {path}: {e}") from None
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        raise UserError(f"{what}: {path}:{e.lineno}:{e.colno}: invalid JSON: {e.msg}") from None
    if not isinstance(obj, dict):
        raise UserError(f"{what}: {path}: expected a JSON object at the top level")
    return obj


def check_inside(path: Path, root: Path, what: str) -> None:
    """Refuse `path` (a file in `root`) when it, or a symlink on the way, resolves outside `root`."""
    real, top = Path(os.path.realpath(path)), Path(os.path.realpath(root))
    if real != top and top not in real.parents:
        raise UserError(
            f"{what}: {path} points outside {root} (to {real}); refused: files of a run or data "
            "directory must live inside it (copy the file in instead of linking it)"
        )


def check_tree_inside(folder: Path, root: Path, what: str) -> None:
    """Every entry under `folder` stays inside `root` (symlinks included)."""
    check_inside(folder, root, what)
    for p in sorted(folder.rglob("*")):
        check_inside(p, root, what)
