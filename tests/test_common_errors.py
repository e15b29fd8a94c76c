"""One error path for every entry point: a user error is one line (once, with the rank under the launcher),
its traceback in a log file the line names; a bug keeps its traceback."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from launcher import deepspeed_cmd, run, train_args

from app.common import errors


def _error_lines(err: str) -> list[str]:
    return [ln for ln in err.splitlines() if ln.startswith("error:")]


def _logged(line: str) -> str:
    """The log file the error line names."""
    m = re.search(r"traceback in (\S+)\)$", line)
    assert m, line
    return Path(m.group(1)).read_text()


def _mains():
    from app import evaluate, export, generate, plot, train, transfer
    from data_prep import cli

    return {
        "train": (train.main, ["--data", "{missing}", "--out", "{tmp}/run"]),
        "evaluate": (evaluate.main, ["--checkpoint", "{missing}", "--text", "{missing}"]),
        "generate": (generate.main, ["--checkpoint", "{missing}", "--prompt", "x"]),
        "export": (export.main, ["--checkpoint", "{missing}", "--out", "{tmp}/export"]),
        "transfer": (
            transfer.main,
            ["--checkpoint", "{missing}", "--train", "{missing}", "--test", "{missing}"],
        ),
        "plot": (plot.main, ["{missing}"]),
        "data_prep": (cli.main, ["--input", "{missing}", "--out", "{tmp}/prep"]),
    }


@pytest.mark.parametrize("cli", ["train", "evaluate", "generate", "export", "transfer", "plot", "data_prep"])
def test_every_cli_prints_one_line_and_logs_the_traceback(cli, tmp_path, capsys):
    main, argv = _mains()[cli]
    argv = [a.format(missing=tmp_path / "missing", tmp=tmp_path) for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err
    lines = _error_lines(err)
    assert len(lines) == 1 and "Traceback" not in err, err
    logged = _logged(lines[0])
    assert "Traceback" in logged, logged


def test_a_bug_keeps_its_traceback():
    @errors.exit_on_user_error
    def buggy() -> int:
        return 1 // 0

    with pytest.raises(ZeroDivisionError):
        buggy()


def test_one_report_per_launch_on_a_node(monkeypatch, tmp_path):
    """Ranks of one launch share their parent (DeepSpeed's per-node launcher): only the first reports."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setattr(errors.tempfile, "gettempdir", lambda: str(tmp_path))
    assert not errors.peer_reported()
    assert errors.claim_report()
    assert errors.peer_reported() and not errors.claim_report()


def test_user_error_on_rank_1_alone_is_one_line_with_its_rank(prepared_dir, tmp_path):
    """Rank 1 alone meets a user error mid-training (injected: no real one reaches one rank alone): the
    terminal gets one line, from rank 1 and naming it, no traceback and no lost-peer line from rank 0;
    the traceback is in the run's logs/rank1.log."""
    out = tmp_path / "run"
    args = train_args(prepared_dir, out, "--max-steps", "4", "--eval-every", "0", "--wandb-mode", "disabled")
    p = run(deepspeed_cmd(2, "app/train.py", args), {"MLSTM_DS_FAULTS": "user_error_after=2,hang_rank=1"})
    assert p.returncode != 0
    text = p.stdout + p.stderr
    lines = _error_lines(p.stderr)
    assert len(lines) == 1 and "injected user error" in lines[0] and "rank 1 of 2" in lines[0], text[-4000:]
    assert "Traceback" not in text, text[-4000:]
    logged = (out / "logs" / "rank1.log").read_text()
    assert str(out / "logs" / "rank1.log") in lines[0]
    assert "Traceback" in logged and "injected user error" in logged
