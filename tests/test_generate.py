"""app/generation/decoder.py and app/generate.py: state-carrying decoding equals the full forward; sampling."""

from __future__ import annotations

import json

import pytest
import torch
from test_checkpoints_consolidate import fake_checkpoint, tiny

from app.generate import main as generate_main
from app.generation.decoder import Decoder
from app.generation.sampling import SamplingConfig, sample_next

VARIANTS = [
    {},
    {"embed_dim": 64, "tie_embeddings": True, "residual": True},
    {"cell": "lstm", "weight_norm": False},
]


@pytest.mark.parametrize("kw", VARIANTS, ids=["mlstm", "tied_residual", "lstm"])
def test_prefill_then_steps_equal_the_full_forward(kw):
    model = tiny(**kw).eval()
    ids = torch.randint(3, 259, (3, 24))
    with torch.no_grad():
        full = model(ids)  # (B, T, V)
    dec = Decoder(model)
    lengths = torch.tensor([7, 12, 1])  # ragged right-padded prompts
    logits, state = dec.prefill(ids, lengths)
    rows = torch.arange(3)
    torch.testing.assert_close(logits, full[rows, lengths - 1], rtol=1e-5, atol=1e-5)
    pos = lengths.clone()
    for _ in range(10):  # carry the state: each token is one step, the prompt is not re-read
        logits, state = dec.step(ids[rows, pos], state)
        torch.testing.assert_close(logits, full[rows, pos], rtol=1e-5, atol=1e-5)
        pos += 1


def test_sampling_modes():
    logits = torch.tensor([[0.0, 3.0, 1.0, 2.9], [5.0, 0.0, 0.0, 0.0]])
    g = torch.Generator().manual_seed(0)
    assert sample_next(logits, SamplingConfig(temperature=0), g).tolist() == [1, 0]
    assert sample_next(logits, SamplingConfig(top_k=1), g).tolist() == [1, 0]
    assert sample_next(logits, SamplingConfig(top_p=1e-6), g).tolist() == [1, 0]
    assert sample_next(logits, SamplingConfig(temperature=0), g, banned=[1]).tolist() == [3, 0]
    draws = {int(sample_next(logits[:1], SamplingConfig(top_k=2), g)) for _ in range(200)}
    assert draws == {1, 3}
    for bad in ({"temperature": -1}, {"top_k": -1}, {"top_p": 0.0}, {"top_p": 1.5}):
        with pytest.raises(ValueError):
            SamplingConfig(**bad)


@pytest.fixture(scope="module")
def byte_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("gen") / "run"
    fake_checkpoint(root, tiny(), "pipeline")
    return root


def run_cli(capsys, *args: str) -> tuple[int, str, str]:
    rc = generate_main(list(args))
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_generation_is_deterministic_with_a_seed_and_streams(byte_run, tmp_path, capsys):
    common = ["--checkpoint", str(byte_run), "--prompt", "Hello", "--max-new-tokens", "30", "--top-k", "50"]
    rc, out1, _ = run_cli(capsys, *common, "--seed", "7", "--output", str(tmp_path / "a.jsonl"))
    assert rc == 0 and out1.startswith("Hello")
    rc, out2, _ = run_cli(capsys, *common, "--seed", "7")
    assert out2 == out1
    rc, out3, _ = run_cli(capsys, *common, "--seed", "8")
    assert out3 != out1
    rec = json.loads((tmp_path / "a.jsonl").read_text())
    assert out1 == "Hello" + rec["text"] + "\n"
    assert rec["stop"] in ("eos", "length") and rec["prompt_tokens"] == 5


def test_batched_prompts_and_samples(byte_run, tmp_path, capsys):
    prompts = tmp_path / "p.txt"
    prompts.write_text("first\n\nsecond prompt\n")
    out = tmp_path / "o.jsonl"
    args = ["--checkpoint", str(byte_run), "--prompts", str(prompts), "--num-samples", "2"]
    rc, text, _ = run_cli(capsys, *args, "--max-new-tokens", "12", "--seed", "3", "--output", str(out))
    assert rc == 0
    recs = [json.loads(ln) for ln in out.read_text().splitlines()]
    assert [r["prompt"] for r in recs] == ["first", "first", "second prompt", "second prompt"]
    assert all(len(r["tokens"]) <= 12 for r in recs)
    for r in recs:
        assert f"===== sample {r['row']} ({r['stop']}) =====\n{r['prompt']}{r['text']}" in text
    # rows share one generator: the batch as a whole is reproducible
    rc, text2, _ = run_cli(capsys, *args, "--max-new-tokens", "12", "--seed", "3")
    assert text2 == text


def test_stops_at_eos(tmp_path, capsys):
    model = tiny()
    with torch.no_grad():
        getattr(model, "3").bias[2] = 100.0  # EOS (id 2 for bytes) always wins
    fake_checkpoint(tmp_path / "run", model, "module")
    out = tmp_path / "o.jsonl"
    rc, text, _ = run_cli(
        capsys, "--checkpoint", str(tmp_path / "run"), "--prompt", "x", "--output", str(out)
    )
    rec = json.loads(out.read_text())
    assert rc == 0 and rec["stop"] == "eos" and rec["tokens"] == [] and text == "x\n"


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--checkpoint", "/nonexistent/run"], "--checkpoint: no such file"),
        (["--checkpoint", "RUN", "--temperature", "-1"], "--temperature"),
        (["--checkpoint", "RUN", "--max-new-tokens", "0"], "--max-new-tokens"),
        (["--checkpoint", "RUN", "--prompts", "/nonexistent.txt"], "--prompts"),
        (["--checkpoint", "RUN", "--prompt", "a", "--prompts", "b"], "not both"),
        (["--checkpoint", "RUN", "--top-k", "many"], "--top-k: expects an integer"),
    ],
)
def test_bad_input_is_one_clear_line(byte_run, capsys, args, needle):
    args = [str(byte_run) if a == "RUN" else a for a in args]
    rc, _, err = run_cli(capsys, *args)
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], err
