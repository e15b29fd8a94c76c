"""app/common/outputs.py: the one door every command writes through (the commands' cases: tests/test_safety.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from app.common import outputs
from app.common.errors import UserError


def test_an_output_that_is_an_input_or_holds_one_is_refused(tmp_path):
    data = tmp_path / "shards"
    data.mkdir()
    part = data / "part-00000.csv"
    part.write_text("text\nhello\n")
    with pytest.raises(UserError, match="is the --input"):
        outputs.check([outputs.file("--output", part)], [("--input", part)])
    with pytest.raises(UserError, match="holds the --input"):
        outputs.check([outputs.folder("--work-dir", data)], [("--input", part)])
    os.link(part, tmp_path / "hard.csv")  # one inode, two names
    with pytest.raises(UserError, match="is the --input"):
        outputs.check([outputs.file("--output", tmp_path / "hard.csv")], [("--input", part)])
    (tmp_path / "link.csv").symlink_to(part)
    with pytest.raises(UserError, match="is the --input"):
        outputs.check([outputs.file("--output", tmp_path / "link.csv")], [("--input", part)])
    # an output file inside an input folder is not the input (evaluate's <run>/eval/<tag>.json)
    outputs.check([outputs.file("--out", data / "eval" / "x.json")], [("--checkpoint", data)])


def test_a_folder_where_a_file_is_meant_and_the_reverse_are_refused(tmp_path):
    (tmp_path / "labels.csv").mkdir()
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(UserError, match="is a folder"):
        outputs.check([outputs.file("--output", tmp_path / "labels.csv")])
    with pytest.raises(UserError, match="is a file, not a folder"):
        outputs.check([outputs.folder("--out", tmp_path / "notes.txt")])
    with pytest.raises(UserError, match=r"notes\.txt is a file, not a folder"):
        outputs.check([outputs.file("--output", tmp_path / "notes.txt" / "labels.csv")])
    with pytest.raises(UserError, match="name the same path"):
        outputs.check(
            [outputs.file("--output", tmp_path / "a.csv"), outputs.folder("--work-dir", tmp_path / "a.csv")]
        )


def test_new_file_is_whole_or_absent(tmp_path):
    out = tmp_path / "sub" / "labels.csv"
    with outputs.new_file(out) as tmp:
        assert tmp.suffix == ".csv" and tmp.parent == out.parent
        tmp.write_text("a\n")
        assert not out.exists()
    assert out.read_text() == "a\n"
    with pytest.raises(KeyboardInterrupt), outputs.new_file(out) as tmp:
        tmp.write_text("half")
        raise KeyboardInterrupt
    assert out.read_text() == "a\n" and sorted(p.name for p in out.parent.iterdir()) == ["labels.csv"]


def test_new_folder_replaces_only_what_its_mark_lists(tmp_path):
    final = tmp_path / "export"
    with outputs.new_folder(final, "mlstm-export", last="config.json") as stage:
        assert not final.exists()
        for name in ("model.safetensors", "tokenizer.model", "config.json"):
            (stage / name).write_text(f"v1 {name}")
    assert outputs.read_mark(final)["files"] == ["config.json", "model.safetensors", "tokenizer.model"]
    (final / "eval").mkdir()
    (final / "notes.txt").write_text("the user's")
    with outputs.new_folder(final, "mlstm-export", last="config.json") as stage:
        for name in ("model.safetensors", "config.json"):
            (stage / name).write_text(f"v2 {name}")
    names = sorted(p.name for p in final.iterdir())
    assert names == [outputs.MARK, "config.json", "eval", "model.safetensors", "notes.txt"]
    assert (final / "config.json").read_text() == "v2 config.json" and (
        final / "notes.txt"
    ).read_text() == "the user's"
    with pytest.raises(OSError), outputs.new_folder(final, "mlstm-export", last="config.json") as stage:
        (stage / "model.safetensors").write_text("v3 half")
        raise OSError(28, "No space left on device")
    assert (final / "model.safetensors").read_text() == "v2 model.safetensors"
    assert sorted(p.name for p in final.iterdir()) == names


def test_a_foreign_folder_is_used_through_a_subfolder_and_removal_takes_only_what_is_listed(tmp_path):
    mine = tmp_path / "shards"
    mine.mkdir()
    (mine / "part-00000.csv").write_text("the user's part")
    said = []
    work = outputs.claim(
        outputs.Out("--work-dir", mine, outputs.FOLDER), "mlstm-classify.parts", say=said.append
    )
    assert work == mine / "mlstm-classify.parts" and "did not write" in said[0]
    outputs.ensure_marked(work, "mlstm-classify", ["part-????????.*"])
    (work / "part-00000001.csv").write_text("ours")
    (work / "part-x.csv").write_text("not a name we write")
    outputs.remove_listed(work)
    assert sorted(p.name for p in work.iterdir()) == ["part-x.csv"]
    assert (mine / "part-00000.csv").read_text() == "the user's part"


def test_the_probe_finds_a_read_only_file_system(tmp_path):
    """os.access says yes to root on a read-only mount's folder only by luck; creating a file tells."""
    ro = tmp_path / "ro"
    ro.mkdir()
    if subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(ro)], capture_output=True
    ).returncode:
        pytest.skip("cannot mount a read-only tmpfs here (not root)")
    try:
        with pytest.raises(UserError, match="read-only"):
            outputs.check([outputs.file("--output", ro / "labels.csv")])
    finally:
        subprocess.run(["umount", "-l", str(ro)], check=False)


def test_a_dead_writers_partial_files_are_removed_by_the_next_writer(tmp_path):
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    pid = int(dead.stdout)
    out = tmp_path / "labels.csv"
    (tmp_path / f".labels{outputs.PARTIAL}{pid}.csv").write_text("half")
    stage = tmp_path / f".export{outputs.PARTIAL}{pid}"
    stage.mkdir()
    (stage / outputs.MARK).write_text(json.dumps({"format": outputs.MARK_FORMAT, "files": []}))
    with outputs.new_file(out) as tmp:
        tmp.write_text("whole")
    with outputs.new_folder(tmp_path / "export", "mlstm-export") as s:
        (s / "a").write_text("x")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["export", "labels.csv"]
