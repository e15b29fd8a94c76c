"""app/probing/run.py: transfer end to end on a tiny random model (tests/test_transfer.py has the rest)."""

from __future__ import annotations

import csv
import json

import pytest
from test_checkpoints_consolidate import fake_checkpoint, tiny

from app.transfer import main as transfer_main


@pytest.mark.parametrize("fraction", [0.75, 0.99])
def test_the_validation_split_keeps_every_class_on_the_fitting_side(tmp_path, capsys, fraction):
    """A 2-row class at --val-fraction 0.75 was held out whole (round(1.5) = 2 rows), and the n-gram
    baseline fit on the other two classes then met three: sklearn's "liblinear does not support multiclass"
    traceback reached the user (base 2652e8d). Now a class of n rows gives validation at most n - 1."""
    fake_checkpoint(tmp_path / "run", tiny(), "module")
    rows = [(f"abc {i} abc", "a") for i in range(10)] + [(f"99 {i} 99", "b") for i in range(10)]
    rows += [("x y x", "c"), ("y x y", "c")]
    with (tmp_path / "train.csv").open("w", newline="") as f:
        csv.writer(f).writerows([("text", "label"), *rows])
    args = ["--checkpoint", str(tmp_path / "run"), "--train", str(tmp_path / "train.csv")]
    args += ["--test", str(tmp_path / "train.csv"), "--out", str(tmp_path / "o"), "--finetune-epochs", "0"]
    assert transfer_main([*args, "--val-fraction", str(fraction)]) == 0, capsys.readouterr().err
    res = json.loads((tmp_path / "o" / "transfer.json").read_text())
    held = {k: min(round(fraction * n), n - 1) for k, n in (("a", 10), ("b", 10), ("c", 2))}
    assert res["train_val_rows"] == [22 - sum(held.values()), sum(held.values())]
