"""The neural cache (app/evaluation/cache.py, `app/evaluate.py --cache`).

Reference: the plain LanguageModel's one forward pass over [BOS, text] in float64 gives every position's
top-layer output and log-probabilities; the cache's mixture is then computed token by token, each token
from the `window` positions before it only. The streamed, chunked implementation must agree to 1e-10 for
any chunk size, on fresh random weights and texts; the CLI runs on the real trained run of conftest.py.
"""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from test_evaluate import evaluate_cli, refusal

from app.evaluation import cache as cache_eval
from app.evaluation.cache import cache_lines, cache_nats
from app.evaluation.stream import stream_nats
from app.generation.decoder import Decoder
from app.model.config import debug_config
from app.model.lm import LanguageModel

SETTINGS = [(0.0, 1.0), (0.1, 0.3), (0.3, 2.0), (0.9, 0.5)]


@torch.no_grad()
def reference_nats(model: LanguageModel, ids: np.ndarray, bos: int, window: int) -> np.ndarray:
    """(settings, tokens): each token's nats under the model mixed with the cache, token by token."""
    inp = torch.as_tensor(np.concatenate([[bos], ids[:-1]]))[None]
    x = model.embedding(inp)
    for layer in model.recurrent:
        x = layer(x)
    h = x[0]  # (T, H)
    p = F.softmax(model.head(h), -1)  # (T, V)
    out = np.zeros((len(SETTINGS), len(ids)))
    for g, (lam, theta) in enumerate(SETTINGS):
        for t in range(len(ids)):
            earlier = range(max(0, t - window), t)
            pm = float(p[t, ids[t]])
            if not earlier:
                out[g, t] = -math.log(pm)
                continue
            w = torch.softmax(torch.stack([theta * (h[t] @ h[i]) for i in earlier]), 0)
            pc = sum(float(w[k]) for k, i in enumerate(earlier) if ids[i] == ids[t])
            out[g, t] = -math.log((1 - lam) * pm + lam * pc)
    return out


def random_model(seed: int) -> LanguageModel:
    torch.manual_seed(seed)
    model = LanguageModel(debug_config(vocab_size=12)).double().eval()
    with torch.no_grad():  # larger recurrent weights than the init's: states that differ by context
        for layer in model.recurrent:
            for p in layer.parameters():
                p.mul_(3.0)
    return model


@pytest.mark.parametrize(
    ("chunk", "window", "block"), [(7, 10, 256), (16, 1000, 256), (1, 3, 256), (50, 25, 256), (50, 12, 5)]
)
def test_cache_equals_the_token_by_token_reference(chunk, window, block, monkeypatch):
    """Chunks smaller and larger than the window, a window smaller and larger than the text, query blocks
    smaller than a chunk; the text's first k tokens read alone score as they do within the whole text."""
    monkeypatch.setattr(cache_eval, "QUERY_BLOCK", block)
    seed = random.randrange(1 << 30)
    model = random_model(seed)
    rng = np.random.default_rng(seed)
    ids = rng.integers(4, 12, size=int(rng.integers(110, 160)))  # a small vocabulary: tokens recur
    want = reference_nats(model, ids, 2, window)
    dec = Decoder(model)
    got = cache_nats(dec, [ids], 2, chunk, window, SETTINGS)
    assert got.setting_nats == pytest.approx(want.sum(1).tolist(), rel=1e-10), f"seed {seed}"
    assert got.tokens == len(ids)
    model_alone = got.setting_nats[0]  # SETTINGS[0] has lambda 0: the model alone
    assert model_alone == pytest.approx(want[0].sum(), rel=1e-10)
    assert model_alone == pytest.approx(stream_nats(dec, [ids], 2, 0, chunk).nats, rel=1e-10)  # the stream
    prefix = cache_nats(dec, [ids[:37]], 2, chunk, window, SETTINGS)
    assert prefix.setting_nats == pytest.approx(want[:, :37].sum(1).tolist(), rel=1e-10), f"seed {seed}"
    best = min(got.setting_nats)
    assert best <= got.cache_nats <= best + math.log(len(SETTINGS))


def test_each_sequence_starts_with_an_empty_cache():
    model, rng = random_model(1), np.random.default_rng(1)
    a, b = rng.integers(4, 12, size=30), rng.integers(4, 12, size=40)
    dec = Decoder(model)
    both = cache_nats(dec, [a, b], 2, 8, 100, SETTINGS)
    alone = [cache_nats(dec, [s], 2, 8, 100, SETTINGS) for s in (a, b)]
    assert both.setting_nats == pytest.approx(
        [x + y for x, y in zip(*(r.setting_nats for r in alone))], rel=1e-12
    )


def test_printed_line_names_the_heaviest_setting():
    row = {"name": "a.txt", "cache": 1.5, "cache_by_setting": [
        {"lambda": 0.1, "theta": 0.3, "bits/byte": 1.6, "weight": 0.0},
        {"lambda": 0.3, "theta": 1.0, "bits/byte": 1.5, "weight": 1.0}]}  # fmt: skip
    assert cache_lines([row, {"name": "b.txt"}]) == [
        "  cache, a.txt: the mixture 1.5000 of 2 settings; the heaviest lambda 0.3, theta 1: 1.5000 (weight 1.00)"
    ]


@pytest.mark.slow
def test_cli_cache_lowers_bits_on_repeated_text(reference_run, prepared_dir, tmp_path):
    run_dir, _ = reference_run
    rng = random.Random(1)
    words = ["".join(rng.choice("abcdefghijklmnop") for _ in range(rng.randint(3, 9))) for _ in range(30)]
    text = tmp_path / "repeated.txt"
    text.write_text((" ".join(rng.choice(words) for _ in range(50)) + ".\n") * 5)  # unseen, then repeated
    args = ("--text", str(text), "--cache", "--cache-window", "512")
    a = evaluate_cli(run_dir, tmp_path / "a.json", *args)
    r = a["texts"][0]
    assert r["cache"] < 0.7 * r["stream bits/byte"] and r["cache"] < 0.7 * r["bits/byte"], r
    assert r["cache gain %"] == pytest.approx(100 * (1 - r["cache"] / r["bits/byte"]))
    assert len(r["cache_by_setting"]) == 16 and sum(
        d["weight"] for d in r["cache_by_setting"]
    ) == pytest.approx(1)
    assert a["cache"] == {"window": 512, "lambda": [0.05, 0.1, 0.2, 0.3], "theta": [0.03, 0.1, 0.3, 1.0]}
    assert "cache" in a["text_scoring"]
    one = ("--no-stream", "--cache-lambda", "0.2", "--cache-theta", "1")  # one setting; the split too
    b = evaluate_cli(
        run_dir, tmp_path / "b.json", *args, *one, "--data", str(prepared_dir), "--split", "validation"
    )
    assert b["texts"][0]["cache"] == pytest.approx(
        next(d["bits/byte"] for d in r["cache_by_setting"] if (d["lambda"], d["theta"]) == (0.2, 1.0)),
        rel=1e-12,
    )  # a setting alone scores as it does in the grid
    assert "stream bits/byte" not in b["texts"][0] and "validation/stream bits/byte" not in b
    assert [d["weight"] for d in b["validation/cache_by_setting"]] == [
        1.0
    ]  # the split's documents, each a stream
    assert 0 < b["validation/cache"] == b["validation/cache_by_setting"][0]["bits/byte"]


def test_cache_refuses_the_launcher(tmp_path, capsys, monkeypatch):
    """Rank 0 alone reads with the cache while the others would wait on it: one process, like --dynamic."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert "--cache runs in one process" in refusal(tmp_path, capsys, "--cache")


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--cache-window", "0"], "--cache-window"),
        (["--cache-lambda", "1.5"], "--cache-lambda: each must be in [0, 1)"),
        (["--cache-theta", "-1"], "--cache-theta"),
        (["--cache-theta", "sharp"], "--cache-theta: expects a list of numbers"),
        (["--cache-theta", "0.3", "0.3"], "--cache-theta: each value once"),
    ],
)
def test_bad_cache_flags_are_one_clear_line(tmp_path, capsys, args, needle):
    assert needle in refusal(tmp_path, capsys, "--cache", *args)
