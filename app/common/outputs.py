"""Every file and folder a command writes, through one door: checked before any work, written under a
temporary name and renamed when whole, and only what we wrote is ever deleted or replaced.

- `check(outputs, inputs)`: before any work, one `UserError` line (exit 2) for an output that is an input or
  a folder that holds one, a folder where a file is meant or a file where a folder is meant, a folder we
  cannot write (read-only, no permission: found by creating a file there, which `os.access` cannot tell for
  root), and two outputs on one path.
- `new_file(path)`: a file written whole or not at all (a temporary name beside it, the same suffix).
- `new_folder(path, program)`: a folder written whole or not at all: a new one is built beside its final
  name and renamed into place; an existing one of ours gets the new files swapped in, the `last` one (an
  export's config.json, which makes it an export) last, and the files its mark listed that the new one
  lacks removed.
- `claim(path, ...)`: the folder to write into: PATH when it is new, empty or ours; a folder that holds
  files we did not write is used through a subfolder of ours (said in one line), never written over.
- `disk_errors(...)`: a full disk (ENOSPC), an exceeded quota (EDQUOT), a read-only file system (EROFS) or a
  file too large for the file system (EFBIG) while writing becomes one line saying what was kept.

A folder of ours carries a mark, MARK, naming the program that wrote it and the files it owns (fnmatch
patterns, top level only); `remove_listed` deletes only those. Temporary files and folders carry our name
and process id; a dead process's are removed by the next writer of the same output.
"""

from __future__ import annotations

import contextlib
import fnmatch
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from app.common.errors import DISK_ERRORS, UserError, disk_problem
from app.common.files import atomic_write, fsync_dir

MARK = ".mlstm-ds.json"
MARK_FORMAT = "mlstm-ds-owned"
FILE, FOLDER = "file", "folder"
PARTIAL = ".partial-"  # in the names of our temporary files and folders, before the process id


@dataclass(frozen=True, slots=True)
class Out:
    flag: str  # the flag that named it ("--output"), for the error line
    path: Path
    kind: str  # FILE or FOLDER


def file(flag: str, path: str | Path | None) -> Out | None:
    return None if path is None or str(path) in ("", "-") else Out(flag, Path(path), FILE)


def folder(flag: str, path: str | Path | None) -> Out | None:
    return None if path is None or str(path) == "" else Out(flag, Path(path), FOLDER)


def _real(p: Path) -> Path:
    return Path(os.path.realpath(p))


def _same(a: Path, b: Path) -> bool:
    """The same file or folder: one real path, or one inode (a hard link, a bind mount)."""
    if _real(a) == _real(b):
        return True
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _holds(outer: Path, inner: Path) -> bool:
    return _real(outer) in _real(inner).parents


def _nearest_existing(p: Path) -> Path:
    p = Path(os.path.abspath(p))
    while not os.path.lexists(p) and p != p.parent:
        p = p.parent
    return p


def _check_kind(out: Out) -> None:
    p = out.path
    if out.kind == FILE and p.is_dir():
        raise UserError(f"{out.flag} {p}: is a folder; give a file name (e.g. {p / ('out' + p.suffix)})")
    if out.kind == FOLDER and p.exists() and not p.is_dir():
        raise UserError(f"{out.flag} {p}: is a file, not a folder; give a folder (new or empty) instead")
    base = _nearest_existing(p.parent if out.kind == FILE or not p.exists() else p)
    if not base.is_dir():
        raise UserError(f"{out.flag} {p}: {base} is a file, not a folder")


def writable(where: Path) -> str | None:
    """None when a file can be created in the existing folder `where`, else why not (the OS's words).
    Found by creating (and removing) a file: `os.access` tells neither root's nor a network mount's truth."""
    try:
        fd, name = tempfile.mkstemp(prefix=f".mlstm-ds-probe{PARTIAL}{os.getpid()}-", dir=where)
    except OSError as e:
        return DISK_ERRORS.get(e.errno) or e.strerror or str(e)
    os.close(fd)
    os.unlink(name)
    return None


def _check_writable(out: Out) -> None:
    base = _nearest_existing(out.path if out.kind == FOLDER else out.path.parent)
    why = writable(base)
    if why is not None:
        raise UserError(f"{out.flag} {out.path}: cannot write in {base} ({why})")


def _check_inputs(out: Out, inputs: Iterable[tuple[str, str | Path | None]]) -> None:
    for flag, value in inputs:
        if value is None or str(value) in ("", "-") or not os.path.lexists(value):
            continue
        given = Path(value)
        if _same(out.path, given) if out.path.exists() else _real(out.path) == _real(given):
            raise UserError(
                f"{out.flag} {out.path}: is the {flag} {given}; writing it would destroy the input: "
                "give another path"
            )
        if out.kind == FOLDER and _holds(out.path, given):
            raise UserError(
                f"{out.flag} {out.path}: holds the {flag} {given}; a folder we write into must not hold "
                "an input: give another folder"
            )


def check(outputs: Sequence[Out | None], inputs: Iterable[tuple[str, str | Path | None]] = ()) -> None:
    """Before any work: every output refused in one line when it would destroy an input or cannot be
    written; `inputs`: (flag, path) of what the command reads (None, "" and "-" are skipped)."""
    outs = [o for o in outputs if o is not None]
    inputs = list(inputs)
    for i, out in enumerate(outs):
        _check_kind(out)
        _check_inputs(out, inputs)
        for other in outs[:i]:
            if _real(other.path) == _real(out.path):
                raise UserError(f"{out.flag} and {other.flag} name the same path {out.path}: give two")
        _check_writable(out)


# ---- a full disk, a quota, a read-only file system


@contextlib.contextmanager
def disk_errors(flag: str, path: str | Path, kept: str) -> Iterator[None]:
    """A write in this block that fails for lack of room (or a read-only file system) is one line naming
    `flag PATH`, the file, and `kept`: what was kept or removed and how to go on."""
    try:
        yield
    except Exception as e:  # OSError, or a library's own error carrying the OS's message (safetensors)
        words = disk_problem(e)
        if words is None:
            raise
        what = getattr(e, "filename", None)
        at = f" (writing {what})" if what else ""
        raise UserError(f"{flag} {path}: {words}{at}; {kept}") from None


# ---- files and folders written whole


def _partial_name(path: Path, pid: int | None = None) -> Path:
    return path.with_name(f".{path.stem}{PARTIAL}{os.getpid() if pid is None else pid}{path.suffix}")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _stale(parent: Path, prefix: str) -> Iterator[Path]:
    """Our temporary entries in `parent` named `prefix<pid>...` whose process is gone."""
    with contextlib.suppress(OSError):
        for p in parent.iterdir():
            if not p.name.startswith(prefix):
                continue
            pid = p.name[len(prefix) :].split(".")[0].split("-")[0]
            if pid.isdigit() and int(pid) != os.getpid() and not _alive(int(pid)):
                yield p


@contextlib.contextmanager
def new_file(path: str | Path) -> Iterator[Path]:
    """Write `path` whole or not at all: the block writes the path it is given (beside `path`, with its
    suffix, so writers that go by the suffix still do); it is fsynced and renamed onto `path` when the block
    ends, and removed when the block raises (Ctrl-C included)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    for old in _stale(path.parent, f".{path.stem}{PARTIAL}"):
        if old.is_file() and old.suffix == path.suffix:
            old.unlink(missing_ok=True)
    tmp = _partial_name(path)
    try:
        yield tmp
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def read_mark(where: Path) -> dict | None:
    """The mark of a folder of ours, None for any other folder."""
    try:
        mark = json.loads((Path(where) / MARK).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(mark, dict) or mark.get("format") != MARK_FORMAT:
        return None
    return mark


def write_mark(where: Path, program: str, files: Sequence[str]) -> None:
    """Mark `where` as a folder `program` wrote, owning `files` (names or fnmatch patterns, top level)."""
    mark = {"format": MARK_FORMAT, "version": 1, "written_by": program, "files": sorted(set(files))}
    atomic_write(Path(where) / MARK, json.dumps(mark, indent=1))


def ensure_marked(where: Path, program: str, files: Sequence[str]) -> Path:
    """Create `where` (when missing) and mark it as ours, unless a mark is already there."""
    where = Path(where)
    where.mkdir(parents=True, exist_ok=True)
    if read_mark(where) is None:
        write_mark(where, program, files)
    return where


def listed(where: Path) -> list[Path]:
    """The files in `where` (top level) that its mark lists; none for a folder without a mark."""
    mark = read_mark(where)
    if mark is None:
        return []
    patterns = [str(p) for p in mark.get("files", []) if isinstance(p, str) and "/" not in p]
    with contextlib.suppress(OSError):
        return sorted(
            p
            for p in Path(where).iterdir()
            if p.name != MARK
            and not p.is_symlink()
            and p.is_file()
            and any(fnmatch.fnmatchcase(p.name, pat) for pat in patterns)
        )
    return []


def remove_listed(where: Path) -> None:
    """Delete what the mark of `where` lists, then the mark, then the folder if nothing else is left."""
    where = Path(where)
    if read_mark(where) is None:
        return
    for p in listed(where):
        p.unlink(missing_ok=True)
    (where / MARK).unlink(missing_ok=True)
    with contextlib.suppress(OSError):  # a folder that holds other files stays
        where.rmdir()


def is_ours(where: Path, legacy: Callable[[Path], bool] | None = None) -> bool:
    """`where` is a folder we may write into: missing, empty, marked, or one an earlier version of the
    program wrote (`legacy`, its own test, for folders from before the mark)."""
    where = Path(where)
    if not where.exists():
        return True
    if not where.is_dir():
        return False
    if read_mark(where) is not None:
        return True
    with contextlib.suppress(OSError):
        if not any(where.iterdir()):
            return True
    return legacy is not None and legacy(where)


def claim(
    out: Out, sub: str, legacy: Callable[[Path], bool] | None = None, say: Callable[[str], None] | None = None
) -> Path:
    """The folder to write `out` into: its path when `is_ours`, else its subfolder `sub` (said in one line
    by `say`), which must be ours in turn. Nothing is created here (`ensure_marked` does, at first write)."""
    if is_ours(out.path, legacy):
        return out.path
    inner = out.path / sub
    if not is_ours(inner, legacy):
        raise UserError(
            f"{out.flag} {out.path}: holds files mlstm-ds did not write, and so does {inner}; give a new or "
            "empty folder"
        )
    if say is not None:
        say(f"{out.flag} {out.path} holds files mlstm-ds did not write: writing into {inner} instead")
    return inner


def output_folder(
    flag: str,
    path: str | Path,
    inputs: Iterable[tuple[str, str | Path | None]] = (),
    sub: str | None = None,
    legacy: Callable[[Path], bool] | None = None,
    say: Callable[[str], None] | None = None,
) -> Path:
    """A command's output folder, before any work: `check`ed against `inputs`, then `claim`ed (through its
    subfolder `sub` when it holds files we did not write) -> the folder to write into."""
    out = Out(flag, Path(path), FOLDER)
    check([out], inputs)
    return claim(out, sub, legacy, say) if sub else out.path


def _stage_for(final: Path) -> Path:
    """Where a new version of `final` is built: inside it when it exists (the same file system even when
    it is a mount point), else beside it, renamed into place when whole."""
    if final.is_dir():
        return final / f".mlstm-ds{PARTIAL}{os.getpid()}"
    return final.parent / f".{final.name}{PARTIAL}{os.getpid()}"


def _publish(stage: Path, final: Path, last: str | None, known: Sequence[str]) -> None:
    """Put the whole folder `stage` in place of `final` (see `new_folder`)."""
    if not final.exists():
        os.rename(stage, final)
        fsync_dir(final.parent)
        return
    new = sorted(p.name for p in stage.iterdir() if p.name != MARK)
    old_mark = read_mark(final)
    old = {p.name for p in listed(final)} if old_mark else {n for n in known if (final / n).is_file()}
    if last is not None and last in old:
        (final / last).unlink()  # until the new `last` arrives, the folder is not what it was
    for name in new:
        if name != last:
            os.replace(stage / name, final / name)
    for name in sorted(old - set(new)):
        (final / name).unlink(missing_ok=True)
    os.replace(stage / MARK, final / MARK)
    if last is not None and (stage / last).exists():
        os.replace(stage / last, final / last)
    stage.rmdir()
    fsync_dir(final)


@contextlib.contextmanager
def new_folder(
    final: str | Path,
    program: str,
    last: str | None = None,
    known: Sequence[str] = (),
    legacy: Callable[[Path], bool] | None = None,
) -> Iterator[Path]:
    """Write the flat folder `final` whole or not at all. The block fills the folder it is given; when it
    ends, that folder takes `final`'s place: renamed to it when `final` does not exist, else its files
    replace those of `final` (`last` last), and the files `final`'s mark listed (`known` for a folder from
    before the mark) that the new one lacks are removed; other files in `final` are left alone. When the
    block raises, what it wrote is removed and `final` is as it was. `final` must be ours (`claim`;
    `legacy`: a folder of ours from before the mark)."""
    final = Path(final)
    if final.exists() and not is_ours(final, legacy):
        raise UserError(f"{final}: holds files mlstm-ds did not write; give a new or empty folder")
    final.parent.mkdir(parents=True, exist_ok=True)
    for parent, prefix in ((final.parent, f".{final.name}{PARTIAL}"), (final, f".mlstm-ds{PARTIAL}")):
        for old in _stale(parent, prefix):
            if old.is_dir() and read_mark(old) is not None:
                shutil.rmtree(old, ignore_errors=True)
    stage = _stage_for(final)
    shutil.rmtree(stage, ignore_errors=True)  # our own name and process id: a leftover of this process
    stage.mkdir()
    try:
        write_mark(stage, program, [])
        yield stage
        if any(p.is_dir() for p in stage.iterdir()):
            raise ValueError(f"new_folder({final}): only flat folders are published")
        write_mark(stage, program, [p.name for p in stage.iterdir() if p.name != MARK])
        _publish(stage, final, last, known)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
