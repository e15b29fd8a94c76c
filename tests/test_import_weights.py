"""app/import_weights.py (`mlstm-import`): an import is an ordinary export that every command reads.

- OpenAI's layout at a small size, and (the `long` tier) at the `large` size (64 x 4096, OpenAI's own), built
  at random here (no download), is imported, then
  evaluated (app/evaluate.py: its loss on a text is the one encoder.py's equations give), sampled
  (app/generate.py) and featurized and probed (app/transfer.py: the features are OpenAI's `transform`'s,
  the final cell state after "\\n " + text + " ", through the export's feature_preprocess), and the probe
  transfer keeps labels new text (app/classify.py) at the accuracy transfer.json reports;
- a small import starts a real training run (`train --init-from`), whose first validation loss is the one
  app/evaluate.py measures on the import;
- a sentiment-discovery import loads in transformers (--check-hf); bad flags are one line.
"""

from __future__ import annotations

import csv
import json
import math

import numpy as np
import pytest
import torch
from launcher import train_one_process
from test_checkpoints_import_openai import l2_normalize, run_import, write_openai
from test_checkpoints_import_sentiment_discovery import nested, sd_params
from test_checkpoints_importing import openai_preprocess
from test_checkpoints_warm_start import FINE_TUNE, _start_loss
from test_evaluate import evaluate_cli

from app.checkpoints.export_format import feature_preprocess
from app.checkpoints.importing import NEVER
from app.classifier.features import token_ids
from app.classify import main as classify_main
from app.export import load_exported
from app.generate import main as generate_main
from app.import_weights import main as import_main
from app.model.config import PRESETS
from app.probing.features import featurize_sets
from app.transfer import main as transfer_main

TEXTS = ["I loved this product, it works great!", "Terrible. Broke &amp; died\nafter a day.", "ok"]


class OpenAIStepper:
    """encoder.py's model (float32 numpy, from its published equations) at any size: `run(bytes)` from a
    zero state -> (per-step logits (T, 256), final c (H,))."""

    def __init__(self, arrays: list[np.ndarray]) -> None:
        p = arrays
        self.emb, self.b, self.out_w, self.out_b = p[0], p[8], p[13], p[14]
        self.wx = l2_normalize(p[1]) * p[9]
        self.wh = l2_normalize(np.concatenate(p[2:6], axis=1)) * p[10]
        self.wmx, self.wmh = l2_normalize(p[6]) * p[11], l2_normalize(p[7]) * p[12]

    def run(self, data: bytes) -> tuple[np.ndarray, np.ndarray]:
        H = self.wmh.shape[0]
        h, c, logits = np.zeros(H, np.float32), np.zeros(H, np.float32), []
        for byte in data:
            x = self.emb[byte]
            z = x @ self.wx + ((x @ self.wmx) * (h @ self.wmh)) @ self.wh + self.b
            gates = 1 / (1 + np.exp(-z[: 3 * H]))  # i, f, o
            c = gates[H : 2 * H] * c + gates[:H] * np.tanh(z[3 * H :])
            h = gates[2 * H :] * np.tanh(c)
            logits.append(h @ self.out_w + self.out_b)
        return np.stack(logits), c


def nats_of_text(stepper: OpenAIStepper, data: bytes) -> float:
    """Mean nats per target of [BOS] + data -> data + [EOS] in our 259-way softmax, from their logits: BOS
    reads as "\\n", EOS's logit is "\\n"'s, pad and BOS are never predicted."""
    logits, _ = stepper.run(b"\n" + data)
    ours = np.concatenate([np.full((len(logits), 1), NEVER), np.full((len(logits), 1), NEVER),
                           logits[:, 10:11], logits], axis=1).astype(np.float64)  # fmt: skip
    logz = np.log(np.exp(ours - ours.max(1, keepdims=True)).sum(1)) + ours.max(1)
    targets = [byte + 3 for byte in data] + [2]
    return float(np.mean([logz[t] - ours[t, k] for t, k in enumerate(targets)]))


SIZES = {"small": {"embed_dim": 16, "hidden_dim": 64, "num_layers": 1}, "large": PRESETS["large"]}


@pytest.fixture(scope="module", params=["small", pytest.param("large", marks=pytest.mark.long)])
def openai_import(request, tmp_path_factory):
    """OpenAI's layout, random, imported at a small size (the default run) and at the `large` preset's,
    OpenAI's own 64 x 4096 (the `long` tier: minutes of CPU): (export folder, the arrays, the sizes)."""
    root = tmp_path_factory.mktemp(request.param)
    size = SIZES[request.param]
    assert size["num_layers"] == 1  # OpenAI's model: one layer
    arrays = write_openai(root / "repo" / "model", E=size["embed_dim"], H=size["hidden_dim"])
    assert import_main(["--from", "openai", str(root / "repo"), "--out", str(root / "exp")]) == 0
    return root / "exp", arrays, size


def no_kernel_timing(monkeypatch) -> None:
    """As tests/launcher.py's processes run: one matmul path, no per-shape kernel timing (at 4096 wide the
    timing of every row bucket costs minutes on this 2-core machine; app/model/matmul.py)."""
    monkeypatch.setenv("MLSTM_MATMUL", "mm")


def test_openai_import_is_an_export_that_evaluates_and_generates(
    openai_import, tmp_path, capsys, monkeypatch
):
    no_kernel_timing(monkeypatch)
    exp, arrays, size = openai_import
    cfg = json.loads((exp / "config.json").read_text())
    assert cfg["format"] == "mlstm-ds-export" and cfg["feature_preprocess"] == "openai"
    assert {k: cfg["model_config"][k] for k in size} == size
    assert cfg["tokenizer"]["type"] == "byte" and cfg["model_type"] == "multiplicative_lstm"
    assert "## Origin" in (exp / "README.md").read_text()
    text = tmp_path / "review.txt"
    text.write_text(TEXTS[0])
    res = evaluate_cli(exp, tmp_path / "e.json", "--text", str(text))["texts"][0]
    assert res["tokens"] == len(TEXTS[0]) + 1  # the bytes and EOS
    want = nats_of_text(OpenAIStepper(arrays), TEXTS[0].encode())
    assert res["loss"] == pytest.approx(want, rel=1e-4), (res["loss"], want)
    assert res["bits/byte"] == pytest.approx(want * res["tokens"] / math.log(2) / res["bytes"], rel=1e-4)
    capsys.readouterr()
    rc = generate_main(
        ["--checkpoint", str(exp), "--prompt", "This is ", "--max-new-tokens", "12", "--seed", "1"]
    )
    out = capsys.readouterr()
    assert rc == 0 and out.out.startswith("This is ") and "new tokens" in out.err, out


def test_openai_import_featurizes_as_openai_transform_transfers_and_classifies(
    openai_import, tmp_path, capsys, monkeypatch
):
    no_kernel_timing(monkeypatch)
    exp, arrays, size = openai_import
    assert feature_preprocess(exp) == "openai"
    model, tok, _ = load_exported(exp)
    feats = featurize_sets(model, token_ids(tok, TEXTS, "openai"), [0], 4096, tok.pad_id)
    stepper = OpenAIStepper(arrays)
    for text, got in zip(TEXTS, feats.features["final_cell"], strict=True):
        _, want = stepper.run(openai_preprocess(text))  # transform(): the final cell state
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-4 * max(1.0, float(np.abs(want).max())))
    del model
    rows = [(t, lab) for t, lab in zip(TEXTS * 4, ["pos", "neg", "pos"] * 4, strict=True)]
    for name, part in (("train.csv", rows), ("test.csv", rows[:6])):
        with (tmp_path / name).open("w", newline="") as f:
            csv.writer(f).writerows([("text", "label"), *part])
    args = [
        "--checkpoint",
        str(exp),
        "--train",
        str(tmp_path / "train.csv"),
        "--test",
        str(tmp_path / "test.csv"),
    ]
    assert transfer_main([*args, "--out", str(tmp_path / "t"), "--finetune-epochs", "0"]) == 0
    assert "feature_preprocess 'openai'" in capsys.readouterr().out
    res = json.loads((tmp_path / "t" / "transfer.json").read_text())
    assert (
        res["hidden_dim"] == size["hidden_dim"]
        and res["rows"] == {"train": 12, "test": 6}
        and 0 <= res["test_accuracy"] <= 1
    )
    # the kept classifier labels new text with the imported model under it: the test split's accuracy is
    # the one transfer.json reports for it
    assert res["classifier"] == str(tmp_path / "t" / "classifier") and res["chosen"]["method"] == "probe"
    out = tmp_path / "labels.csv"
    argv = ["--classifier", res["classifier"], "--input", str(tmp_path / "test.csv"), "--output", str(out)]
    assert classify_main([*argv, "--keep-fields", "label"]) == 0
    with out.open(newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 6 and {r["predicted"] for r in rows} <= {"pos", "neg"}
    assert np.mean([r["predicted"] == r["label"] for r in rows]) == res["test_accuracy"]


def test_train_init_from_an_import_starts_from_its_weights(prepared_byte_dir, tmp_path):
    write_openai(tmp_path / "oa", E=16, H=32)
    assert import_main(["--from", "openai", str(tmp_path / "oa"), "--out", str(tmp_path / "exp")]) == 0
    want = evaluate_cli(
        tmp_path / "exp", tmp_path / "e.json", "--data", str(prepared_byte_dir), "--split", "validation"
    )
    p = train_one_process(prepared_byte_dir, tmp_path / "ft", "--init-from", str(tmp_path / "exp"), *FINE_TUNE,
                          model=None)  # fmt: skip
    assert p.returncode == 0, p.stderr[-3000:]
    assert "weights from export" in p.stderr and "hidden_dim 32" in p.stderr, p.stderr[-3000:]
    assert _start_loss(tmp_path / "ft") == pytest.approx(want["validation/loss"], rel=1e-5)
    assert json.loads((tmp_path / "ft" / "final_metrics.json").read_text())["step"] == 2


def test_a_sentiment_discovery_import_loads_in_transformers(tmp_path, capsys):
    torch.save(nested(sd_params(257, 8, 12, 2, True, False)), tmp_path / "mlstm.pt")
    rc, out, err = run_import(capsys, "--from", "sentiment-discovery", str(tmp_path / "mlstm.pt"),
                              "--out", str(tmp_path / "exp"), "--feature-preprocess", "none", "--check-hf")  # fmt: skip
    assert rc == 0, err
    assert (
        "imported sentiment-discovery mlstm.pt: 2 layer(s), hidden 12" in out
        and "transformers loads it" in out
    )
    assert "gate order i, f, g, o reordered" in out and feature_preprocess(tmp_path / "exp") == "none"


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--from", "keras", "x", "--out", "o"], "KIND must be one of openai, sentiment-discovery, got 'keras'"),
        (["--from", "openai", "x"], "--out is required"),
        (["--out", "o"], "--from KIND PATH is required"),
        (["--from", "openai"], "--from: expected 2 arguments"),
        (["--from", "openai", "x", "--out", "o", "--feature-preprocess", "nvidia"], "--feature-preprocess"),
    ],
)  # fmt: skip
def test_bad_flags_are_one_line(capsys, args, needle):
    rc, _, err = run_import(capsys, *args)
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1 and needle in lines[0], err
