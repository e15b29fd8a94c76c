"""app/training/plots.py and app/plot.py: a run's plots/*.png, and runs overlaid."""

from __future__ import annotations

import itertools
import json

import pytest
from run_files import check_png

from app.plot import main as plot_main
from app.training.plots import curves, plot_runs


def test_curves_keep_a_rewritten_steps_last_record_and_place_validation_by_tokens():
    recs = [
        {"step": 1, "train/loss": 5.0, "train/tokens": 10},
        {"step": 2, "train/loss": "nan", "train/tokens": 20},  # a run killed after step 2 ...
        {"step": 2, "train/loss": 4.0, "train/tokens": 20},  # ... resumed: step 2 again
        {"step": 2, "val/loss": 4.5, "val/bpb": 2.0},
        {"step": 3, "train/loss": 3.0, "train/tokens": 35},
    ]
    c = curves("r", recs)
    assert c.train["step"].tolist() == [1, 2, 3] and c.train["train/loss"].tolist() == [5.0, 4.0, 3.0]
    assert c.val["step"].tolist() == [2] and c.val["tokens"].tolist() == [20.0]


@pytest.mark.slow
def test_training_draws_its_plots(reference_run):
    out, _ = reference_run
    names = sorted(p.name for p in (out / "plots").iterdir())
    assert names == ["bpb.png", "loss.png", "lr.png", "throughput.png"]
    for name in names:
        check_png(out / "plots" / name)
    train = [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines()]
    tokens = [m["train/tokens"] for m in train if "train/tokens" in m]
    assert len(tokens) == 8 and all(b > a for a, b in itertools.pairwise(tokens))  # cumulative, per step


@pytest.mark.slow
def test_plot_overlays_runs(reference_run, pp2_dp2_run, tmp_path, capsys):
    out = tmp_path / "both.png"
    assert plot_main([str(reference_run[0]), str(pp2_dp2_run / "metrics.jsonl"), "--out", str(out)]) == 0
    assert "2 run(s) plotted" in capsys.readouterr().out
    check_png(out)
    runs = plot_runs([str(reference_run[0]), str(pp2_dp2_run)], tmp_path / "again.png")
    assert [c.name for c in runs] == ["ref", "dp2"]
    assert all(
        c.train["step"].tolist() == list(range(1, 9)) and c.val["step"].tolist() == [4, 8] for c in runs
    )


def test_plot_refuses_a_folder_without_metrics_in_one_line(tmp_path, capsys):
    assert plot_main([str(tmp_path), "--out", str(tmp_path / "x.png")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and "no metrics.jsonl" in err[0]
    assert not (tmp_path / "x.png").exists()
