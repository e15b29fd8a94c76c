"""Multi-label transfer (app/probing/multilabel.py): several --label-field indicator columns or one list
column; one-vs-rest probes with a threshold per label chosen on validation; per-label F1, macro F1 and
Jaccard in transfer.json beside the one-vs-rest n-gram baseline; fine-tuning with a sigmoid head; and
mlstm-classify's labels (every label at or over its threshold) scoring what transfer.json reports.

The set is synthetic, made from a public-domain novel (tests/fixtures/corpora/botchan.txt): each sentence
labelled by what it holds (dialogue: a quotation mark; question; exclamation; first person: the word I).
"""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from test_checkpoints_consolidate import fake_checkpoint, tiny
from test_classify import botchan_sentences, write_rows

from app.classify import main as classify_main
from app.probing.scores import multilabel_scores
from app.transfer import main as transfer_main

LABELS = {
    "dialogue": lambda s: '"' in s,
    "question": lambda s: "?" in s,
    "exclaim": lambda s: "!" in s,
    "first_person": lambda s: re.search(r"\bI\b", s) is not None,
}


def labelled(sentences: list[str], layout: str) -> list[dict]:
    """layout "list": one column `labels` of label lists; "columns": one 0/1 column per label."""
    if layout == "list":
        return [{"text": s, "labels": [n for n, f in LABELS.items() if f(s)]} for s in sentences]
    return [{"text": s, **{n: int(f(s)) for n, f in LABELS.items()}} for s in sentences]


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    root = tmp_path_factory.mktemp("multilabel")
    fake_checkpoint(root / "run", tiny(), "module")
    s = botchan_sentences()
    return root, {"train": s[:700], "validation": s[700:1000], "test": s[1000:1300]}


def run_transfer(root, splits, layout: str, *extra: str) -> dict:
    suffix = ".jsonl" if layout == "list" else ".csv"
    args = ["--checkpoint", str(root / "run"), "--out", str(root / layout), "--heatmap-texts", "2"]
    for name, sentences in splits.items():
        args += [f"--{name}", str(write_rows(root / f"{layout}_{name}{suffix}", labelled(sentences, layout)))]
    fields = ["labels"] if layout == "list" else list(LABELS)
    assert transfer_main([*args, "--label-field", *fields, *extra]) == 0
    return json.loads((root / layout / "transfer.json").read_text())


def test_one_vs_rest_probes_thresholds_f1_and_the_ngram_baseline(task, capsys):
    root, splits = task
    res = run_transfer(root, splits, "list", "--finetune-epochs", "0", "--features", "mean_hidden")
    names = sorted(LABELS)  # a list column's labels: their sorted union
    assert res["task"] == "multi_label" and res["labels"] == names
    assert set(res["thresholds"]) == set(names) and all(0 < t < 1 for t in res["thresholds"].values())
    Y = np.asarray([[int(LABELS[n](s)) for n in names] for s in splits["test"]])
    assert res["label_counts"]["test"] == dict(zip(names, Y.sum(0).tolist()))
    f1 = res["test_f1_by_label"]
    assert res["test_macro_f1"] == pytest.approx(np.mean([f1[n] for n in names]))
    assert 0 <= res["test_jaccard"] <= 1 and res["test_f1_by_label"]["dialogue"] > 0.5
    base = res["ngram_baseline"]
    assert "one-vs-rest" in base["model"] and set(base["thresholds"]) == set(names)
    assert base["test_f1_by_label"]["dialogue"] > 0.5 and 0 < base["test_macro_f1"] <= 1
    out = capsys.readouterr().out
    assert "probe mean_hidden, label question: C " in out and "validation F1" in out
    assert "test F1 per label: " in out and "n-gram baseline" in out
    assert res["chosen"] == {
        "method": "probe",
        "val_macro_f1": res["val_macro_f1"],
        "test_macro_f1": res["test_macro_f1"],
    }


def test_fine_tuning_with_a_sigmoid_head_and_classify_scores_what_transfer_reported(task, tmp_path):
    """Several indicator columns (CSV); fine-tuning beside the probe; the kept classifier (whichever the
    validation split chose) labels the test split with transfer.json's macro F1."""
    root, splits = task
    res = run_transfer(root, splits, "columns", "--finetune-epochs", "2", "--features", "final_hidden")
    assert res["labels"] == list(LABELS)  # the columns, in the order given
    ft = res["finetune"]
    assert len(ft["val_macro_f1_by_epoch"]) == 2 and len(ft["thresholds"]) == len(LABELS)
    chosen = res["chosen"]
    out = tmp_path / "labels.jsonl"
    src = root / "columns_test.csv"
    assert classify_main(["--classifier", res["classifier"], "--input", str(src), "--output", str(out)]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    names = list(LABELS)
    P = np.asarray([[int(n in r["predicted"]) for n in names] for r in rows])
    Y = np.asarray([[int(LABELS[n](s)) for n in names] for s in splits["test"]])
    assert multilabel_scores(Y, P, names)["macro_f1"] == chosen["test_macro_f1"]
    meta = json.loads((root / "columns" / "classifier" / "config.json").read_text())
    thr = meta["classifier"]["thresholds"]
    for r in rows:  # every label at or over its threshold, and no other
        assert r["predicted"] == [n for n, t in zip(names, thr) if r[f"p_{n}"] >= t] or any(
            abs(r[f"p_{n}"] - t) < 1e-6 for n, t in zip(names, thr)
        )
    assert (
        meta["problem_type"] == "multi_label_classification"
        and meta["classifier"]["method"] == chosen["method"]
    )


@pytest.mark.parametrize(
    ("rows", "fields", "needle"),
    [
        (
            [{"text": "abc", "a": 1, "b": 0}, {"text": "def", "a": 1, "b": 1}],
            ["a", "b"],
            "every row of --train has the label 'a'",
        ),
        ([{"text": "abc", "a": 2, "b": 0}, {"text": "def", "a": 0, "b": 1}], ["a", "b"], "row 1: 'a' is 2"),
        (
            [{"text": "abc", "labels": ["x"]}, {"text": "d", "labels": "x"}],
            ["labels"],
            "row 2: 'labels' is 'x', not a list",
        ),
    ],
)
def test_bad_multi_label_input_is_one_line(task, tmp_path, capsys, rows, fields, needle):
    root, _ = task
    train = write_rows(tmp_path / "train.jsonl", rows)
    args = [
        "--checkpoint",
        str(root / "run"),
        "--train",
        str(train),
        "--test",
        str(train),
        "--out",
        str(tmp_path),
    ]
    assert transfer_main([*args, "--label-field", *fields]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0], err
