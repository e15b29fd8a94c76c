"""app/probing/splits.py: multi-label transfer never crashes after featurising. The seeded validation split
is stratified per label (every label of two or more positives on both sides, whatever the seed); a label a
split cannot hold is one line before featurising (exit 2, nothing written, the user's files as they were)
that says what to do, and --drop-rare-labels leaves it out (said, and in transfer.json); the n-gram
baseline that cannot fit a label says so in transfer.json instead of raising; the single neuron's figure is
its balanced accuracy, which a constant guess cannot raise."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from test_checkpoints_consolidate import fake_checkpoint, tiny
from test_classify import botchan_sentences, write_rows

from app.probing.multilabel import _single
from app.probing.ngram import ngram_baseline
from app.probing.splits import split_train
from app.transfer import main as transfer_main


def test_every_label_of_two_positives_is_on_both_sides_for_any_seed():
    for seed in range(40):
        rng = np.random.default_rng(seed)
        Y = (rng.uniform(size=(60, 6)) < [0.5, 0.2, 0.05, 0.04, 0.03, 0.02]).astype(np.int64)
        Y[rng.integers(60), 5] = 1  # at least one positive of the rarest
        for fraction in (0.2, 0.5, 0.9):
            tr, va = split_train(Path("t.csv"), Y, fraction, seed)
            assert sorted([*tr, *va]) == list(range(60)) and len(va) > 0
            for k in range(Y.shape[1]):
                n = int(Y[:, k].sum())
                assert Y[tr, k].sum() >= min(n, 1), (seed, fraction, k)  # a label always has one to fit
                assert n < 2 or Y[va, k].sum() >= 1, (seed, fraction, k)  # and one to choose on, from two


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("splits")
    fake_checkpoint(root / "run", tiny(), "module")
    return root


def rows_with(sentences: list[str], rare_at: list[int]) -> list[dict]:
    """`labels` lists: dialogue (a quotation mark), question, and `rare` on the rows `rare_at` only."""
    return [
        {"text": s, "labels": [n for n, on in (("dialogue", '"' in s), ("question", "?" in s),
                                               ("rare", i in rare_at)) if on]}
        for i, s in enumerate(sentences)
    ]  # fmt: skip


def transfer(root: Path, tmp_path: Path, train_rare: list[int], *extra: str) -> int:
    s = botchan_sentences()
    train = write_rows(tmp_path / "train.jsonl", rows_with(s[:120], train_rare))
    test = write_rows(tmp_path / "test.jsonl", rows_with(s[200:260], [3, 9]))
    args = ["--checkpoint", str(root / "run"), "--train", str(train), "--test", str(test), "--label-field",
            "labels", "--out", str(tmp_path / "out"), "--finetune-epochs", "0", "--heatmap-texts", "0",
            "--features", "final_cell", *extra]  # fmt: skip
    return transfer_main(args)


def test_a_label_a_split_cannot_hold_is_one_line_before_featurising(run_dir, tmp_path, capsys):
    """One positive row of `rare` in --train: whichever side it lands on, one split lacks it (before: a
    traceback from scikit-learn after all the featurising when it landed in validation)."""
    assert transfer(run_dir, tmp_path, [7]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "'rare': 1 positive row in --train, too few to split" in err[0], err
    assert "--validation" in err[0] and "--drop-rare-labels" in err[0]
    assert not (tmp_path / "out").exists()  # stopped before featurising: no feature cache, no transfer.json


def test_drop_rare_labels_leaves_it_out_and_says_so(run_dir, tmp_path, capsys):
    assert transfer(run_dir, tmp_path, [7], "--drop-rare-labels") == 0
    out = capsys.readouterr().out
    assert "--drop-rare-labels: leaving out 1 label(s) ('rare': 1 positive row in --train" in out, out
    res = json.loads((tmp_path / "out" / "transfer.json").read_text())
    assert res["labels"] == ["dialogue", "question"] and res["labels_dropped"] == ["rare"]
    assert "test balanced accuracy" in out  # the single neuron's multi-label figure


def test_the_baseline_says_which_label_it_cannot_fit():
    texts = [f"word{i} common text {'yes' if i % 3 else 'no'}" for i in range(30)]
    Y = np.zeros((30, 2), np.int64)
    Y[::3, 0] = 1  # label a: both classes among the fitting rows
    tr, va, te = slice(0, 18), slice(18, 24), slice(24, 30)
    Y[va, 1] = 1  # label b: positives in validation only
    res = ngram_baseline(*[([texts[i] for i in range(30)[s]], Y[s]) for s in (tr, va, te)], 0, ["a", "b"])
    assert res["not_fitted"] == {"b": "no fitting row has the label: predicted off"}
    assert set(res["thresholds"]) == {"a"} and 0 <= res["test_macro_f1"] <= 1


def test_the_single_neuron_figure_is_balanced_accuracy():
    """A rare label (8% of rows) and a neuron of pure noise: its plain accuracy is the all-negative rate,
    its balanced accuracy one half."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(2000, 3))
    Y = (rng.uniform(size=(2000, 1)) < 0.08).astype(np.int64)
    coef = np.asarray([[1.0, 0.0, 0.0]])
    s = _single([0], coef, ["rare"], (X[:1000], Y[:1000]), (X[1000:], Y[1000:]), np.zeros(3), np.ones(3), 0)
    assert s["test_accuracy"] == pytest.approx(1 - Y[1000:].mean())  # always "no"
    assert s["test_balanced_accuracy"] == pytest.approx(0.5)
