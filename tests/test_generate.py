"""app/generation/decoder.py and app/generate.py: state-carrying decoding equals the full forward; sampling."""

from __future__ import annotations

import io
import json
import os
import select
import signal
import subprocess
import sys
import time

import pytest
import torch
from test_checkpoints_consolidate import fake_checkpoint, tiny

from app.generate import main as generate_main
from app.generation.decoder import Decoder
from app.generation.sampling import SamplingConfig, sample_next

ROOT = __import__("pathlib").Path(__file__).resolve().parents[1]

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


INTERACTIVE = ["--interactive", "true"]
LETTERS = " abcdefghijklmnopqrstuvwxyz"


@pytest.fixture(scope="module")
def letters_run(tmp_path_factory):
    """A byte-level model that can only write lowercase letters and spaces (no EOS): its text re-encodes to the
    same tokens, so a session's text can be fed back as one prompt, and a reply ends only by length or Ctrl-C."""
    model = tiny()
    allowed = [ord(ch) + 3 for ch in LETTERS]  # byte tokenizer: id = byte + 3
    with torch.no_grad():
        bias = getattr(model, "3").bias
        keep = bias[allowed].clone()
        bias.fill_(-1e4)
        bias[allowed] = keep
    root = tmp_path_factory.mktemp("letters") / "run"
    fake_checkpoint(root, model, "module")
    return root


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
        (["--checkpoint", "RUN", *INTERACTIVE, "--prompts", "p.txt"], "--interactive continues one text"),
        (["--checkpoint", "RUN", *INTERACTIVE, "--num-samples", "2"], "--interactive continues one text"),
        (["--checkpoint", "RUN", *INTERACTIVE, "--prompt", "-"], "--interactive reads its turns from stdin"),
        # a count the memory cannot hold is refused before the model is read (it ran until EOS, keeping every token)
        (
            ["--checkpoint", "RUN", "--max-new-tokens", str(10**12)],
            "new tokens after a prompt of up to 1 tokens needs about",
        ),
        (["--checkpoint", "RUN", "--num-samples", str(10**9)], "generating 1,000,000,000 row(s)"),
    ],
)
def test_bad_input_is_one_clear_line(byte_run, capsys, args, needle):
    args = [str(byte_run) if a == "RUN" else a for a in args]
    rc, _, err = run_cli(capsys, *args)
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], err


def test_interactive_carries_the_state_across_turns(letters_run, tmp_path, capsys, monkeypatch):
    """Greedy: turn 3's reply equals a one-shot generation from the whole session so far as one prompt, and
    differs from a fresh start on turn 3's text alone (so the state really is what carried it)."""
    common = ["--checkpoint", str(letters_run), "--temperature", "0", "--max-new-tokens", "12"]
    monkeypatch.setattr(sys, "stdin", io.StringIO("hello\n world\n"))
    rec_path = tmp_path / "turns.jsonl"
    rc, out, err = run_cli(capsys, *common, *INTERACTIVE, "--prompt", "a", "--output", str(rec_path))
    recs = [json.loads(ln) for ln in rec_path.read_text().splitlines()]
    assert rc == 0 and [r["prompt"] for r in recs] == ["a", "hello", " world"], err
    assert out == "".join(r["text"] + "\n" for r in recs)  # the replies only, one line each
    assert all(r["stop"] == "length" and len(r["tokens"]) == 12 for r in recs)
    assert "# 3 turns, 36 new tokens" in err
    history = "a" + recs[0]["text"] + "hello" + recs[1]["text"] + " world"
    rc, one_shot, _ = run_cli(capsys, *common, "--prompt", history)
    assert one_shot == history + recs[2]["text"] + "\n"
    rc, fresh, _ = run_cli(capsys, *common, "--prompt", " world")
    assert fresh != " world" + recs[2]["text"] + "\n"


def test_prompt_dash_reads_stdin(byte_run, capsys, monkeypatch):
    common = ["--checkpoint", str(byte_run), "--max-new-tokens", "20", "--seed", "4"]
    monkeypatch.setattr(sys, "stdin", io.StringIO("two\nlines\n"))  # echo's trailing newline is dropped
    rc, piped, _ = run_cli(capsys, *common, "--prompt", "-")
    rc2, given, _ = run_cli(capsys, *common, "--prompt", "two\nlines")
    assert rc == rc2 == 0 and piped == given and piped.startswith("two\nlines")


@pytest.mark.parametrize("flags", [["--prompt", "-"], INTERACTIVE], ids=["prompt_dash", "interactive"])
def test_undecodable_stdin_is_one_clear_line(byte_run, capsys, monkeypatch, flags):
    # what a C locale's stdin gives for bytes that are not UTF-8 (surrogateescape)
    monkeypatch.setattr(sys, "stdin", io.StringIO(b"ok\n\xff\xfe\n".decode("utf-8", "surrogateescape")))
    rc, _, err = run_cli(capsys, "--checkpoint", str(byte_run), "--max-new-tokens", "2", *flags)
    errors = [ln for ln in err.splitlines() if ln.startswith("error: ")]
    assert rc == 2 and len(errors) == 1 and "not UTF-8 text" in errors[0], err


def test_interactive_module_ctrl_c_ends_a_reply_and_eof_ends_the_session(letters_run, tmp_path):
    """`python -m app.generate --interactive` on a pipe: Ctrl-C (SIGINT) stops each endless reply and the
    session goes on to the next line; closing stdin ends it with status 0."""
    rec_path = tmp_path / "turns.jsonl"
    cmd = [sys.executable, "-m", "app.generate", "--checkpoint", str(letters_run), *INTERACTIVE,
           "--max-new-tokens", "100000000", "--output", str(rec_path)]  # fmt: skip
    e = dict(os.environ, MLSTM_MATMUL="mm", OMP_NUM_THREADS="1")  # no kernel timing: this is about signals
    p = subprocess.Popen(
        cmd, cwd=ROOT, env=e, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    replies = []
    try:
        for line in (b"first\n", b"second\n"):
            p.stdin.write(line)
            p.stdin.flush()
            got = read_until(p.stdout, lambda b: len(b) >= 20, 120)  # the reply is streaming
            p.send_signal(signal.SIGINT)
            got += read_until(p.stdout, lambda b: b.endswith(b"\n"), 60)  # ... and ends with its line
            replies.append(got.decode())
        p.stdin.close()
        rc = p.wait(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    err = p.stderr.read().decode()
    assert rc == 0 and "Traceback" not in err and "# 2 turns" in err, err
    recs = [json.loads(ln) for ln in rec_path.read_text().splitlines()]
    assert [r["stop"] for r in recs] == ["interrupted", "interrupted"]
    assert [r["text"] + "\n" for r in recs] == replies


def read_until(stream, done, timeout: float) -> bytes:
    buf, deadline = b"", time.monotonic() + timeout
    fd = stream.fileno()
    while not done(buf):
        left = deadline - time.monotonic()
        assert left > 0, f"timed out; read {buf[-200:]!r}"
        if select.select([fd], [], [], left)[0]:
            chunk = os.read(fd, 4096)
            assert chunk, f"stream closed; read {buf[-200:]!r}"
            buf += chunk
    return buf


def test_top_k_above_the_vocabulary_is_capped_in_one_line(byte_run, capsys):
    rc, _, err = run_cli(capsys, "--checkpoint", str(byte_run), "--top-k", "100000", "--max-new-tokens", "3")
    assert rc == 0 and "# --top-k 100000 capped at 259: the vocabulary has 259 tokens" in err.splitlines(), (
        err
    )
