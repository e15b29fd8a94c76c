"""bench/gpu_session.sh: the one command a GPU machine runs. Checked here with --dry-run (no GPU): the plan,
every step with its time limit, and a missing wheel folder refused in one line."""

import os
import subprocess

from launcher import ROOT

SCRIPT = ROOT / "bench" / "gpu_session.sh"


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


def test_the_dry_run_plans_every_step_within_the_budget(tmp_path):
    p = _dry(tmp_path, _wheels(tmp_path))
    assert p.returncode == 0, p.stderr
    rows = [line for line in p.stdout.splitlines() if line.startswith("| ")]
    steps = [r.split("|")[1].strip() for r in rows[1:]]
    assert steps == ["wheels", "install", "(background)", "layer", "tests", "gputests", "train", "memory",
                     "quickstart"]  # fmt: skip
    limits = [int(r.split("limit ")[1].split("s")[0]) for r in rows if "limit " in r]
    assert sum(limits) <= 22 * 60  # each step is bounded; SESSION_BUDGET_S decides what runs in a call
    assert "commit abc1234" in p.stdout and (tmp_path / "out" / "summary.md").read_text() == p.stdout
    assert len(list((tmp_path / "out").iterdir())) <= 8  # what a device call brings back


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
    rows = {r.split("|")[1].strip(): r for r in p.stdout.splitlines() if r.startswith("| ")}
    assert "limit " in rows["install"] and "--device cuda" in rows["memory"]
    for name in ("layer", "tests", "gputests", "train", "quickstart"):
        assert "not in SESSION_STEPS" in rows[name], rows[name]
    p = _dry(tmp_path, wheels, "out2", SESSION_STEPS="install,gputest")  # misspelt: refused before the plan
    assert p.returncode == 2 and p.stderr.strip().splitlines() == [
        "error: SESSION_STEPS: no step 'gputest' (install, layer, tests, gputests, train, memory, quickstart)"
    ]
