"""bench/gpu_tables.py: bench/README.md's GPU tables are made from the committed JSON lines, never typed by hand;
a session's lines are filed once each."""

import json
import shutil
import sys

from launcher import ROOT

sys.path.append(str(ROOT / "bench"))  # after the root: bench/data_prep.py must not hide the package
import gpu_tables


def test_the_readme_section_is_what_the_committed_lines_give():
    text = gpu_tables.README.read_text()
    assert text.count(gpu_tables.MARK_BEGIN) == 1 and text.count(gpu_tables.MARK_END) == 1
    assert gpu_tables.section() in text, (
        "bench/README.md's GPU tables are stale: run `python bench/gpu_tables.py`"
    )


def test_every_gpu_run_line_is_in_the_tables_named_by_device_commit_and_date():
    recs = gpu_tables.lines()
    section = gpu_tables.section()
    runs = [r for rs in recs.values() for r in rs]
    assert len(runs) >= 6 and all(gpu_tables.label(r) in section for r in runs)
    assert all(r.get("git_commit") or r.get("commit") for r in runs), "a GPU line without its commit"
    lost = [r for r in runs if r.get("transcribed")]  # run 3: its raw lines were never committed
    assert {str(r["git_commit"]) for r in lost} == {"1ee1ad0", "4ba2524"} and "are lost" in section


def test_a_sessions_lines_are_filed_once_and_appear_in_the_tables(tmp_path):
    folder = tmp_path / "results"
    shutil.copytree(gpu_tables.RESULTS, folder)
    line = {"bench": "wgrad_overlap", "dtype": "bfloat16", "device": "NVIDIA H200", "git_commit": "abcdef0",
            "utc": "2026-12-01T10:00:00+00:00", "torch": "2.11.0+cu130", "triton": "3.6.0", "driver": "580.159.04",
            "shapes": {"128x4096": {"B": 128, "H": 4096, "T": 256, "ms": {"0": 80.0, "4": 72.0},
                                    "vs_no_overlap": {"0": 1.0, "4": 1.111}, "grad_rel_diff": {"0": 0.0, "4": 3e-3}}}}  # fmt: skip
    session = tmp_path / "results.jsonl"
    session.write_text(json.dumps(line) + "\nnot a line\n")
    assert [p.name for p in gpu_tables.add(session, folder)] == ["wgrad_overlap-nvidia-h200-2026-12-01.json"]
    assert gpu_tables.add(session, folder) == []  # filed already
    section = gpu_tables.section(folder)
    assert "NVIDIA H200, abcdef0, 2026-12-01 (torch 2.11.0+cu130, triton 3.6.0, driver 580.159.04)" in section
    assert "| 128x4096 (256) | 0: 80.0, 4: 72.0 | 0: 1.0, 4: 1.111 | 3.0e-03 |" in section
    readme = tmp_path / "README.md"
    readme.write_text(f"before\n{gpu_tables.MARK_BEGIN}\nold\n{gpu_tables.MARK_END}\nafter\n")
    assert gpu_tables.rewrite(readme, folder) and not gpu_tables.rewrite(readme, folder)
    assert readme.read_text() == f"before\n{section}\nafter\n"
