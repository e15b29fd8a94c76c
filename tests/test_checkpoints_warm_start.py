"""`--init-from` (app/checkpoints/warm_start.py): a new run starts from an earlier model's weights.

The reference run (P = 2, tests/conftest.py) is exported; a second corpus (other text, the same
SentencePiece model) is fine-tuned from the export under P = 2 and from the run directory itself under
P = 1. Before its first step each run's validation loss is the earlier model's on the new data, as
`app/evaluate.py` measures it on the export, not a fresh model's; its step count and schedule start anew.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from conftest import TINY_PREP_ARGS
from in_process import call
from launcher import metrics, train, train_args, train_one_process
from test_evaluate import evaluate_cli

from app.train import main as train_main
from data_prep.cli import main as prep_main

FINE_TUNE = ("--max-steps", "2", "--sanity-eval-batches", "1000", "--eval-every", "0", "--save-every", "0",
             "--test-eval", "false", "--samples", "0", "--wandb-mode", "disabled")  # fmt: skip


@pytest.fixture(scope="module")
def other_corpus(prepared_dir, tmp_path_factory) -> Path:
    """The standard library's email package (not in the reference run's 0.3 MB), prepared_dir's tokenizer."""
    out = tmp_path_factory.mktemp("prepared") / "email"
    model = json.loads((prepared_dir / "meta.json").read_text())["tokenizer"]["model_file"]
    args = [
        "--input",
        str(Path(os.__file__).parent / "email"),
        "--tokenizer-model",
        str(prepared_dir / model),
    ]
    assert prep_main(["--out", str(out), *args, *TINY_PREP_ARGS]) == 0
    return out


def _start_loss(run: Path) -> float:
    (loss,) = [m["sanity/loss"] for m in metrics(run) if "sanity/loss" in m]
    return loss


@pytest.mark.slow
def test_fine_tune_from_an_export_and_from_a_run_in_other_layouts(reference_run, other_corpus, tmp_path):
    from app.export import main as export_main

    run_dir = reference_run[0]
    assert export_main(["--checkpoint", str(run_dir), "--out", str(tmp_path / "exp")]) == 0
    want = evaluate_cli(
        tmp_path / "exp", tmp_path / "e.json", "--data", str(other_corpus), "--split", "validation"
    )
    # P = 2 from the export
    p = train(2, other_corpus, tmp_path / "pp2", "--init-from", str(tmp_path / "exp"), *FINE_TUNE)
    assert "weights from export" in p.stderr and "fresh optimizer" in p.stderr, p.stderr[-3000:]
    assert _start_loss(tmp_path / "pp2") == pytest.approx(want["validation/loss"], rel=1e-5)
    final = json.loads((tmp_path / "pp2" / "final_metrics.json").read_text())
    assert final["step"] == 2
    lrs = [m["train/lr"] for m in metrics(tmp_path / "pp2") if "train/lr" in m]
    assert lrs[0] == pytest.approx(lrs[1] / 2), "the warmup starts again"
    # P = 1 from the run directory: the P = 2 checkpoint its export came from
    p = train_one_process(other_corpus, tmp_path / "p1", "--init-from", str(run_dir), *FINE_TUNE)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "weights from checkpoint" in p.stderr and "P=2" in p.stderr, p.stderr[-3000:]
    assert _start_loss(tmp_path / "p1") == pytest.approx(want["validation/loss"], rel=1e-5)


def test_init_from_with_another_tokenizer_or_shape_is_one_line(
    reference_run, prepared_byte_dir, prepared_dir, tmp_path, capsys
):
    """Without --model-config the run takes the model's sizes, its vocabulary among them: base 2652e8d then
    blamed --model-config, which the user never gave, for what is a tokenizer mismatch."""
    run_dir = reference_run[0]
    tokenizer = "its tokenizer (sentencepiece, 384 pieces) is not --data's (byte"
    cases = [
        (prepared_byte_dir, [], "debug", tokenizer),
        (prepared_byte_dir, [], None, tokenizer),
        (prepared_dir, ["--model-config", "small"], None, "does not fit this run's"),
    ]
    for data, extra, model, needle in cases:  # app/train.py's main in this process (tests/in_process.py)
        argv = train_args(data, tmp_path / "bad", "--init-from", str(run_dir), *extra, *FINE_TUNE, stages=1,
                          model=model)  # fmt: skip
        p = call(train_main, argv, capsys)
        err = p.stderr.strip().splitlines()
        assert p.returncode == 2 and len(err) == 1 and err[0].startswith("error: --init-from"), p.stderr[
            -3000:
        ]
        assert needle in err[0], err[0]


def test_init_from_without_a_model_config_takes_the_models_sizes(reference_run, other_corpus, tmp_path):
    """--init-from an export of the `debug` model, no --model-config: its sizes, not the `small` default's."""
    from app.export import main as export_main

    assert export_main(["--checkpoint", str(reference_run[0]), "--out", str(tmp_path / "exp")]) == 0
    p = train_one_process(other_corpus, tmp_path / "ft", "--init-from", str(tmp_path / "exp"), *FINE_TUNE,
                          "model.dropout=0.1", model=None)  # fmt: skip
    assert p.returncode == 0, p.stderr[-3000:]
    assert "--init-from: the model's sizes from" in p.stderr and "hidden_dim 64" in p.stderr, p.stderr[-3000:]
    model = json.loads((tmp_path / "ft" / "config.json").read_text())["model"]
    assert (model["hidden_dim"], model["num_layers"], model["dropout"]) == (64, 2, 0.1)


# `long`: two one-process runs for a case the tests above cover in part (a warm start from an export); what only it
# runs is the resume of a warm-started run whose --init-from folder has gone
@pytest.mark.long
def test_a_resume_does_not_need_the_init_from_source(reference_run, other_corpus, tmp_path):
    """A warm-started run saved a checkpoint, then its --init-from folder went (a scratch area cleaned before
    a requeue): the same command resumes, since a resume never reads those weights; base 2652e8d refused it
    ("--init-from ...: no such ..."). No --model-config: the sizes come from the checkpoint then."""
    import shutil

    from app.export import main as export_main

    src = tmp_path / "scratch" / "exp"
    assert export_main(["--checkpoint", str(reference_run[0]), "--out", str(src)]) == 0
    args = ("--init-from", str(src), *FINE_TUNE)
    p = train_one_process(other_corpus, tmp_path / "ft", *args, model=None)
    assert p.returncode == 0, p.stderr[-3000:]
    shutil.rmtree(tmp_path / "scratch")
    p = train_one_process(other_corpus, tmp_path / "ft", *args, "--max-steps", "3", model=None)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "--init-from: not read, --out resumes from step_00000002" in p.stderr, p.stderr[-3000:]
    assert "resumed from" in p.stderr and "--init-from ignored" in p.stderr, p.stderr[-3000:]
    assert json.loads((tmp_path / "ft" / "final_metrics.json").read_text())["step"] == 3
