"""The files of an ``--input`` directory, symbolic links included, and what had to be left out.

A directory is read recursively in name order (the order of ``sorted(paths)``), hidden entries and
``__pycache__`` skipped. Symbolic links are followed, to files and to directories, as a user who
links a corpus folder into another expects. What cannot be read is never dropped in silence: each
path left out is recorded under its kind, which data prep warns about and writes into meta.json:

* ``broken_symlink``: a link whose target does not exist;
* ``symlink_loop``: a link back to a directory on its own path (``a/loop -> ..``), or a link chain
  that never ends (ELOOP): walking it would never end;
* ``repeated_directory``: a second path to a directory already read (two links to one folder): its
  files are read once;
* ``unreadable_directory``: a directory that cannot be listed (permission denied);
* ``not_a_file``: a FIFO, socket or device.

A regular file that cannot be read is not left out here: the run stops on it in one line naming it
(``sources``), as a file the user named would.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path


def walk(root: Path, problems: dict[str, list[str]]) -> list[Path]:
    """Every regular file under ``root`` (followed links included); left-out paths go into ``problems``."""
    files: list[Path] = []
    st = root.stat()
    _visit(root, [(st.st_dev, st.st_ino)], set(), files, problems)
    return files


def _visit(
    folder: Path,
    ancestors: list[tuple[int, int]],
    seen: set[tuple[int, int]],
    files: list[Path],
    problems: dict[str, list[str]],
) -> None:
    seen.add(ancestors[-1])
    try:
        entries = sorted(os.scandir(folder), key=lambda e: e.name)
    except OSError:
        problems.setdefault("unreadable_directory", []).append(str(folder))
        return
    for entry in entries:
        if entry.name.startswith(".") or entry.name == "__pycache__":
            continue
        path = Path(entry.path)
        try:
            st = os.stat(path)  # follows links
        except OSError as exc:
            kind = "symlink_loop" if exc.errno == errno.ELOOP else "broken_symlink"
            problems.setdefault(kind if entry.is_symlink() else "unreadable_directory", []).append(str(path))
            continue
        if stat.S_ISREG(st.st_mode):
            files.append(path)
        elif stat.S_ISDIR(st.st_mode):
            key = (st.st_dev, st.st_ino)
            if key in ancestors:
                problems.setdefault("symlink_loop", []).append(str(path))
            elif key in seen:
                problems.setdefault("repeated_directory", []).append(str(path))
            else:
                _visit(path, [*ancestors, key], seen, files, problems)
        else:
            problems.setdefault("not_a_file", []).append(str(path))
