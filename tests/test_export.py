"""app/export.py: one safetensors file + config + tokenizer; loads with torch alone, outputs unchanged."""

from __future__ import annotations

import json
import subprocess
import sys

import torch
from test_checkpoints_consolidate import fake_checkpoint, tiny

from app.checkpoints.loader import open_source
from app.common import outputs
from app.export import load_exported
from app.export import main as export_main
from app.model.lm import InferenceModel

ROOT = __import__("pathlib").Path(__file__).resolve().parents[1]
# beside the torch-only files: what transformers loads (tests/test_export_hf.py) and the model card
HF_FILES = {
    "README.md", "configuration_mlstm.py", "modeling_mlstm.py", "tokenization_mlstm.py",
    "tokenizer_config.json", "generation_config.json",
}  # fmt: skip


def exported_equals_checkpoint(ckpt_path, out_dir) -> None:
    """The exported model's logits equal those of the checkpoint's own converted weights."""
    assert export_main(["--checkpoint", str(ckpt_path), "--out", str(out_dir)]) == 0
    names = {p.name for p in out_dir.iterdir()} - {outputs.MARK}
    assert set(outputs.read_mark(out_dir)["files"]) == names  # what a later export may replace
    assert names - HF_FILES in (
        {"config.json", "model.safetensors"},
        {"config.json", "model.safetensors", "tokenizer.model"},
    )
    assert names >= HF_FILES
    src = open_source(ckpt_path)
    ref = InferenceModel(src.model_cfg)
    ref.load_state_dict(src.state_dict())
    model, tok, cfg = load_exported(out_dir)
    assert cfg == src.model_cfg and tok.vocab_size == cfg.vocab_size
    ids = torch.randint(3, cfg.vocab_size, (2, 17))
    with torch.no_grad():
        torch.testing.assert_close(model(ids), ref.eval()(ids), rtol=0, atol=0)


def test_export_roundtrip_and_no_pickle(tmp_path):
    fake_checkpoint(tmp_path / "run", tiny(), "pipeline")
    exported_equals_checkpoint(tmp_path / "run", tmp_path / "exp")
    cfg = json.loads((tmp_path / "exp" / "config.json").read_text())
    assert cfg["format"] == "mlstm-ds-export" and cfg["step"] == 5
    head = (tmp_path / "exp" / "model.safetensors").read_bytes()[:8]
    assert int.from_bytes(head, "little") > 0  # safetensors: a JSON header length, not a pickle/zip


def test_exported_model_loads_without_deepspeed(tmp_path):
    fake_checkpoint(tmp_path / "run", tiny(embed_dim=64, tie_embeddings=True), "module")
    assert export_main(["--checkpoint", str(tmp_path / "run"), "--out", str(tmp_path / "exp")]) == 0
    code = (
        "import sys, torch\n"
        "from app.export import load_exported\n"
        f"m, tok, cfg = load_exported({str(tmp_path / 'exp')!r})\n"
        "m(torch.tensor([[1, 70, 80]]))\n"
        "assert 'deepspeed' not in sys.modules, 'deepspeed was imported'\n"
    )
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]


def test_corrupt_export_is_one_clear_line(tmp_path, capsys):
    fake_checkpoint(tmp_path / "run", tiny(), "module")
    exp = tmp_path / "exp"
    assert export_main(["--checkpoint", str(tmp_path / "run"), "--out", str(exp)]) == 0
    (exp / "model.safetensors").write_bytes(b"\x00" * 64)
    from app.generate import main as generate_main

    assert generate_main(["--checkpoint", str(exp), "--max-new-tokens", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "model.safetensors" in err[0]
    assert export_main(["--checkpoint", str(tmp_path / "run")]) == 2
    assert "--out is required" in capsys.readouterr().err


def test_the_card_states_the_data_from_the_checkpoint_not_from_the_folder_it_names(prepared_dir, tmp_path):
    """The data summary is recorded in every checkpoint; export never opens the data folder the run named (a
    checkpoint handed over from elsewhere may name any folder): a meta.json changed there after training does
    not reach the card."""
    import shutil

    from launcher import train_one_process

    data = tmp_path / "data"
    shutil.copytree(prepared_dir, data)
    p = train_one_process(data, tmp_path / "run", "--max-steps", "1", "--eval-every", "0", "--test-eval", "false",
                          "--samples", "0", "--wandb-mode", "disabled")  # fmt: skip
    assert p.returncode == 0, p.stderr[-3000:]
    meta = json.loads((data / "meta.json").read_text())
    meta["source"] = {"kind": "hub", "name": "planted-after-training"}
    (data / "meta.json").write_text(json.dumps(meta))
    assert export_main(["--checkpoint", str(tmp_path / "run"), "--out", str(tmp_path / "exp")]) == 0
    card = (tmp_path / "exp" / "README.md").read_text()
    assert "planted-after-training" not in card
    assert "the embedded default corpus" in card and "documents kept of" in card, card
