"""W&B mode resolution and the metrics file (the real wandb package, offline/disabled)."""

import json
import os
import subprocess
import sys

import pytest
from run_files import wandb_file_records

from app.training.tracking import Tracker, recorded_run_id, resolve_wandb_mode, truncate_metrics


@pytest.mark.parametrize(
    "flag, env, want",
    [
        ("disabled", {"WANDB_API_KEY": "k"}, "disabled"),
        (None, {"WANDB_MODE": "dryrun"}, "offline"),
        (None, {"WANDB_MODE": "disabled"}, "disabled"),
        (None, {"WANDB_API_KEY": "k"}, "online"),
        (None, {}, "offline"),
    ],
)
def test_mode_resolution(flag, env, want, monkeypatch, tmp_path):
    for k in ("WANDB_MODE", "WANDB_API_KEY"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert resolve_wandb_mode(flag) == want


def test_disabled_tracker_still_writes_jsonl(tmp_path):
    t = Tracker(tmp_path, project="p", mode="disabled", name="n", config={}, resume_id=None)
    t.log_metrics({"train/loss": 1.5, "train/grad_norm": float("nan")}, step=3)
    t.close()
    rec = json.loads((tmp_path / "metrics.jsonl").read_text())
    assert rec == {"step": 3, "train/loss": 1.5, "train/grad_norm": "nan"}
    assert not (tmp_path / "wandb").exists()


def test_samples_jsonl_is_written_without_wandb_and_cut_back_on_resume(tmp_path):
    t = Tracker(tmp_path, project="p", mode="disabled", name="n", config={}, resume_id=None)
    for step, text in ((4, "é\n"), (8, "later")):
        t.log_samples([{"prompt": "p", "text": text, "tokens": [5, 6], "stop": "length", "row": 0}], step)
    t.log_metrics({"train/loss": 1.0}, step=8)
    t.close()
    assert truncate_metrics(tmp_path, 6) == 8  # a resume from step 6: both files keep steps <= 6 only
    rows = [json.loads(ln) for ln in (tmp_path / "samples.jsonl").read_text(encoding="utf-8").splitlines()]
    assert rows == [{"step": 4, "prompt": "p", "text": "é\n", "stop": "length"}]
    assert (tmp_path / "metrics.jsonl").read_text() == ""


# Two starts in one run directory, as the trainer makes them: the second passes the id the first recorded
# there (a crash before any checkpoint leaves no other). W&B writes its run files out when the process ends,
# so the starts run in a child process and the files are read after it exits (wandb's own record schema).
TWO_STARTS = """
import sys, time
from pathlib import Path
from app.training.tracking import Tracker, recorded_run_id
run = Path(sys.argv[1])
for start, stats in ((1, False), (2, True)):
    t = Tracker(run, project="p", mode="offline", name="n", config={}, resume_id=recorded_run_id(run),
                system_metrics=stats)
    t.log_metrics({"train/loss": 1.0 / start}, step=start)
    time.sleep(1.5)  # a few system-metrics samples at the interval set below
    t.close()
"""


def test_a_second_start_continues_the_recorded_wandb_run_with_system_metrics(tmp_path):
    env = {**os.environ, "WANDB_X_STATS_SAMPLING_INTERVAL": "0.2", "WANDB_SILENT": "true"}
    subprocess.run([sys.executable, "-c", TWO_STARTS, str(tmp_path)], env=env, check=True, timeout=180)
    run_id = recorded_run_id(tmp_path)
    first, second = sorted((tmp_path / "wandb").glob("offline-run-*/run-*.wandb"))
    assert run_id and first.name == second.name == f"run-{run_id}.wandb"  # one W&B run, continued
    stats = [
        [r for r in wandb_file_records(f) if r.WhichOneof("record_type") == "stats"] for f in (first, second)
    ]
    assert not stats[0] and stats[1]  # system metrics: off, then on (the default)
    assert any(item.key.startswith("proc.") for r in stats[1] for item in r.stats.item)
