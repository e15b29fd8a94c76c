"""What evaluation's flags may ask of the machine: lengths and counts beyond the input capped in one line each
(no figure changes), an evaluation that cannot fit refused in one line before the weights are read."""

from __future__ import annotations

import json

import numpy as np
import pytest
from measured import check_estimate
from test_checkpoints_consolidate import fake_checkpoint, tiny

from app.checkpoints.loader import Source
from app.common.errors import UserError
from app.common.resources import GIB
from app.evaluate import main as evaluate_main
from app.evaluation import bounds
from app.evaluation.config import EvalConfig
from app.model.config import debug_config

FIGURES = ("loss", "bits/byte", "stream bits/byte", "cache", "static carried", "dynamic")


def inputs(texts=(), rows=(), buckets=(), docs=()) -> bounds.Inputs:
    return bounds.Inputs(
        texts=list(texts),
        rows=np.asarray(rows, np.int64),
        buckets=np.asarray(buckets, np.int64),
        bounds=[64] * len(buckets),
        documents=np.asarray(docs, np.int64),
    )


def test_lengths_are_capped_at_the_longest_sequence_each_reads():
    """A flag given says a warning; a default an info line (data prep's --num-proc does the same)."""
    cfg = EvalConfig(
        checkpoint="c",
        data="d",
        cache=True,
        dynamic=True,
        cache_window=10**8,
        dyn_segment=10**6,
        micro_batch=64,
    )
    warned, noted = [], []
    got = bounds.cap_lengths(
        cfg, inputs([300], rows=[64, 20], buckets=[5, 2], docs=[900]), warned.append, noted.append
    )
    assert (got.text_chunk_len, got.dyn_segment, got.cache_window, got.micro_batch) == (256, 300, 900, 5)
    assert warned == [
        "--dyn-segment 1000000 capped at 300: the longest sequence read dynamically has 300 tokens",
        "--cache-window 100000000 capped at 900: the longest sequence read with the cache has 900 tokens",
        "--micro-batch 64 capped at 5: at most 5 sequences are evaluated together (a bucket, a file's pieces)",
    ]
    assert noted == []
    got = bounds.cap_lengths(
        EvalConfig(checkpoint="c", text=["t"]), inputs([100]), warned.append, noted.append
    )
    assert (got.text_chunk_len, got.micro_batch) == (100, 1) and len(warned) == 3
    assert noted == [
        "--text-chunk-len 256 capped at 100: the longest sequence it cuts has 100 tokens",
        "--micro-batch 8 capped at 1: at most 1 sequences are evaluated together (a bucket, a file's pieces)",
    ]


@pytest.fixture
def short_text(tmp_path):
    fake_checkpoint(tmp_path / "run", tiny(), "module")
    (tmp_path / "t.txt").write_text("a short text, read a few times. " * 6)  # 192 bytes: 193 tokens with EOS
    return tmp_path


def evaluate(root, capsys, name: str, *flags: str) -> tuple[dict, list[str]]:
    args = ["--checkpoint", str(root / "run"), "--text", str(root / "t.txt"), "--out", str(root / name)]
    assert evaluate_main([*args, "--cache", "--dynamic", "--dyn-lr", "1e-3", *flags]) == 0
    return json.loads((root / name).read_text()), capsys.readouterr().err.splitlines()


def test_values_beyond_the_text_give_the_same_figures_and_say_so(short_text, capsys):
    whole = ("--text-chunk-len", "193", "--cache-window", "193", "--dyn-segment", "193", "--micro-batch", "1")
    sane, _ = evaluate(short_text, capsys, "a.json", *whole)
    huge = ("--text-chunk-len", "1000000", "--cache-window", "100000000", "--dyn-segment", "1000000")
    got, err = evaluate(short_text, capsys, "b.json", *huge, "--micro-batch", "4096")
    for key in FIGURES:
        assert got["texts"][0][key] == pytest.approx(sane["texts"][0][key], rel=1e-6), key
    said = [ln.split(" WARNING ", 1)[1] for ln in err if " WARNING " in ln]
    assert said == [
        "--text-chunk-len 1000000 capped at 193: the longest sequence it cuts has 193 tokens",
        "--dyn-segment 1000000 capped at 193: the longest sequence read dynamically has 193 tokens",
        "--cache-window 100000000 capped at 193: the longest sequence read with the cache has 193 tokens",
        "--micro-batch 4096 capped at 1: at most 1 sequences are evaluated together (a bucket, a file's pieces)",
    ]
    assert got["cache"]["window"] == 193 and got["text_chunk_len"] == 193  # the values in force


def test_an_evaluation_that_cannot_fit_is_refused_before_the_weights_are_read(
    short_text, capsys, monkeypatch
):
    """The host's free memory, faked at 1 MiB: the cache's block of similarities (256 queries x 193 keys,
    float64, with masks and softmax) is the largest part; the checkpoint's weights are never read."""
    monkeypatch.setattr(bounds, "available_memory", lambda device: 1 << 20)
    monkeypatch.setattr(Source, "state_dict", lambda self: pytest.fail("the weights were read"))
    args = ["--checkpoint", str(short_text / "run"), "--text", str(short_text / "t.txt"), "--cache"]
    assert evaluate_main(args) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("error: ")]
    assert len(err) == 1 and err[0].startswith(
        "error: --cache over --cache-window 193 positions with 16 (lambda, theta) setting(s) needs about "
    )
    assert "1 MiB is available; lower --cache-window or the --cache-lambda x --cache-theta settings" in err[0]


def test_on_cuda_the_engine_is_checked_against_the_device(monkeypatch):
    """The engine's part against the device's free memory, the rest against the host's (faked: no GPU needed)."""
    free = {"cpu": 64 * GIB, "cuda:0": 1 << 20}
    monkeypatch.setattr(bounds, "available_memory", free.get)
    cfg = EvalConfig(checkpoint="c", text=["t"], micro_batch=64, text_chunk_len=4096)
    model, read = debug_config(vocab_size=259), inputs([100000])  # 25 pieces of 4096 tokens

    def check() -> None:
        bounds.check_evaluation_fits(cfg, model, read, stages=1, device="cuda:0", reads=True)

    with pytest.raises(UserError) as e:
        check()
    msg = str(e.value)
    assert msg.startswith("evaluating micro-batches of up to 102,400 padded tokens needs about ")
    assert "of memory on cuda:0 and 1 MiB is available; lower --micro-batch or --text-chunk-len" in msg
    free["cuda:0"] = GIB
    check()
    free["cpu"] = 1 << 20  # the weights and the stream's reader, on the host
    with pytest.raises(
        UserError, match=r"^--stream: 1 stream\(s\) at a time in pieces of --text-chunk-len 4,096"
    ):
        check()


# `long`: a child process measured against the estimate, seconds each (bench/memory.py measures the same
# works; the default run keeps the fine-tuning estimate's measurement, tests/test_probing_bounds.py); what
# only this test runs is the measurement of the evaluation engine, stream, cache and dynamic estimates
@pytest.mark.long
def test_the_engine_and_reader_estimates_hold_what_they_take():
    """Each measured in a child process (tests/measured.py): the engine's micro-batch, --stream's rows,
    --cache's window and --dynamic's segment. Base 2652e8d's were 0.34-0.73x of these."""
    check_estimate("engine", embed=64, hidden=256, vocab=4096, rows=8, length=1024)
    check_estimate("stream", embed=64, hidden=256, vocab=4096, rows=8, length=4000, chunk=1024)
    check_estimate("cache", embed=64, hidden=256, vocab=4096, length=8000, chunk=1024, window=4096)
    check_estimate("dynamic", embed=64, hidden=256, vocab=4096, length=3000, segment=1024)
