"""app/checkpoints/importing.py: an imported model's byte ids on our byte tokenizer (BOS and EOS as "\\n",
pad and BOS never predicted), weight norm's zero rows refused, and the export's feature_preprocess that
app/transfer.py honours (app/probing/features.prepare_texts).

The helpers here (`our_steps`, `load_float64`) serve the readers' tests too
(tests/test_checkpoints_import_openai.py, tests/test_checkpoints_import_sentiment_discovery.py).
"""

from __future__ import annotations

import html
import json

import numpy as np
import pytest
import torch

from app.checkpoints.export_format import feature_preprocess
from app.checkpoints.importing import NEVER, Imported, ImportedLayer, to_state_dict, write_import
from app.classifier.features import prepare_texts, token_ids
from app.common.errors import UserError
from app.model.lm import LanguageModel
from data_prep.tokenizer import ByteTokenizer

TOK = ByteTokenizer()


def load_float64(imported: Imported) -> LanguageModel:
    """The imported model (its float32 export weights, exactly) in float64, eval mode, the Python core."""
    cfg, sd = to_state_dict(imported)
    cfg.core = "python"
    model = LanguageModel(cfg)
    model.load_state_dict(sd, strict=True)
    return model.double().eval()


@torch.no_grad()
def our_steps(model: LanguageModel, ids: torch.Tensor) -> list[dict]:
    """ids (B, T) of our tokenizer -> per step {"logits" (B, V), "h": [per layer (B, H)], "c": [...]}, one
    `RecurrentLayer.step` at a time from a zero state (float64 when the model is)."""
    B = ids.shape[0]
    states = [layer.init_state(B, "cpu", torch.float64) for layer in model.recurrent]
    out = []
    for t in range(ids.shape[1]):
        x = model.embedding(ids[:, t])  # (B, E)
        for i, layer in enumerate(model.recurrent):
            x, states[i] = layer.step(x, states[i])  # (B, H)
        out.append({"logits": model.head(x), "h": [s[0] for s in states], "c": [s[1] for s in states]})
    return out


def tiny_imported(rng: np.random.Generator, byte_offset: int = 0, E: int = 4, H: int = 6) -> Imported:
    V = 256 + byte_offset

    def t(*shape):
        return torch.from_numpy(rng.standard_normal(shape).astype(np.float32))

    layer = ImportedLayer(
        w_in=t(5 * H, E), w_mh=t(H, H), w_m=t(4 * H, H), bias=t(4 * H),
        gains=(t(5 * H), t(H), t(4 * H)), names=("w_in", "w_mh", "w_m"),
    )  # fmt: skip
    return Imported(
        kind="openai",
        source="tiny",
        embedding=t(V, E),
        head_weight=t(V, H),
        head_bias=t(V),
        byte_offset=byte_offset,
        pad_row=0 if byte_offset else None,
        layers=[layer],
    )


@pytest.mark.parametrize("offset", [0, 1])
def test_byte_rows_land_on_our_ids_bos_and_eos_read_as_newline(offset):
    imp = tiny_imported(np.random.default_rng(offset), offset)
    _, sd = to_state_dict(imp)
    emb, w, b = sd["0.weight"], sd["2.weight"], sd["2.bias"]
    assert emb.shape == (TOK.vocab_size, 4) and w.shape == (TOK.vocab_size, 6)
    assert TOK.encode("A") == [65 + TOK.OFFSET]
    for byte in (0, 10, 65, 255):
        ours, theirs = byte + TOK.OFFSET, byte + offset
        assert torch.equal(emb[ours], imp.embedding[theirs])
        assert torch.equal(w[ours], imp.head_weight[theirs]) and b[ours] == imp.head_bias[theirs]
    newline = 10 + offset
    assert torch.equal(emb[TOK.bos_id], imp.embedding[newline]) and torch.equal(
        emb[TOK.eos_id], imp.embedding[newline]
    )
    assert torch.equal(w[TOK.eos_id], imp.head_weight[newline]) and b[TOK.eos_id] == imp.head_bias[newline]
    assert not w[TOK.bos_id].any() and b[TOK.bos_id] == NEVER
    if offset:  # the source's pad row is ours
        assert torch.equal(emb[TOK.pad_id], imp.embedding[0]) and b[TOK.pad_id] == imp.head_bias[0]
    else:
        assert not emb[TOK.pad_id].any() and b[TOK.pad_id] == NEVER


def test_a_weight_normed_row_of_zeros_is_refused_in_one_line():
    imp = tiny_imported(np.random.default_rng(0))
    imp.layers[0].w_mh[3] = 0.0
    with pytest.raises(UserError) as e:
        to_state_dict(imp)
    assert "w_mh: output unit 3 has an all-zero weight vector" in str(e.value) and "\n" not in str(e.value)


def openai_preprocess(text: str) -> bytes:
    """OpenAI's utils.preprocess, from its published code: unescape, newlines to spaces, strip, pad."""
    return ("\n " + html.unescape(text).replace("\n", " ").strip() + " ").encode()


def test_openai_preprocessing_after_bos_is_their_padded_text():
    """[BOS] + prepare_texts(...) with BOS read as "\\n" is, id for id, OpenAI's "\\n " + text + " "."""
    texts = ["  A &amp; B\nsecond line ", "caf\u00e9 &lt;3", ""]
    for seq, text in zip(token_ids(TOK, texts, "openai"), texts, strict=True):
        as_bytes = [10 if i == TOK.bos_id else i - TOK.OFFSET for i in seq.tolist()]
        assert bytes(as_bytes) == openai_preprocess(text)
    assert prepare_texts(texts, "none") == texts
    with pytest.raises(ValueError):
        prepare_texts(texts, "nvidia")


def test_feature_preprocess_is_read_from_the_export_config(tmp_path):
    imp = tiny_imported(np.random.default_rng(0))
    write_import(imp, tmp_path / "exp", "openai")
    assert feature_preprocess(tmp_path / "exp") == "openai"
    assert feature_preprocess(tmp_path) == "none"  # not an export folder
    cfg = json.loads((tmp_path / "exp" / "config.json").read_text())
    cfg["feature_preprocess"] = "shout"
    (tmp_path / "exp" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UserError) as e:
        feature_preprocess(tmp_path / "exp")
    assert "feature_preprocess must be one of none, openai, got 'shout'" in str(e.value)
