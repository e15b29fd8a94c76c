"""--out that cannot be a run directory is refused in one line naming it, before anything is trained."""

from __future__ import annotations

import pytest
from in_process import call
from launcher import train_args

from app.train import main as train_main


@pytest.mark.parametrize("case", ["a_file", "under_a_file", "prepared_data"])
def test_out_that_cannot_hold_a_run_is_one_line(case, prepared_dir, tmp_path, capsys):
    if case == "prepared_data":
        out, want = prepared_dir, "writing it would destroy the input"
    else:
        (tmp_path / "f").write_text("a user's file\n")
        out = tmp_path / "f" if case == "a_file" else tmp_path / "f" / "run"
        want = "is a file, not a folder"
    argv = train_args(prepared_dir, out, "--max-steps", "1", "--wandb-mode", "disabled", stages=1)
    p = call(train_main, argv, capsys)  # app/train.py's main in this process (tests/in_process.py)
    assert p.returncode != 0
    errors = [ln for ln in p.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and f"--out {out}" in errors[0] and want in errors[0], p.stderr[-3000:]
    assert "Traceback" not in p.stderr, p.stderr[-3000:]
    if case != "prepared_data":
        assert (tmp_path / "f").read_text() == "a user's file\n"  # nothing lost
