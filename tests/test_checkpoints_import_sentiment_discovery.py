"""app/checkpoints/import_sentiment_discovery.py: NVIDIA sentiment-discovery's RNNModel state dicts (built
here at small sizes in their layouts: nested or flat, weight-normed or plain, tied, 257 or 256 byte ids,
the zip or the legacy torch.save format) read into our model, which then steps exactly as their mLSTMCell
does; without the gate reordering it does not; files that do not fit are refused in one line.

The reference below is written from sentiment-discovery's model/RNN_utils/RNN/cells.py (mLSTMCell) and
reparameterization/weight_norm.py: w = g * v / ||v|| per output row; m = (w_mih x) * (w_mhh h);
gates = w_ih x + b_ih + w_hh m + b_hh, chunked i, f, g, o; the decoder an nn.Linear with a bias.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pytest
import torch
from test_checkpoints_import_openai import assert_steps_match, run_import
from test_checkpoints_importing import load_float64, our_steps

from app.checkpoints.import_sentiment_discovery import read_sentiment_discovery
from data_prep.tokenizer import ByteTokenizer

TOK = ByteTokenizer()


def sd_params(V: int, E: int, H: int, layers: int, weight_norm: bool, tied: bool, seed: int = 0) -> dict:
    """Flat {"encoder.weight", "rnn.rnns.<l>.<name>", "decoder.weight", "decoder.bias"} float32 tensors.
    The biases lie on a 2^-8 grid, so b_ih + b_hh is exact in float32 (the export stores float32)."""
    g = torch.Generator().manual_seed(seed)

    def t(*shape, scale=0.5):
        return torch.randn(*shape, generator=g) * scale

    p = {"encoder.weight": t(V, E, scale=1.0)}
    for i in range(layers):
        d = E if i == 0 else H
        shapes = {"w_ih": (4 * H, d), "w_hh": (4 * H, H), "w_mih": (H, d), "w_mhh": (H, H)}
        for name, shape in shapes.items():
            if weight_norm:
                p[f"rnn.rnns.{i}.{name}_v"] = t(*shape)
                p[f"rnn.rnns.{i}.{name}_g"] = 1.0 + 0.25 * t(shape[0], 1, scale=1.0)
            else:
                p[f"rnn.rnns.{i}.{name}"] = t(*shape, scale=1.0 / d**0.5)
        for name in ("b_ih", "b_hh"):
            p[f"rnn.rnns.{i}.{name}"] = torch.round(t(4 * H, scale=1.0) * 256) / 256
    p["decoder.weight"] = p["encoder.weight"].clone() if tied else t(V, H)
    p["decoder.bias"] = t(V, scale=1.0)
    return p


def nested(p: dict) -> dict:
    """RNNModel.state_dict()'s own layout: {"encoder": {"encoder": ..., "rnn": ...}, "decoder": ...}."""
    return {
        "encoder": {
            "encoder": {"weight": p["encoder.weight"]},
            "rnn": {k.removeprefix("rnn."): v for k, v in p.items() if k.startswith("rnn.")},
        },
        "decoder": {k.removeprefix("decoder."): v for k, v in p.items() if k.startswith("decoder.")},
    }


def sd_reference(p: dict, ids: torch.Tensor) -> list[dict]:
    """Their model in float64 over their ids (B, T) from a zero state: per step logits, h, c (last layer)."""
    p = {k: v.double() for k, v in p.items()}
    layers = sorted({int(k.split(".")[2]) for k in p if k.startswith("rnn.rnns.")})

    def w(i, name):
        key = f"rnn.rnns.{i}.{name}"
        if key in p:
            return p[key]
        v = p[f"{key}_v"]
        return v * (p[f"{key}_g"] / v.norm(dim=1, keepdim=True))

    B, H = ids.shape[0], p["rnn.rnns.0.b_ih"].shape[0] // 4
    hs = [torch.zeros(B, H, dtype=torch.float64) for _ in layers]
    cs = [torch.zeros(B, H, dtype=torch.float64) for _ in layers]
    out = []
    for t in range(ids.shape[1]):
        x = p["encoder.weight"][ids[:, t]]
        for i in layers:
            m = (x @ w(i, "w_mih").T) * (hs[i] @ w(i, "w_mhh").T)
            gates = (
                x @ w(i, "w_ih").T + p[f"rnn.rnns.{i}.b_ih"] + m @ w(i, "w_hh").T + p[f"rnn.rnns.{i}.b_hh"]
            )
            ingate, forgetgate, cellgate, outgate = gates.chunk(4, 1)
            cs[i] = torch.sigmoid(forgetgate) * cs[i] + torch.sigmoid(ingate) * torch.tanh(cellgate)
            hs[i] = torch.sigmoid(outgate) * torch.tanh(cs[i])
            x = hs[i]
        logits = x @ p["decoder.weight"].T + p["decoder.bias"]
        out.append({"logits": logits.numpy(), "h": hs[-1].numpy(), "c": cs[-1].numpy()})
    return out


CASES = {  # V, E, H, layers, weight_norm, tied, layout, legacy torch.save format
    "257-weightnorm-2layers-nested": (257, 6, 10, 2, True, False, "nested", False),
    "256-plain-tied-flat-legacy": (256, 8, 8, 1, False, True, "flat", True),
    "257-weightnorm-in-sd-wrapper": (257, 5, 7, 1, True, False, "sd", False),
}


def write_case(path: Path, case: str) -> dict:
    V, E, H, layers, wn, tied, layout, legacy = CASES[case]
    p = sd_params(V, E, H, layers, wn, tied)
    obj = {"nested": nested(p), "flat": p, "sd": {"sd": nested(p)}}[layout]
    torch.save(obj, path, _use_new_zipfile_serialization=not legacy)
    return p


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_step_matches_their_mlstm_cell_in_float64(tmp_path, case):
    p = write_case(tmp_path / "lm.pt", case)
    offset = CASES[case][0] - 256
    model = load_float64(read_sentiment_discovery(tmp_path / "lm.pt"))
    byte_ids = torch.from_numpy(np.random.default_rng(1).integers(0, 256, size=(3, 15)))
    theirs = sd_reference(p, byte_ids + offset)
    ours = our_steps(model, byte_ids + TOK.OFFSET)
    assert_steps_match(ours, theirs, offset)
    if offset:  # their pad row is ours: their 257-way softmax is ours without BOS (never predicted)
        np.testing.assert_allclose(
            torch.stack([s["logits"][:, TOK.pad_id] for s in ours]).numpy(),
            np.stack([s["logits"][:, 0] for s in theirs]),
            rtol=0,
            atol=1e-10,
        )
    with torch.no_grad():
        full = model(byte_ids + TOK.OFFSET).numpy()  # the sequence path (training, evaluation)
    want = np.stack([s["logits"] for s in theirs], 1)[:, :, offset : offset + 256]
    np.testing.assert_allclose(full[:, :, TOK.OFFSET :], want, rtol=0, atol=1e-10)


def test_without_the_gate_reordering_it_diverges_from_the_first_step(tmp_path):
    p = write_case(tmp_path / "lm.pt", "257-weightnorm-2layers-nested")
    byte_ids = torch.from_numpy(np.random.default_rng(2).integers(0, 256, size=(2, 4)))
    step0 = sd_reference(p, byte_ids + 1)[0]
    for order, same in (((0, 1, 3, 2), True), ((0, 1, 2, 3), False)):
        model = load_float64(read_sentiment_discovery(tmp_path / "lm.pt", order=order))
        ours = our_steps(model, byte_ids + TOK.OFFSET)[0]
        gap = float(np.abs(ours["logits"].numpy()[:, TOK.OFFSET :] - step0["logits"][:, 1:]).max())
        c_gap = float(np.abs(ours["c"][-1].numpy() - step0["c"]).max())
        assert (gap < 1e-10 and c_gap < 1e-10) if same else (gap > 1e-2 and c_gap > 1e-2), (order, gap, c_gap)


def _refused(capsys, path: Path, tmp_path: Path) -> str:
    rc, _, err = run_import(
        capsys, "--from", "sentiment-discovery", str(path), "--out", str(tmp_path / "exp")
    )
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1 and lines[0].startswith("error: "), err
    assert not (tmp_path / "exp").exists()
    return lines[0]


def test_a_file_that_does_not_fit_is_refused_in_one_line(tmp_path, capsys):
    base = sd_params(257, 6, 10, 1, True, False)
    variants = {
        "rnn.rnns.0.w_hh_v has shape (10, 40), expected (40, 10)": {"rnn.rnns.0.w_hh_v": torch.zeros(10, 40)},
        "rnn.rnns.0.w_mih_g has shape (9, 1), expected (10, 1)": {"rnn.rnns.0.w_mih_g": torch.ones(9, 1)},
        "decoder.weight has shape (257, 6), expected (257, 10)": {"decoder.weight": torch.zeros(257, 6)},
        "encoder.weight has shape (300, 6), expected (257, E)": {"encoder.weight": torch.zeros(300, 6)},
        "rnn.rnns.0.b_hh has shape (41,), expected (40,)": {"rnn.rnns.0.b_hh": torch.zeros(41)},
        "rnn.rnns.0.w_xx has no place in an mLSTM language model": {"rnn.rnns.0.w_xx": torch.zeros(3)},
        "rnn.rnns.0.w_ho: a recurrent output projection": {"rnn.rnns.0.w_ho": torch.zeros(10, 10)},
        "layer 0 mixes weight-normed (_g/_v) and plain matrices": {"rnn.rnns.0.w_mhh": torch.zeros(10, 10)},
        "rnn.rnns.0.w_ih_v holds NaN or infinite values": {"rnn.rnns.0.w_ih_v": torch.full((40, 6), float("inf"))},
    }  # fmt: skip
    for needle, change in variants.items():
        p = {**base, **change}
        if "mixes" in needle:
            del p["rnn.rnns.0.w_mhh_g"], p["rnn.rnns.0.w_mhh_v"]
        torch.save(nested(p), tmp_path / "bad.pt")
        line = _refused(capsys, tmp_path / "bad.pt", tmp_path)
        assert str(tmp_path / "bad.pt") in line and needle in line, (needle, line)


def test_a_missing_tensor_or_file_or_a_pickled_object_is_refused_in_one_line(tmp_path, capsys):
    base = sd_params(257, 6, 10, 1, True, False)
    featurizer = {"encoder": nested(base)["encoder"]}  # an RNNFeaturizer's file: no decoder
    torch.save(featurizer, tmp_path / "feat.pt")
    assert "tensor decoder.weight (the LM's output layer): missing" in _refused(
        capsys, tmp_path / "feat.pt", tmp_path
    )
    lstm = {k: v for k, v in base.items() if "w_mih" not in k and "w_mhh" not in k}  # a plain LSTM: no m
    torch.save(nested(lstm), tmp_path / "lstm.pt")
    assert "tensor rnn.rnns.0.w_mhh" in _refused(capsys, tmp_path / "lstm.pt", tmp_path)
    torch.save(
        {"sd": nested(base), "args": argparse.Namespace(lr=1.0)}, tmp_path / "clf.pt"
    )  # finetune's .clf
    line = _refused(capsys, tmp_path / "clf.pt", tmp_path)
    assert "clf.pt: refused to load: it holds more than tensors and plain containers" in line, line
    assert "no such file" in _refused(capsys, tmp_path / "absent.pt", tmp_path)
    (tmp_path / "junk.pt").write_bytes(b"junk")
    assert "junk.pt: unreadable or corrupt checkpoint file" in _refused(
        capsys, tmp_path / "junk.pt", tmp_path
    )
