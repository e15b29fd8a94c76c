"""An --input directory as users have them: symbolic links, loops, FIFOs and entries they cannot read."""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

PR_CAPBSET_DROP = 24
CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH = 1, 2


def _without_root_overrides() -> None:
    """Run as root, permission bits do not bind: drop the two capabilities that bypass them from the
    child's bounding set (before exec), so the prep meets `Permission denied` as any user would."""
    libc = ctypes.CDLL(None, use_errno=True)
    for cap in (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH):
        if libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")


def _prep(src: Path, out: Path) -> subprocess.CompletedProcess:
    """`python -m data_prep` as a user without root's overrides (a plain run when not root)."""
    return subprocess.run(
        [sys.executable, "-m", "data_prep", "--input", str(src), "--out", str(out), "--tokenizer", "byte"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
        preexec_fn=_without_root_overrides if os.geteuid() == 0 else None,
    )


def _meta(out: Path) -> dict:
    return json.loads((out / "meta.json").read_text())


def test_links_are_followed_and_what_is_left_out_is_named(tmp_path):
    src, elsewhere = tmp_path / "in", tmp_path / "elsewhere"
    src.mkdir()
    elsewhere.mkdir()
    (src / "a.txt").write_text("a document in the folder\n")
    (elsewhere / "b.txt").write_text("a document in a linked folder\n")
    os.symlink(elsewhere, src / "linked")
    os.symlink(elsewhere, src / "linked_again")  # its files are read once
    os.symlink(tmp_path / "nowhere.txt", src / "dangling.txt")
    os.symlink(".", src / "loop")
    os.symlink("chain2", src / "chain1")
    os.symlink("chain1", src / "chain2")  # ELOOP
    os.mkfifo(src / "pipe.txt")
    p = _prep(src, tmp_path / "out")
    assert p.returncode == 0, p.stderr[-3000:]
    meta = _meta(tmp_path / "out")
    assert meta["documents"]["kept"] == 2 and meta["source"]["files"] == 2
    left_out = {
        "broken_symlink": [src / "dangling.txt"],
        "symlink_loop": [src / "chain1", src / "chain2", src / "loop"],
        "repeated_directory": [src / "linked_again"],
        "not_a_file": [src / "pipe.txt"],
    }
    assert meta["source"]["left_out"] == {k: len(v) for k, v in left_out.items()}
    for kind, paths in left_out.items():
        line = next(
            ln for ln in p.stderr.splitlines() if f"left out {len(paths)} {kind.replace('_', ' ')}" in ln
        )
        assert all(str(path) in line for path in paths), line
    assert "Traceback" not in p.stderr


def test_unreadable_entries(tmp_path):
    """A folder that cannot be listed is left out and named; a file that cannot be read stops the run in
    one line naming it (its text would be lost in silence otherwise)."""
    src = tmp_path / "in"
    (src / "locked").mkdir(parents=True)
    (src / "a.txt").write_text("a readable document\n")
    (src / "locked" / "b.txt").write_text("behind a folder nobody may list\n")
    (src / "locked").chmod(0)
    try:
        p = _prep(src, tmp_path / "out")
        if "prctl" in p.stderr:
            pytest.skip(f"cannot drop root's permission overrides here: {p.stderr.strip()[-200:]}")
        assert p.returncode == 0, p.stderr[-3000:]
        assert _meta(tmp_path / "out")["source"]["left_out"] == {"unreadable_directory": 1}
        assert f"left out 1 unreadable directory: {src / 'locked'}" in p.stderr
    finally:
        (src / "locked").chmod(0o755)
    (src / "secret.txt").write_text("hidden")
    (src / "secret.txt").chmod(0)
    p = _prep(src, tmp_path / "out2")
    lines = [ln for ln in p.stderr.splitlines() if ln.strip() and "WARNING" not in ln]
    assert p.returncode == 2 and len(lines) == 1, p.stderr  # one line (it names the traceback's log file)
    assert lines[0].startswith(f"error: {src / 'secret.txt'}: cannot read file (Permission denied)"), p.stderr
