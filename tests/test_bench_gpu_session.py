"""bench/gpu_session.sh: the one command a GPU machine runs. Checked here with --dry-run (no GPU): the plan,
every step with its time limit within the session's 11 minutes, each benchmark it names taking the flags it is
given, the tile switch named, and a missing wheel folder refused in one line."""

import os
import re
import shlex
import subprocess
import sys

from launcher import ROOT

SCRIPT = ROOT / "bench" / "gpu_session.sh"
DEFAULT = ["install", "warm", "layer", "tuner", "train", "overlap", "memory"]
OPT_IN = ["tests", "gputests", "quickstart", "report"]


def _dry(tmp_path, wheels, out: str = "out", **extra: str):
    env = dict(
        os.environ, WHEELS=str(wheels), WORK=str(tmp_path / "work"), MLSTM_GIT_COMMIT="abc1234", **extra
    )
    return subprocess.run(["bash", str(SCRIPT), str(tmp_path / out), "--dry-run"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)  # fmt: skip


def _wheels(tmp_path):
    wheels = tmp_path / "whl"
    wheels.mkdir()
    (wheels / "deepspeed-0.19.8-py3-none-any.whl").write_bytes(b"PK")
    return wheels


def _rows(stdout: str) -> dict[str, str]:
    return {r.split("|")[1].strip(): r for r in stdout.splitlines() if r.startswith("| ")}


def test_the_dry_run_plans_every_step_within_eleven_minutes(tmp_path):
    p = _dry(tmp_path, _wheels(tmp_path))
    assert p.returncode == 0, p.stderr
    rows = _rows(p.stdout)
    assert list(rows)[1:] == ["wheels", *DEFAULT, *OPT_IN], list(rows)
    limits = {name: int(r.split("limit ")[1].split("s")[0]) for name, r in rows.items() if "limit " in r}
    assert set(limits) == set(DEFAULT) and sum(limits.values()) <= 11 * 60, (
        limits
    )  # the session's device time
    for call in (["install", "warm", "layer", "tuner"], ["install", "train", "overlap", "memory"]):
        assert sum(limits[s] for s in call) <= 10 * 60 - 30, (
            call
        )  # the device tool's limit a command: two calls
    assert all("not in SESSION_STEPS" in rows[s] for s in OPT_IN)
    assert "commit abc1234" in p.stdout and "budget 660s; tilings offered: MLSTM_GPU_TILES=both" in p.stdout
    assert (tmp_path / "out" / "summary.md").read_text() == p.stdout
    assert len(list((tmp_path / "out").iterdir())) <= 8  # what a device call brings back


def test_each_benchmark_the_plan_runs_exists_and_takes_its_flags(tmp_path):
    """Every `python bench/X.py ...` of the plan (the opt-in steps too): the script is there and each flag it
    is given is one its --help lists; the test files the plan names exist."""
    p = _dry(tmp_path, _wheels(tmp_path), SESSION_STEPS=",".join(DEFAULT + OPT_IN))
    assert p.returncode == 0, p.stderr
    commands = [c for r in _rows(p.stdout).values() for c in re.findall(r"`([^`]*)`", r)]
    scripts = set()
    for cmd in commands:
        for m in re.finditer(r"python (bench/\w+\.py)([^;&'\n]*)", cmd):
            path, args = m.group(1), shlex.split(m.group(2).replace("'", ""), posix=True)
            scripts.add(path)
            help_text = subprocess.run([sys.executable, path, "--help"], cwd=ROOT, capture_output=True, text=True,
                                       env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=120).stdout  # fmt: skip
            for flag in (a for a in args if a.startswith("--")):
                assert flag in help_text, (path, flag)
        for test_file in re.findall(r"tests/\w+\.py", cmd):
            assert (ROOT / test_file).is_file(), test_file
    assert {"bench/warm_gpu.py", "bench/mlstm_layer.py", "bench/train_gpu.py", "bench/gpu_tiles.py",
            "bench/wgrad_overlap.py", "bench/memory.py"} <= scripts, scripts  # fmt: skip


def test_the_tilings_offered_are_a_variable_the_plan_names(tmp_path):
    p = _dry(tmp_path, _wheels(tmp_path), GPU_TILES="old")
    assert p.returncode == 0 and "tilings offered: MLSTM_GPU_TILES=old" in p.stdout, p.stdout


def test_no_wheels_is_one_line(tmp_path):
    p = _dry(tmp_path, tmp_path / "none")
    assert p.returncode == 2
    assert p.stderr.strip().splitlines()[-1].startswith("error: no wheels in ")


def test_session_steps_picks_the_steps_and_leaves_the_quickstarts_steps_alone(tmp_path):
    """SESSION_STEPS (not STEPS, which launch/quickstart.sh reads as --max-steps: run 4's first call passed
    the step list to the quickstart) runs the steps named; the others are said to be left out."""
    wheels = _wheels(tmp_path)
    p = _dry(tmp_path, wheels, SESSION_STEPS="install,memory", STEPS="7", MINUTES="0.5")
    assert p.returncode == 0, p.stderr
    rows = _rows(p.stdout)
    assert "limit " in rows["install"] and "--device cuda" in rows["memory"]
    for name in [s for s in DEFAULT + OPT_IN if s not in ("install", "memory")]:
        assert "not in SESSION_STEPS" in rows[name], rows[name]
    p = _dry(tmp_path, wheels, "out2", SESSION_STEPS="install,gputest")  # misspelt: refused before the plan
    assert p.returncode == 2 and p.stderr.strip().splitlines() == [
        "error: SESSION_STEPS: no step 'gputest' (install, warm, layer, tuner, train, overlap, memory, tests, "
        "gputests, quickstart, report)"
    ]
