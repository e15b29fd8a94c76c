"""app/probing/keep.py: a kept fine-tuned classifier labels text exactly as fine-tuning scored it, and a
classifier folder (app.classifier.folder) is read by the handed-folder rules (app/common/handed.py): nothing outside the folder, its
fields and the head's shapes checked before use, each problem one line naming the file and the field."""

from __future__ import annotations

import json
import os
import random
import shutil

import numpy as np
import pytest
import torch
from test_checkpoints_consolidate import fake_checkpoint, tiny
from test_classify import write_rows
from test_transfer import texts_of

from app.checkpoints.loader import open_source
from app.classifier.features import token_ids
from app.classifier.folder import read_classifier, write_classifier
from app.classify import main as classify_main
from app.common.errors import UserError
from app.probing.finetune import FineTuneConfig, fine_tune
from app.probing.keep import finetune_head, probe_head

ALPHABETS = {"letters": "abcdefgh ", "digits": "0123456789.,;"}


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    """The tiny model fine-tuned on letters against digits (tests/test_transfer.py's task), kept; its test
    texts as JSONL."""
    root = tmp_path_factory.mktemp("keep")
    fake_checkpoint(root / "run", tiny(), "module")
    src = open_source(root / "run")
    model, tok = src.load_model(), src.tokenizer()
    rng = random.Random(0)
    parts = {
        name: [{"text": t, "label": k} for k, a in ALPHABETS.items() for t in texts_of(a, n, rng)]
        for name, n in (("train", 60), ("val", 20), ("test", 40))
    }
    splits = tuple(
        (
            token_ids(tok, [r["text"] for r in p]),
            np.asarray([r["label"] == "digits" for r in p], dtype=np.int64),
        )
        for p in parts.values()
    )
    cfg = FineTuneConfig(
        epochs=2, lr=3e-3, rows=16, batch_tokens=4096, max_tokens=24, seed=0, from_scratch=False
    )
    ft = fine_tune(model, splits, [1], 2, cfg, tok.pad_id)
    head = finetune_head(ft, [1], ["letters", "digits"], False, 24)
    folder = write_classifier(
        root / "clf", src, src.tokenizer_meta, ft.classifier.lm.state_dict(), head, {"C": None}
    )
    return root, folder, ft, write_rows(root / "test.jsonl", parts["test"])


def test_a_kept_fine_tuned_classifier_predicts_what_fine_tuning_scored(tuned, tmp_path, monkeypatch):
    _, folder, ft, test = tuned
    monkeypatch.setenv("OMP_NUM_THREADS", str(torch.get_num_threads()))  # the threads fine-tuning had
    out = tmp_path / "labels.jsonl"
    assert classify_main(["--classifier", str(folder), "--input", str(test), "--output", str(out)]) == 0
    got = [json.loads(line)["predicted"] for line in out.read_text().splitlines()]
    want = [["letters", "digits"][k] for k in ft.test_pred]
    assert got == want and len(set(got)) == 2
    head = read_classifier(folder).head
    assert head.method == "finetune" and head.max_tokens == 24 and head.feature == "mean_hidden"
    w = ft.classifier.head.weight.detach().numpy()
    np.testing.assert_array_equal(head.weight, w)  # kept as trained, bit for bit


def mutate_config(folder, **changes):
    cfg = json.loads((folder / "config.json").read_text())
    cfg["classifier"].update(changes)
    (folder / "config.json").write_text(json.dumps(cfg))


@pytest.mark.parametrize(
    ("how", "needle"),
    [
        ("layers", "classifier.layers must be a list of distinct layer indices in [0, 2)"),
        ("feature", "classifier.feature must be one of final_cell"),
        ("labels", "describes a head of 3 labels on 64 features"),
        ("task", "classifier.thresholds must be 2 numbers in [0, 1]"),
        ("top_neurons", "classifier.top_neurons must be a list of feature columns in [0, 64)"),
        ("max_tokens", "classifier.max_tokens must be an integer"),
        ("link", "points outside"),
        ("head_shape", "the head's shapes do not fit together"),
        ("export", "a language model's export, not a classifier"),
    ],
)
def test_a_tampered_folder_is_refused_in_one_line(tuned, tmp_path, capsys, how, needle):
    _, folder, _, test = tuned
    d = tmp_path / "clf"
    shutil.copytree(folder, d)
    if how == "layers":
        mutate_config(d, layers=[5])
    elif how == "feature":
        mutate_config(d, feature="cells")
    elif how == "labels":
        mutate_config(d, labels=["a", "b", "c"])
    elif how == "task":
        mutate_config(d, task="multi_label", thresholds=[0.5])
    elif how == "top_neurons":
        mutate_config(d, top_neurons=[0, 64])
    elif how == "max_tokens":
        mutate_config(d, max_tokens=-1)
    elif how == "link":
        outside = tmp_path / "elsewhere.model"
        outside.write_text("x")
        os.symlink(outside, d / "tokenizer.model")
    elif how == "head_shape":
        from safetensors.torch import load_file, save_file

        sd = load_file(str(d / "model.safetensors"))
        sd["classifier.bias"] = torch.zeros(3)
        save_file(sd, str(d / "model.safetensors"))
    elif how == "export":
        cfg = json.loads((d / "config.json").read_text())
        cfg["format"] = "mlstm-ds-export"
        (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UserError):
        read_classifier(d)
    rc = classify_main(["--classifier", str(d), "--input", str(test), "--output", str(tmp_path / "o.csv")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and needle in err[0], err


def test_a_probe_head_keeps_its_fit(tmp_path):
    """probe_head: mean and scale float32 and the weights float64 as fitted, top neurons by |weight|."""
    from types import SimpleNamespace

    rng = np.random.default_rng(int.from_bytes(os.urandom(4), "little"))
    coef = rng.normal(size=(1, 64)) * (rng.uniform(size=64) > 0.7)
    probe = SimpleNamespace(coef=coef, intercept=np.array([0.3]))
    mean, scale = rng.normal(size=64).astype(np.float32), rng.uniform(0.5, 1, 64).astype(np.float32)
    head = probe_head("final_cell", [1], probe, mean, scale, ["a", "b"], False)
    assert head.weight.dtype == np.float64 and head.mean.dtype == np.float32
    assert head.top_neurons[0] == int(np.abs(coef[0]).argmax()) and len(head.top_neurons) == (coef != 0).sum()
    fake_checkpoint(tmp_path / "run", tiny(), "module")
    src = open_source(tmp_path / "run")
    folder = write_classifier(
        tmp_path / "clf", src, src.tokenizer_meta, src.load_model().state_dict(), head, {"C": 0.5}
    )
    back = read_classifier(folder).head
    for k in ("mean", "scale", "weight", "bias"):
        np.testing.assert_array_equal(getattr(back, k), getattr(head, k))
        assert getattr(back, k).dtype == getattr(head, k).dtype
