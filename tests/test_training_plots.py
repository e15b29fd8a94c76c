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


def test_runs_compare_in_bits_per_byte_against_the_text_seen_and_the_clock(tmp_path, capsys):
    """A SentencePiece run (4 bytes a token) and a byte run: per token the byte run looks 4x better; per
    byte of text they sit where they are. Runs that did not record the bytes and seconds (older metrics)
    get them from each step's loss, bits/byte and tokens/s."""
    import math

    def run(name: str, bytes_per_token: float, recorded: bool) -> str:
        recs = []
        for step in range(1, 11):
            loss = 2.0 * bytes_per_token * math.log(2)  # 2 bits a byte, whatever the tokenizer
            rec = {"step": step, "train/loss": loss, "train/bpb": 2.0, "train/tokens": 100 * step,
                   "train/tokens_per_s": 50.0, "train/grad_norm": 1.0, "train/lr": 1e-3}  # fmt: skip
            if recorded:
                rec |= {"train/bytes": 100 * step * bytes_per_token, "train/elapsed_s": 2.0 * step}
            recs.append(rec)
        recs.append({"step": 10, "val/loss": 1.0, "val/bpb": 1.5})
        d = tmp_path / name
        d.mkdir()
        (d / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in recs))
        return str(d)

    out = tmp_path / "cmp.png"
    assert plot_main([run("spm", 4.0, False), run("bytes", 1.0, True), "--out", str(out)]) == 0
    check_png(out)
    spm, byte = plot_runs([str(tmp_path / "spm"), str(tmp_path / "bytes")], tmp_path / "again.png")
    assert spm.train["bytes"].tolist() == pytest.approx([400.0 * s for s in range(1, 11)])
    assert spm.train["seconds"].tolist() == pytest.approx([2.0 * s for s in range(1, 11)])
    assert byte.val["bytes"].tolist() == [1000.0] and spm.val["bytes"].tolist() == pytest.approx([4000.0])
    assert spm.val["seconds"].tolist() == pytest.approx([20.0]) == byte.val["seconds"].tolist()
