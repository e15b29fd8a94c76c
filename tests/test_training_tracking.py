"""W&B mode resolution and the metrics file (the real wandb package, offline/disabled)."""

import json

import pytest

from app.training.tracking import Tracker, resolve_wandb_mode


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
