"""app/classifying/writers.py: multi-label outputs say which labels were predicted without ambiguity: a JSON
list in JSONL and Parquet, an escaped join in CSV that `split_labels` (docs/classify.md's reading) reads
back, for labels holding the separator and the escape themselves."""

from __future__ import annotations

import csv
import json

import numpy as np
from test_classifying_inputs import cheap_classifier, classify, texts

from app.classifying.writers import join_labels, split_labels

LABELS = ["a;b", "c\\d", "e", "f;"]


def test_a_join_of_labels_that_hold_the_separator_reads_back():
    rng = np.random.default_rng()
    for _ in range(200):
        picked = [n for n in LABELS if rng.uniform() < 0.5]
        assert split_labels(join_labels(picked)) == picked
    assert join_labels(["a;b", "c"]) != join_labels(["a", "b", "c"])
    assert join_labels(["x", "y"]) == "x;y"  # labels without ";" or "\\" are joined as before


def test_every_output_format_says_which_labels_were_predicted(tmp_path):
    folder = cheap_classifier(tmp_path, LABELS, multi=True)
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts(40)), encoding="utf-8")
    for fmt in ("csv", "jsonl", "parquet"):
        assert classify("--classifier", folder, "--input", src, "--output", tmp_path / f"o.{fmt}") == 0
    as_list = [json.loads(ln)["predicted"] for ln in (tmp_path / "o.jsonl").read_text().splitlines()]
    import pyarrow.parquet as pq

    assert pq.read_table(tmp_path / "o.parquet").column("predicted").to_pylist() == as_list
    with (tmp_path / "o.csv").open(newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    assert [split_labels(r["predicted"]) for r in rows] == as_list
    assert any("a;b" in p for p in as_list) and any(len(p) > 1 for p in as_list)  # a real test of the join
    for r, want in zip(rows, as_list):  # every label at or over its threshold (0.5), and no other
        assert want == [n for n in LABELS if float(r[f"p_{n}"]) >= 0.5]
