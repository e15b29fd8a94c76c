"""The classifier folder loads with transformers: AutoModelForSequenceClassification and
pipeline("text-classification") (trust_remote_code) give mlstm-classify's labels and probabilities on 100
sentences of a public-domain novel, for every feature kind, several layers, a two-class probe (one logit),
three classes, multi-label (thresholds from the config), a fine-tuned head that reads at most N tokens and
a model whose texts are prepared as OpenAI's encoder prepared them (an import's feature_preprocess).
The folder is also a --checkpoint: its language model loads as an export's."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch
from test_checkpoints_consolidate import fake_checkpoint, tiny
from test_classify import botchan_sentences, write_rows
from test_export_hf import HF, transformers  # noqa: F401  (the fixture)

from app.checkpoints.loader import open_source
from app.classifier.folder import write_classifier
from app.classifier.head import Head
from app.classify import main as classify_main

KINDS = {  # name: (method, feature, layers, outputs, labels, multi, max_tokens, feature_preprocess)
    "probe_final_cell_two_classes": ("probe", "final_cell", [1], 1, ["neg", "pos"], False, 0, "none"),
    "probe_final_hidden_three": ("probe", "final_hidden", [0], 3, ["a", "b", "c"], False, 0, "none"),
    "probe_mean_layers_multi": ("probe", "mean_hidden", [1, 0], 3, ["x", "y", "z"], True, 0, "none"),
    "probe_max_hidden": ("probe", "max_hidden", [0, 1], 2, ["no", "yes"], False, 0, "none"),
    "finetune_cut_at_40_tokens": ("finetune", "mean_hidden", [1], 2, ["neg", "pos"], False, 40, "none"),
    "probe_openai_preprocess": ("probe", "final_cell", [1], 1, ["neg", "pos"], False, 0, "openai"),
}


def random_head(name: str, X: np.ndarray, rng) -> Head:
    """A head of KINDS[name] on features X (n, d) of the texts, drawn so its labels vary over them: the
    features standardised by their own statistics (a probe's mean and scale, a fine-tuned head's weights
    divided by them) times weights of unit spread."""
    method, feature, layers, k, labels, multi, max_tokens, _ = KINDS[name]
    mean, scale = X.mean(0), np.maximum(X.std(0), 1e-3)
    w = rng.normal(0, 2 / np.sqrt(X.shape[1]), (k, X.shape[1]))
    b = rng.normal(0, 0.3, k)
    if method == "finetune":
        w, b = (w / scale).astype(np.float32), (b - (w / scale) @ mean).astype(np.float32)
        mean, scale = np.zeros_like(mean), np.ones_like(scale)
    thresholds = rng.uniform(0.3, 0.7, k) if multi else None
    return Head(method, multi, labels, feature, layers, mean.astype(np.float32), scale.astype(np.float32),
                w, b, thresholds, max_tokens, [0, 1, 2])  # fmt: skip


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """A kept classifier of each kind on the tiny byte model (random heads, fresh seed each run)."""
    from app.classifier.features import pooled, token_ids
    from app.probing.features import featurize_sets

    root = tmp_path_factory.mktemp("clf")
    fake_checkpoint(root / "run", tiny(), "module")
    src = open_source(root / "run")
    model, tok = src.load_model(), src.tokenizer()
    seed = int.from_bytes(os.urandom(4), "little")
    rng = np.random.default_rng(seed)
    texts = [*botchan_sentences()[200:298], "Tom &amp; Jerry &lt;3\nsaid &quot;hi&quot;", "  two\nlines  "]
    out = {}
    for name, (method, feature, layers, *_, max_tokens, preprocess) in KINDS.items():
        ids = token_ids(tok, texts, preprocess)
        if method == "finetune":
            cut = [torch.as_tensor(s[:max_tokens]) for s in ids]
            with torch.no_grad():
                X = np.stack([pooled(model, c[None], torch.tensor([len(c)]), layers)[0].numpy() for c in cut])
        else:
            X = featurize_sets(model, ids, layers, 16384, tok.pad_id).features[feature]
        head = random_head(name, X, rng)
        about = {"C": None, "lm": {}}
        out[name] = write_classifier(
            root / name, src, src.tokenizer_meta, model.state_dict(), head, about, preprocess
        )
    write_rows(root / "texts.jsonl", [{"text": t} for t in texts])
    return out, root / "texts.jsonl", texts, seed


def ours(folder, src, tmp_path) -> list[dict]:
    out = tmp_path / f"{folder.name}.jsonl"
    assert classify_main(["--classifier", str(folder), "--input", str(src), "--output", str(out)]) == 0
    return [json.loads(line) for line in out.read_text().splitlines()]


@pytest.mark.parametrize("name", list(KINDS))
def test_pipeline_and_auto_model_give_mlstm_classify_labels_and_probabilities(
    transformers,  # noqa: F811
    folders,
    name,
    tmp_path,
):
    made, src, texts, seed = folders
    folder, (_, _, _, _, labels, multi, *_) = made[name], KINDS[name]
    want = ours(folder, src, tmp_path)
    model = transformers.AutoModelForSequenceClassification.from_pretrained(str(folder), **HF).eval()
    tok = transformers.AutoTokenizer.from_pretrained(str(folder), **HF)
    assert model.config.id2label == dict(enumerate(labels))
    pipe = transformers.pipeline("text-classification", model=model, tokenizer=tok, top_k=None, batch_size=8)
    got = pipe(texts)
    p_ours = np.asarray([[r[f"p_{n}"] for n in labels] for r in want])
    p_theirs = np.asarray([[{d["label"]: d["score"] for d in row}[n] for n in labels] for row in got])
    np.testing.assert_allclose(p_theirs, p_ours, rtol=1e-4, atol=1e-5, err_msg=f"seed {seed}")
    if multi:  # the thresholds travel in the config; pipeline gives every label's score
        thr = model.config.classifier_thresholds
        theirs = [
            [n for n, t in zip(labels, thr) if {d["label"]: d["score"] for d in row}[n] >= t] for row in got
        ]
    else:
        theirs = [row[0]["label"] for row in got]  # top_k=None: sorted by score
    assert theirs == [r["predicted"] for r in want], f"seed {seed}"
    assert len({str(r["predicted"]) for r in want}) > 1  # the labels vary: a real comparison
    batch = tok(texts[:5], return_tensors="pt", padding=True)  # left padding, as the tokenizer says
    with torch.no_grad():
        logits = model(**batch).logits
    assert logits.shape == (5, len(labels))


def test_the_folder_is_a_checkpoint_its_language_model_loads(folders):
    made, *_ = folders
    folder = made["finetune_cut_at_40_tokens"]
    src = open_source(folder)
    run = open_source(folder.parent / "run")
    assert src.kind == "export" and src.model_cfg == run.model_cfg
    a, b = src.load_model().state_dict(), run.load_model().state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)  # the head's tensors left out
