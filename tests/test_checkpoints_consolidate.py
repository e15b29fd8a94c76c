"""app/checkpoints/consolidate.py: every DeepSpeed weight layout -> one state dict; safe loading refuses code."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from app.checkpoints import training as ckpt
from app.checkpoints.consolidate import checkpoint_state_dict, safe_load
from app.checkpoints.loader import open_source
from app.common.errors import UserError
from app.export import main as export_main
from app.model.config import debug_config
from app.model.lm import InferenceModel

BYTE_TOK = {"type": "byte", "vocab_size": 259, "pad_id": 0, "bos_id": 1, "eos_id": 2, "unk_id": None}


def fake_checkpoint(root: Path, model: InferenceModel, kind: str, step: int = 5, dtype=torch.float32) -> Path:
    """A committed checkpoint in DeepSpeed's file layout: kind "pipeline" (layer files) or "module" (P = 1)."""
    cfg = model.cfg
    tag = ckpt.tag_for(step)
    d = root / "checkpoints" / tag
    d.mkdir(parents=True)
    sd = {k: v.detach().to(dtype) for k, v in model.state_dict().items()}
    if kind == "pipeline":
        for i in range(cfg.num_layers + 2):
            part = {k.split(".", 1)[1]: v for k, v in sd.items() if k.split(".", 1)[0] == str(i)}
            if part:
                torch.save(part, d / f"layer_{i:02d}-model_states.pt")
        torch.save({"module": None, "buffer_names": [], "ds_version": "0"}, d / "mp_rank_00_model_states.pt")
    else:
        torch.save({"module": sd, "buffer_names": [], "ds_version": "0"}, d / "mp_rank_00_model_states.pt")
    layout = {
        "stages": 2 if kind == "pipeline" else 1,
        "data_parallel": 1,
        "zero_stage": 1,
        "precision": "fp32",
    }
    state = {"step": step, "model_config": cfg.to_dict(), "tokenizer": BYTE_TOK, "layout": layout}
    ckpt.commit(root / "checkpoints", tag, state, 0, None)
    return d


def tiny(**kw) -> InferenceModel:
    torch.manual_seed(0)
    return InferenceModel(debug_config(vocab_size=259, **kw))


def rewrite_manifest(d: Path) -> None:
    """What an attacker (or a bad copy) could do: make the manifest match the files again."""
    files = {p.name: p.stat().st_size for p in d.iterdir() if p.is_file() and p.name != ckpt.COMPLETE}
    (d / ckpt.COMPLETE).write_text(json.dumps({"files": files}))


@pytest.mark.parametrize("tied", [False, True])
def test_pipeline_and_module_layouts_give_the_same_state_dict(tmp_path, tied):
    kw = dict(embed_dim=64, tie_embeddings=True) if tied else {}
    model = tiny(**kw)
    a = fake_checkpoint(tmp_path / "pipe", model, "pipeline")
    b = fake_checkpoint(tmp_path / "mod", model, "module")
    if tied:
        assert not (a / "layer_03-model_states.pt").exists()  # the tied head has no file
    sa = checkpoint_state_dict(a, model.cfg, 1)
    sb = checkpoint_state_dict(b, model.cfg, 1)
    want = model.state_dict()
    assert sa.keys() == sb.keys() == want.keys()
    for k in want:
        torch.testing.assert_close(sa[k], want[k], rtol=0, atol=0)
        torch.testing.assert_close(sb[k], want[k], rtol=0, atol=0)


def test_bf16_weights_are_cast_to_fp32(tmp_path):
    model = tiny()
    d = fake_checkpoint(tmp_path, model, "module", dtype=torch.bfloat16)
    sd = checkpoint_state_dict(d, model.cfg, 1)
    assert all(v.dtype == torch.float32 for v in sd.values())
    torch.testing.assert_close(sd["1.weight_in"], model.state_dict()["1.weight_in"].bfloat16().float())


def test_sequential_model_has_the_same_keys():
    from app.parallel.pipeline import build_sequential

    for kw in ({}, {"embed_dim": 64, "tie_embeddings": True}, {"cell": "lstm", "weight_norm": False}):
        cfg = debug_config(vocab_size=259, **kw)
        seq = {k: tuple(v.shape) for k, v in build_sequential(cfg).state_dict().items()}
        mine = {k: tuple(v.shape) for k, v in InferenceModel(cfg).state_dict().items()}
        assert seq == mine, kw


class _RunsCode:
    """Unpickling this calls os.system: the attack weights_only loading must stop."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_malicious_pickle_in_a_layer_file_is_refused_and_never_runs(tmp_path, capsys):
    model = tiny()
    d = fake_checkpoint(tmp_path / "run", model, "pipeline")
    marker = tmp_path / "pwned"
    torch.save({"weight_in": _RunsCode(marker)}, d / "layer_01-model_states.pt")
    rewrite_manifest(d)
    with pytest.raises(UserError, match="refused to load"):
        safe_load(d / "layer_01-model_states.pt")
    rc = export_main(["--checkpoint", str(tmp_path / "run"), "--out", str(tmp_path / "exp")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and err[0].startswith("error: ") and "refused to load" in err[0]
    assert "layer_01-model_states.pt" in err[0] and "Traceback" not in err[0]
    assert not marker.exists()
    assert not (tmp_path / "exp" / "model.safetensors").exists()


def test_corrupt_or_missing_files_are_one_clear_line(tmp_path, capsys):
    model = tiny()
    d = fake_checkpoint(tmp_path / "run", model, "pipeline")
    f = d / "layer_02-model_states.pt"
    f.write_bytes(f.read_bytes()[:100])
    # the manifest no longer matches: the checkpoint is refused as a whole
    with pytest.raises(UserError, match="incomplete or corrupt"):
        open_source(d)
    rewrite_manifest(d)  # the manifest matches a truncated file: the loader itself must say so
    assert export_main(["--checkpoint", str(d), "--out", str(tmp_path / "e")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unreadable or corrupt" in err[0] and "layer_02" in err[0]
    f.unlink()
    rewrite_manifest(d)
    assert export_main(["--checkpoint", str(d), "--out", str(tmp_path / "e")]) == 2
    assert "missing layer_02-model_states.pt" in capsys.readouterr().err


def test_weights_that_do_not_fit_the_config_are_refused(tmp_path):
    model = tiny()
    d = fake_checkpoint(tmp_path, model, "module")
    state = json.loads((d / "app_state.json").read_text())
    state["model_config"]["hidden_dim"] = 32
    (d / "app_state.json").write_text(json.dumps(state))
    rewrite_manifest(d)
    src = open_source(d)
    with pytest.raises(UserError, match="shapes do not match"):
        src.state_dict()
