"""Which of our directories a path is: a run directory or prepared data. A path given to the wrong flag
(`--data runs/x`, `--checkpoint data/x`) is then one line that says what it is and which flag takes it,
instead of the error of whatever file the flag looked for first."""

from __future__ import annotations

from pathlib import Path

from app.common.errors import UserError
from data_prep.format import MANIFEST_FILE, META_FILE


def is_prepared_data(path: Path) -> bool:
    return (path / META_FILE).is_file() and (path / MANIFEST_FILE).is_file()


def is_run_dir(path: Path) -> bool:
    """What the trainer writes into --out: its lock, its checkpoints, its resolved config beside metrics."""
    markers = (path / "run.lock").is_file() or (path / "checkpoints").is_dir()
    return markers or ((path / "config.json").is_file() and (path / "metrics.jsonl").is_file())


def check_data_dir(path: str | Path) -> None:
    """--data: a run directory given in its place is refused naming both flags."""
    p = Path(path)
    if p.is_dir() and not is_prepared_data(p) and is_run_dir(p):
        raise UserError(
            f"--data {p}: this is a run directory, not prepared data; give it as --checkpoint/--init-from (or "
            f"--out to resume it), and --data the directory data_prep wrote (its config.json names it)"
        )


def check_not_prepared_data(path: str | Path, flag: str) -> None:
    """--checkpoint/--init-from: a prepared-data directory given in its place is refused naming the flag."""
    p = Path(path)
    if p.is_dir() and is_prepared_data(p):
        raise UserError(
            f"{flag} {p}: this is prepared data ({META_FILE}, {MANIFEST_FILE}), not a run, checkpoint or "
            f"export; give it as --data, and {flag} a run directory, checkpoint or export folder"
        )
