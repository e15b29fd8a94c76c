"""The suite's own machinery: nothing lost between suites (tests/ID_MAP.tsv), the named runs kept between
sessions only while sound (tests/runs.py), the tiers and the order (tests/tiers.py), the timings
(tests/timings.py)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import tiers
from runs import KEYED_FILES, KEYED_TREES, Runs, manifest, tree_key

ROOT = Path(__file__).resolve().parents[1]
ID_MAP = ROOT / "tests" / "ID_MAP.tsv"


def id_map() -> dict[str, str]:
    rows = [ln.split("\t") for ln in ID_MAP.read_text().splitlines() if ln and not ln.startswith("#")]
    assert all(len(r) == 2 for r in rows), [r for r in rows if len(r) != 2][:3]
    olds = [old for old, _ in rows]
    assert len(olds) == len(set(olds)), "an old id is mapped twice"
    return dict(rows)


def every_test_id(request) -> set[str]:
    """The node ids of the whole suite, every tier: this session's collection when it collected all of
    tests/ (before any deselection), else a `pytest --collect-only` of its own."""
    config = request.config
    if config.args_source == pytest.Config.ArgsSource.TESTPATHS and not config.option.keyword:
        return set(config.stash[tiers.COLLECTED])
    p = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "-p", "no:xdist"],
        cwd=ROOT, env={**os.environ, "MLSTM_TEST_ALL": "1"}, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return {ln for ln in p.stdout.splitlines() if "::" in ln}


def test_every_old_test_id_maps_to_a_test_that_exists(request):
    """Each id of the suite before issue 49 maps to a test collected now (a test renamed, merged or moved
    takes its row in tests/ID_MAP.tsv with it)."""
    mapped = id_map()
    header = ID_MAP.read_text().splitlines()[0]
    assert f"({len(mapped)}," in header, (len(mapped), header)  # no row lost
    collected = every_test_id(request)
    missing = sorted(f"{old} -> {new}" for old, new in mapped.items() if new not in collected)
    assert not missing, f"{len(missing)} mapped test(s) not collected:\n" + "\n".join(missing[:20])


# ---------------------------------------------------------------- the named runs, kept between sessions


def test_a_kept_run_is_reused_until_a_file_of_it_changes(tmp_path, monkeypatch, recwarn):
    """A later session reuses the folder (no build) after checking every file against the manifest taken
    when it was built; a file changed since (a test that wrote into a shared run) has it built again."""
    builds: list[Path] = []

    def build(folder: Path) -> dict:
        builds.append(folder)
        (folder / "out").mkdir()
        (folder / "out" / "weights.bin").write_bytes(b"\x01" * 100)
        (folder / "out" / "best").symlink_to("weights.bin")
        return {"losses": [3.0, 2.5]}

    def session(name: str) -> tuple[Path, dict]:
        monkeypatch.setenv("MLSTM_SUITE_SESSION", name)
        return Runs(tmp_path / "key")._entry("run", build)

    folder, result = session("s1")
    assert result == {"losses": [3.0, 2.5]} and len(builds) == 1
    assert manifest(folder)["out/best"] == ["->", "weights.bin"]
    assert session("s1") == (folder, result) and session("s2") == (folder, result) and len(builds) == 1
    (folder / "out" / "weights.bin").write_bytes(b"\x02" * 100)  # same size, other bytes
    assert session("s2") == (folder, result) and len(builds) == 1  # checked once a session
    assert not recwarn.list
    assert session("s3") == (folder, result) and len(builds) == 2
    assert "changed since it was built (1 changed (out/weights.bin))" in str(recwarn.pop(UserWarning).message)
    assert (folder / "out" / "weights.bin").read_bytes() == b"\x01" * 100


def test_a_build_cut_short_leaves_no_record_and_is_built_again(tmp_path):
    def broken(folder: Path) -> dict:
        (folder / "half").write_text("x")
        raise AssertionError("the launch failed")

    runs = Runs(tmp_path / "key")
    with pytest.raises(AssertionError, match="the launch failed"):
        runs._entry("run", broken)
    assert not (tmp_path / "key" / "run.json").exists()
    folder, result = runs._entry("run", lambda folder: {"ok": True})
    assert result == {"ok": True} and not (folder / "half").exists()


def test_the_key_follows_what_a_run_depends_on(tmp_path):
    """Code, configs, fixtures and the run table change the key; a test file or the docs do not."""
    for part in [*KEYED_TREES, *KEYED_FILES, "tests/test_x.py", "docs/x.md"]:
        path = tmp_path / part
        path.parent.mkdir(parents=True, exist_ok=True)
        if part in KEYED_TREES:
            path.mkdir()
            path = path / "f.py"
        path.write_text("a")
    key = tree_key(tmp_path)
    assert tree_key(tmp_path) == key
    for unkeyed in ("tests/test_x.py", "docs/x.md"):
        (tmp_path / unkeyed).write_text("b")
        assert tree_key(tmp_path) == key, unkeyed
    for keyed in ("app/f.py", "data_prep/f.py", "ds_configs/f.py", "tests/fixtures/f.py", *KEYED_FILES):
        (tmp_path / keyed).write_text(keyed)
        assert tree_key(tmp_path) != key, keyed
        key = tree_key(tmp_path)
    shutil.copytree(tmp_path / "app", tmp_path / "app" / "sub")
    assert tree_key(tmp_path) != key


# ---------------------------------------------------------------- tiers, order, timings


class _Item:
    def __init__(self, nodeid: str, *marks: str) -> None:
        self.nodeid, self.marks = nodeid, marks

    def get_closest_marker(self, name: str):
        return name if name in self.marks else None


def test_the_longest_files_go_first_and_a_new_file_before_them():
    """A file's length is that of the tests of it this run runs: test_b's long test is not among them."""
    items = [_Item("tests/test_a.py::x"), _Item("tests/test_b.py::y"), _Item("tests/test_new.py::z"),
             _Item("tests/test_b.py::w"), _Item("tests/test_a.py::v")]  # fmt: skip
    seconds = {"tests/test_a.py::x": 6.0, "tests/test_a.py::v": 4.0, "tests/test_b.py::y": 9.0,
               "tests/test_b.py::left_out": 90.0}  # fmt: skip
    tiers.order(items, seconds)
    assert [i.nodeid for i in items] == [
        "tests/test_new.py::z", "tests/test_a.py::x", "tests/test_a.py::v", "tests/test_b.py::y", "tests/test_b.py::w",
    ]  # fmt: skip


def test_the_durations_file_is_read():
    """tests/durations.json as `pytest --timings` writes it: seconds per test (a test it does not name, or
    names no longer, is harmless: its file runs first, or it is not there to order)."""
    seconds = tiers.test_seconds()
    assert len(seconds) > 500 and all(s >= 0 for s in seconds.values()), len(seconds)
    assert any((ROOT / nodeid.split("::")[0]).is_file() for nodeid in seconds)


def test_the_default_run_leaves_out_the_slow_tiers_and_counts_them(monkeypatch):
    deselected: list = []
    config = SimpleNamespace(args=[], option=SimpleNamespace(markexpr=""), stash={},
                             hook=SimpleNamespace(pytest_deselected=lambda items: deselected.extend(items)))  # fmt: skip
    items = [_Item("t::a"), _Item("t::b", "long"), _Item("t::c", "cluster"), _Item("t::d", "cluster", "slow")]
    monkeypatch.delenv("MLSTM_TEST_ALL", raising=False)
    kept = list(items)
    tiers.leave_out_tiers(config, kept)
    assert [i.nodeid for i in kept] == ["t::a"] and len(deselected) == 3
    assert config.stash[tiers._LEFT_OUT] == {"long": 1, "cluster": 2}
    monkeypatch.setenv("MLSTM_TEST_ALL", "1")
    kept = list(items)
    tiers.leave_out_tiers(config, kept)
    assert kept == items
    monkeypatch.delenv("MLSTM_TEST_ALL")
    config.option.markexpr = "cluster"
    kept = list(items)
    tiers.leave_out_tiers(config, kept)
    assert [i.nodeid for i in kept] == ["t::a", "t::c", "t::d"]


def test_timings_are_written_per_test_and_per_file_with_cpu_seconds(tmp_path):
    """`pytest --timings FILE`: a test that spins a child process for CPU time is charged for it."""
    (tmp_path / "test_spin.py").write_text(
        "import subprocess, sys\n"
        "def test_child():\n"
        "    subprocess.run([sys.executable, '-c', 'import time\\nt = time.process_time()\\n"
        "while time.process_time() - t < 0.3: pass'], check=True)\n"
        "def test_quick():\n    pass\n"
    )
    out = tmp_path / "t.json"
    p = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", "-p", "timings",
         "--rootdir", str(tmp_path), "-c", os.devnull, "--timings", str(out), str(tmp_path / "test_spin.py")],
        cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT / "tests")}, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    doc = json.loads(out.read_text())
    assert doc["tests"] == 2 and doc["outcomes"] == {"passed": 2} and "CPUs" in doc["machine"]
    (name,) = doc["files"]
    assert name.endswith("test_spin.py") and doc["files"][name]["tests"] == 2
    wall, cpu, started, worker = doc["per_test"][f"{name}::test_child"]
    assert started >= 0 and worker == "-"  # one process: no pytest-xdist worker
    assert cpu >= 0.3 and wall >= 0.3, (wall, cpu)
    assert doc["per_test"][f"{name}::test_quick"][1] < 0.3
