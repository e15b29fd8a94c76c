"""Checkpoints and exports written before the restructure (tree e6a91b2) load and compute the same."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from app.checkpoints.export_format import read_weights
from app.checkpoints.loader import open_source
from app.export import export
from app.generation.decoder import Decoder

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "main_e6a91b2"
EXPECTED = json.loads((FIXTURE / "expected.json").read_text())
PATHS = {"checkpoint": FIXTURE / "run", "export": FIXTURE / "export"}


@pytest.mark.parametrize("kind", ["checkpoint", "export"])
def test_old_main_output_loads_and_computes_the_same(kind):
    src = open_source(PATHS[kind])
    assert src.kind == kind and src.step == 2
    model = src.load_model()
    want = EXPECTED[kind]
    ids = torch.tensor(want["ids"])
    with torch.no_grad():
        logits = model(ids)[:, want["positions"]]  # (B, 3, V)
    torch.testing.assert_close(logits, torch.tensor(want["logits"]), rtol=0, atol=2e-5)
    dec = Decoder(model)
    lg, state = dec.prefill(ids, torch.tensor([8, 6]))
    greedy = []
    for _ in range(len(want["greedy"])):
        nxt = lg.argmax(-1)
        greedy.append(nxt.tolist())
        lg, state = dec.step(nxt, state)
    assert greedy == want["greedy"]


def test_old_checkpoint_exports_to_the_old_export(tmp_path):
    out = export(PATHS["checkpoint"], tmp_path / "exp")
    cfg = open_source(out).model_cfg
    new, old = read_weights(out, cfg), read_weights(PATHS["export"], cfg)
    assert sorted(new) == sorted(old)
    for k in old:
        torch.testing.assert_close(new[k], old[k], rtol=0, atol=0)
