"""A directory given to the wrong flag is one line saying what it is: a run directory as --data, prepared
data as --checkpoint/--init-from/--config; and --out on a read-only filesystem."""

from __future__ import annotations

import subprocess

import pytest
from in_process import call
from launcher import CPU_CONFIG, train_args

from app import train


def _one_error(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def _train(argv: list[str]) -> int:
    return train.main(["--deepspeed_config", str(CPU_CONFIG), "--pipeline-stages", "1", *argv])


def test_run_directory_as_data(reference_run, tmp_path, capsys):
    run_dir = reference_run[0]
    assert _train(["--data", str(run_dir), "--out", str(tmp_path / "run")]) == 2
    line = _one_error(capsys.readouterr().err)
    assert f"--data {run_dir}: this is a run directory, not prepared data" in line, line


@pytest.mark.parametrize("flag", ["--init-from", "--config", "--checkpoint"])
def test_prepared_data_as_a_run_checkpoint_or_config(flag, prepared_dir, tmp_path, capsys):
    if flag == "--checkpoint":
        from app import evaluate

        assert evaluate.main(["--checkpoint", str(prepared_dir), "--data", str(prepared_dir)]) == 2
    else:
        assert (
            _train(["--data", str(prepared_dir), "--out", str(tmp_path / "run"), flag, str(prepared_dir)])
            == 2
        )
    line = _one_error(capsys.readouterr().err)
    want = "is a directory, not a config file" if flag == "--config" else "this is prepared data"
    assert f"{flag} {prepared_dir}: {want}" in line, line


def test_out_on_a_read_only_filesystem(prepared_dir, tmp_path, capsys):
    """As root, chmod does not stop a write: a tmpfs mounted read-only does."""
    mnt = tmp_path / "ro"
    mnt.mkdir()
    p = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(mnt)], capture_output=True, text=True
    )
    if p.returncode != 0:
        pytest.skip(f"cannot mount a read-only tmpfs here: {p.stderr.strip()}")
    try:
        argv = train_args(prepared_dir, mnt / "run", "--max-steps", "1", "--wandb-mode", "disabled", stages=1)
        q = call(train.main, argv, capsys)  # in this process (tests/in_process.py)
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)
    assert q.returncode == 2
    line = _one_error(q.stderr)
    assert f"--out {mnt / 'run'}: cannot write in {mnt} (the file system is read-only)" in line, line
