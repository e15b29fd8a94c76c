"""W&B mode resolution and the metrics file (the real wandb package, offline/disabled)."""

import json

import pytest

from app.training.tracking import Tracker, resolve_wandb_mode, truncate_metrics


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
