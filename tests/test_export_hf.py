"""Exports load with transformers (AutoModelForCausalLM / AutoTokenizer, trust_remote_code) and compute
what this repository computes: logits, greedy generation token for token, token ids; the cache is the
recurrent state (one step per new token); the model card comes from the run; no absolute paths."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch
from test_checkpoints_consolidate import fake_checkpoint, tiny

from app.checkpoints.loader import open_source
from app.export import main as export_main
from data_prep.tokenizer import ByteTokenizer, load_tokenizer_from_dir

ROOT = Path(__file__).resolve().parents[1]
HF = dict(trust_remote_code=True, local_files_only=True)  # a local folder: nothing is downloaded
TEXT = "  def f(x):\n\treturn x  # caf\u00e9 \u4e2d\u6587 \U0001d518 <s> </s> <pad>\r\n\n"


@pytest.fixture(scope="module")
def transformers():
    """transformers (the hf extra, in dev), its remote-code module cache in a private folder."""
    old = os.environ.get("HF_MODULES_CACHE")
    # read when transformers is imported: the remote code goes to a private folder, not ~/.cache
    os.environ["HF_MODULES_CACHE"] = tempfile.mkdtemp(prefix="hf_modules_")
    try:
        import transformers as tf
    finally:
        if old is None:
            os.environ.pop("HF_MODULES_CACHE")
        else:
            os.environ["HF_MODULES_CACHE"] = old

    tf.utils.logging.disable_progress_bar()
    return tf


def fresh_ids(vocab: int, shape: tuple[int, int]) -> tuple[torch.Tensor, int]:
    """Random ids from a seed drawn afresh each run (reported on failure): not the global RNG, which
    the fixtures seed."""
    seed = int.from_bytes(os.urandom(4), "little")
    return torch.randint(0, vocab, shape, generator=torch.Generator().manual_seed(seed)), seed


def export(ckpt, out, *extra) -> Path:
    assert export_main(["--checkpoint", str(ckpt), "--out", str(out), *extra]) == 0
    return out


@pytest.fixture(scope="module")
def spm_export(reference_run, tmp_path_factory):
    """The trained reference run (SentencePiece), exported with --check-hf (transformers' own check on)."""
    return export(reference_run[0], tmp_path_factory.mktemp("hf") / "spm", "--check-hf", "true")


@pytest.fixture(scope="module")
def byte_exports(tmp_path_factory):
    """Byte-level models with random weights (varied greedy text), one per layer kind."""
    root = tmp_path_factory.mktemp("hf_byte")
    kinds = {
        "mlstm": {},
        "tied_residual": dict(embed_dim=64, tie_embeddings=True, residual=True),
        "lstm": dict(cell="lstm", weight_norm=False),
    }
    out = {}
    for name, kw in kinds.items():
        model = tiny(**kw)
        with torch.no_grad():  # a peaked distribution, as a trained model has, so greedy text varies
            model.embedding.weight.mul_(50)
        fake_checkpoint(root / f"run_{name}", model, "pipeline")
        out[name] = export(root / f"run_{name}", root / name)
    return out


def load(transformers, d):
    model = transformers.AutoModelForCausalLM.from_pretrained(str(d), dtype=torch.float32, **HF).eval()
    return model, transformers.AutoTokenizer.from_pretrained(str(d), **HF)


@pytest.mark.parametrize("kind", ["spm", "mlstm", "tied_residual", "lstm"])
def test_logits_equal_ours_fp32_and_fp64(transformers, spm_export, byte_exports, kind):
    d = spm_export if kind == "spm" else byte_exports[kind]
    src = open_source(d)
    ours = src.load_model()
    theirs, _ = load(transformers, d)
    ids, seed = fresh_ids(src.model_cfg.vocab_size, (3, 29))
    with torch.no_grad():
        torch.testing.assert_close(theirs(ids).logits, ours(ids), rtol=1e-5, atol=1e-5, msg=f"seed {seed}")
        ours64, theirs64 = ours.double(), theirs.double()
        for layer in ours64.recurrent:
            layer.core = "python"  # the float64 reference: the portable core in float64
        torch.testing.assert_close(
            theirs64(ids).logits, ours64(ids), rtol=1e-10, atol=1e-10, msg=f"seed {seed}"
        )


def app_generate_greedy(d, prompts, tmp_path, n) -> list[list[int]]:
    """app/generate.py's greedy tokens per prompt (one batch, as the CLI runs it)."""
    from app.generate import main as generate_main

    (tmp_path / "prompts.txt").write_text("\n".join(prompts) + "\n")
    out = tmp_path / "samples.jsonl"
    args = ["--checkpoint", str(d), "--prompts", str(tmp_path / "prompts.txt"), "--temperature", "0"]
    assert generate_main([*args, "--max-new-tokens", str(n), "--output", str(out)]) == 0
    return [json.loads(line)["tokens"] for line in out.read_text().splitlines()]


@pytest.mark.parametrize("kind", ["spm", "mlstm"])
def test_generate_greedy_equals_app_generate(transformers, spm_export, byte_exports, kind, tmp_path, capsys):
    d = spm_export if kind == "spm" else byte_exports[kind]
    prompts, n = ["The ", "def main(argv): return"], 40  # one per line in a --prompts file
    want = app_generate_greedy(d, prompts, tmp_path, n)
    capsys.readouterr()
    model, tok = load(transformers, d)
    eos = tok.eos_token_id

    def new_tokens(row: list[int]) -> list[int]:
        return row[: row.index(eos)] if eos in row else row  # ours stops before EOS, transformers keeps it

    for prompt, w in zip(prompts, want):
        enc = tok(prompt, return_tensors="pt")
        got = model.generate(**enc, max_new_tokens=n, do_sample=False)[0, enc["input_ids"].shape[1] :]
        assert new_tokens(got.tolist()) == w
    assert kind == "spm" or len(set(want[0])) > 3  # the random model's greedy text is not one repeated token
    enc = tok(prompts, return_tensors="pt", padding=True)  # one left-padded batch: each row as alone
    assert bool((enc["attention_mask"] == 0).any())
    got = model.generate(**enc, max_new_tokens=n, do_sample=False)[:, enc["input_ids"].shape[1] :]
    assert [new_tokens([t for t in row if t != tok.pad_token_id]) for row in got.tolist()] == want


def cache_name(transformers) -> str:
    """The name transformers passes the cache by (to forward and generate) and reads it back from in
    outputs: `cache` from 5.24, `past_key_values` before."""
    fields = transformers.modeling_outputs.CausalLMOutputWithPast.__dataclass_fields__
    return "cache" if "cache" in fields else "past_key_values"


def test_cache_is_the_recurrent_state_one_step_per_token(transformers, byte_exports):
    model, tok = load(transformers, byte_exports["mlstm"])
    name = cache_name(transformers)
    ids, seed = fresh_ids(259, (2, 20))
    with torch.no_grad():
        full = model(ids).logits  # (B, T, V), every position from a zero state
        out = model(ids[:, :7], use_cache=True)
        cache = getattr(out, name)
        assert cache.get_seq_length() == 7 and len(cache.states) == 2
        torch.testing.assert_close(out.logits, full[:, :7], rtol=1e-5, atol=1e-5, msg=f"seed {seed}")
        for t in range(7, 20):  # one token per call, the state carried
            step = model(ids[:, t : t + 1], use_cache=True, **{name: cache})
            torch.testing.assert_close(
                step.logits[:, 0], full[:, t], rtol=1e-5, atol=1e-5, msg=f"seed {seed}"
            )
        assert cache.get_seq_length() == 20
    calls = []
    hook = model.register_forward_pre_hook(
        lambda m, a, kw: calls.append(kw["input_ids"].shape[1]), with_kwargs=True
    )
    enc = tok("Hello", return_tensors="pt")  # bos + 5 bytes
    model.generate(**enc, max_new_tokens=6, do_sample=False, eos_token_id=None)
    hook.remove()
    assert calls == [6, 1, 1, 1, 1, 1]  # the prompt once, then one token per recurrent step


def greedy_by_hand(model, prompt: torch.Tensor, n: int) -> torch.Tensor:
    """prompt (B, P) -> (B, P + n): n greedy tokens, each position read from a zero state (no cache)."""
    seq = prompt
    with torch.no_grad():
        for _ in range(n):
            nxt = model(seq, use_cache=False).logits[:, -1].argmax(-1, keepdim=True)  # (B, 1)
            seq = torch.cat([seq, nxt], dim=1)
    return seq


def test_generate_cached_equals_uncached_equals_greedy_by_hand(transformers, byte_exports):
    model, _ = load(transformers, byte_exports["mlstm"])
    name = cache_name(transformers)
    (P, n), (prompt, seed) = (9, 12), fresh_ids(259, (2, 9))
    want = greedy_by_hand(model, prompt, n)
    seen = []  # after each forward inside generate: (tokens the cache holds, its (h, c) per layer)

    def record(module, args, kwargs, out):
        cache = getattr(out, name)
        seen.append((cache.get_seq_length(), [(h.clone(), c.clone()) for h, c in cache.states]))

    hook = model.register_forward_hook(record, with_kwargs=True)
    kw = dict(attention_mask=torch.ones_like(prompt), max_new_tokens=n, do_sample=False, eos_token_id=None)
    cached = model.generate(prompt, use_cache=True, **kw)
    hook.remove()
    uncached = model.generate(prompt, use_cache=False, **kw)
    assert cached.tolist() == want.tolist(), f"seed {seed}"
    assert uncached.tolist() == want.tolist(), f"seed {seed}"
    # the state after generate's k-th step holds the prompt plus k tokens: what reading them afresh gives
    assert [k for k, _ in seen] == list(range(P, P + n)), f"seed {seed}"
    with torch.no_grad():
        for k, states in seen:
            fresh = getattr(model(want[:, :k], use_cache=True), name).states
            torch.testing.assert_close(states, fresh, rtol=1e-5, atol=1e-5, msg=f"seed {seed}, {k} tokens")


def test_generate_continues_from_a_cache_passed_in(transformers, byte_exports):
    model, _ = load(transformers, byte_exports["mlstm"])
    name = cache_name(transformers)
    (P, n, m), (prompt, seed) = (7, 5, 8), fresh_ids(259, (2, 7))
    want = greedy_by_hand(model, prompt, n + m)
    kw = dict(do_sample=False, eos_token_id=None)
    first = model.generate(
        prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=n, return_dict_in_generate=True, **kw
    )
    cache = first[name]
    assert cache.get_seq_length() == P + n - 1  # the last token chosen is not read yet
    # as with a KV cache: the whole sequence so far, and the cache of all but its unread tail
    seq = first.sequences
    more = model.generate(seq, attention_mask=torch.ones_like(seq), max_new_tokens=m, **{name: cache}, **kw)
    assert more.tolist() == want.tolist(), f"seed {seed}"
    assert cache.get_seq_length() == P + n + m - 1


def test_tokenizers_give_our_ids(transformers, spm_export, byte_exports, prepared_dir):
    sample = Path(json.__file__).read_text()[:3000] + TEXT  # text we did not write, plus the hard cases
    pairs = ((spm_export, load_tokenizer_from_dir(prepared_dir)), (byte_exports["mlstm"], ByteTokenizer()))
    for d, ours in pairs:
        tok = transformers.AutoTokenizer.from_pretrained(str(d), **HF)
        ids = ours.encode(sample)
        assert tok(sample, add_special_tokens=False)["input_ids"] == ids
        assert tok(sample)["input_ids"] == [ours.bos_id, *ids]
        assert tok.decode([ours.bos_id, *ids, ours.eos_id], skip_special_tokens=True) == sample
        specials = (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id)
        assert specials == (ours.pad_id, ours.bos_id, ours.eos_id)
        assert tok.padding_side == "left" and len(tok) == ours.vocab_size


def test_model_card_comes_from_the_run(spm_export, reference_run, prepared_dir):
    card = (spm_export / "README.md").read_text()
    run = reference_run[0]
    meta = json.loads((prepared_dir / "meta.json").read_text())
    final = json.loads((run / "final_metrics.json").read_text())
    config = json.loads((run / "config.json").read_text())
    assert "multiplicative LSTM (Krause et al. 2016)" in card and "*not* xLSTM" in card
    assert f"| recurrent layers | {config['model']['num_layers']} |" in card
    for name, s in meta["splits"].items():
        assert f"| {name} | {s['docs']:,} | {s['examples']:,} | {s['tokens']:,} | {s['bytes']:,} |" in card
    assert f"| {final['val/loss']:.4f} | {final['val/ppl']:.2f} | {final['val/bpb']:.4f} |" in card
    assert f"learning rate {config['deepspeed']['optimizer']['params']['lr']}" in card
    assert f"steps: {final['step']} of {config['total_steps']}" in card


ABSOLUTE = re.compile(rb"(?<![\w.~-])/(tmp|home|root|work|usr|var|opt|etc|mnt|private|Users)/")


def test_no_absolute_path_in_any_exported_file(spm_export, byte_exports):
    for d in (spm_export, *byte_exports.values()):
        for p in d.iterdir():
            data = p.read_bytes()
            for marker in {str(d.parent), str(ROOT), os.path.expanduser("~"), tempfile.gettempdir()}:
                assert marker.encode() not in data, f"{p.name} holds {marker}"
            assert not ABSOLUTE.search(data), f"{p.name}: {ABSOLUTE.search(data).group()!r}"
    source = json.loads((spm_export / "config.json").read_text())["source"]
    assert source.endswith("/checkpoints/step_00000008")  # <run>/checkpoints/<tag>, no leading path


def test_missing_extra_is_one_line_naming_the_pip_command(byte_exports):
    code = (
        "import sys\n"
        "sys.modules['transformers'] = None  # as if the hf extra were not installed\n"
        "from app.export import main\n"
        f"sys.exit(main(['--checkpoint', {str(byte_exports['mlstm'])!r}, '--out', {str(byte_exports['mlstm'].parent / 'again')!r}, '--check-hf', 'true']))\n"
    )
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    err = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(err) == 1, p.stderr
    assert (
        err[0].startswith("error: --check-hf needs the transformers package")
        and "pip install -e '.[hf]'" in err[0]
    )
