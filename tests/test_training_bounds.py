"""What training's flags may ask of the machine: counts beyond what the data fills capped in one line each (no
batch changes), a wait capped at a day, a model or samples that cannot fit refused in one line before they exist."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from in_process import Ran, call
from launcher import train_args
from measured import check_estimate

from app.batching.buckets import BucketSchedule
from app.common.errors import UserError
from app.common.resources import GIB
from app.model.config import debug_config
from app.model.memory import ENGINE_BYTES, bytes_per_token, training_state_bytes
from app.parallel.layout import Layout
from app.train import main as train_main
from app.train import parse_args
from app.training import bounds
from app.training.plan import open_inputs, plan_run

ROOT = Path(__file__).resolve().parents[1]
DS = str(ROOT / "ds_configs" / "cpu_pp2_zero1.json")  # micro 8 x accum 4


def plan(data: Path, *flags: str, world: int = 4):
    """The plan of a P = 2 run over `world` ranks -> (plan, warning lines, info lines)."""
    args = parse_args(["--deepspeed_config", DS, "--data", str(data), "--pipeline-stages", "2", *flags])
    inputs, model_cfg = open_inputs(args.cfg, args.model_overrides)
    warned, noted = [], []
    p = plan_run(args.cfg, args.deepspeed, inputs, model_cfg, world, warned.append, noted.append)
    return p, warned, noted


def real_micro_batches(sched: BucketSchedule, dp_rank: int) -> list[list[int]]:
    """Each non-empty micro-batch this rank trains in epoch 0, in order, as example indices."""
    return [
        mb.indices.tolist()
        for step in sched.epoch(0)
        for mb in sched.for_rank(step, dp_rank)
        if len(mb.indices)
    ]


def test_batch_counts_beyond_the_data_are_capped_in_one_line_and_change_no_batch(prepared_dir):
    """--grad-accum 100000 on 2 data-parallel ranks: capped where one step holds the epoch; every rank still
    trains the same micro-batches in the same order as the uncapped schedule would (whose step is ~99.8%
    empty micro-batches, each a pass of the pipeline)."""
    p, warned, noted = plan(prepared_dir, "--grad-accum", "100000")
    uncapped = BucketSchedule(
        p.data.store("train"),
        p.data.prepared.meta["buckets"],
        micro_batch=8,
        grad_accum=100000,
        data_parallel=2,
        seed=p.cfg.seed,
    )
    want = [real_micro_batches(uncapped, rank) for rank in (0, 1)]
    n_micro = len(want[0]) + len(want[1])
    accum = -(-n_micro // 2)
    assert p.layout.grad_accum == accum and p.steps_per_epoch == 1
    assert warned == [
        f"--grad-accum 100000 capped at {accum}: the train split makes {n_micro:,} micro-batch(es) "
        f"({accum:,} per data-parallel rank)"
    ]
    assert [real_micro_batches(p.data.schedule("train"), rank) for rank in (0, 1)] == want
    # the validation split is one batch now: the default --sanity-eval-batches 2 is capped by an info line
    assert noted == ["--sanity-eval-batches 2 capped at 1: the validation split has 1 batch(es)"]


def test_each_batch_setting_names_the_flag_that_set_it(prepared_dir):
    meta = json.loads((prepared_dir / "meta.json").read_text())
    train = meta["splits"]["train"]["examples"]
    p, warned, _ = plan(prepared_dir, "--micro-batch", "1000000000", world=2)
    assert p.layout.micro_batch == train and p.cfg.micro_batch == train
    assert (
        warned[0]
        == f"--micro-batch 1000000000 capped at {train}: no split has more examples (train: {train:,})"
    )
    assert warned[1].startswith("gradient_accumulation_steps (DeepSpeed config) 4 capped at 1: ")
    p, warned, _ = plan(prepared_dir, "--global-batch", "1000000000", "--micro-batch", "10")
    glob = p.layout.train_batch
    assert warned == [f"--global-batch 1000000000 capped at {glob}: {warned[0].split(': ', 1)[1]}"]
    assert p.cfg.global_batch == glob == 10 * p.layout.grad_accum * 2
    p, warned, _ = plan(prepared_dir, "--tokens-per-micro-batch", "1000000000000")
    padded = p.cfg.tokens_per_micro_batch
    assert warned[0] == (
        f"--tokens-per-micro-batch 1000000000000 capped at {padded}: no split has more tokens padded to its "
        f"buckets (train: {padded:,})"
    )
    p, warned, _ = plan(prepared_dir, "--eval-max-batches", "1000", "--sanity-eval-batches", "1000")
    batches = p.data.schedule("validation").steps_per_epoch
    assert (p.cfg.eval_max_batches, p.cfg.sanity_eval_batches) == (batches, batches)
    assert warned == [
        f"--eval-max-batches 1000 capped at {batches}: the validation split has {batches} batch(es)",
        f"--sanity-eval-batches 1000 capped at {batches}: the validation split has {batches} batch(es)",
    ]
    _, warned, noted = plan(prepared_dir, world=2)  # the defaults on 1 data-parallel rank: nothing to say
    assert warned == noted == []


def one_process(capsys, data: Path, out: Path, *extra: str) -> Ran:
    """`python app/train.py ...` (one plain process), its main called in this one (tests/in_process.py)."""
    return call(train_main, train_args(data, out, *extra, stages=1), capsys)


def test_a_collective_waits_at_most_a_day(prepared_dir, tmp_path, capsys):
    """Before: torch's timedelta overflowed on --dist-timeout-s 1e15 (a traceback)."""
    p = one_process(capsys, prepared_dir, tmp_path / "run", "--dist-timeout-s", "1e15", "--dry-run")
    assert p.returncode == 0, p.stderr[-3000:]
    line = "--dist-timeout-s 1000000000000000.0 capped at 86400.0: a peer silent for a day has died or hung"
    assert line in p.stderr
    assert json.loads(p.stdout)["train"]["dist_timeout_s"] == 86400.0


def test_a_model_that_cannot_fit_is_refused_in_one_line_before_it_exists(prepared_dir, tmp_path, capsys):
    """model.hidden_dim=10^7: 1.5 x 10^15 parameters. Before: --dry-run printed its plan (a run allocated
    until PyTorch's allocator failed, with a traceback, or the OOM killer came)."""
    p = one_process(capsys, prepared_dir, tmp_path / "run", "model.hidden_dim=10000000", "--dry-run")
    errors = [ln for ln in p.stderr.splitlines() if ln.startswith("error: ")]
    assert p.returncode == 2 and len(errors) == 1 and p.stdout == "", p.stderr[-3000:]
    assert errors[0].startswith(
        "error: training a model of 1,500,005,440,012,288 parameters (model.hidden_dim 10000000, num_layers 2"
    )
    assert "GiB is available; use a smaller model (model.hidden_dim" in errors[0]
    assert "Traceback" not in p.stderr


def test_the_estimate_is_each_process_share_and_names_what_to_lower():
    cfg = debug_config(vocab_size=384)
    lay = Layout(
        world_size=4, stages=2, data_parallel=2, micro_batch=8, grad_accum=1, zero_stage=1, precision="fp32"
    )
    tokens = 8 * 64
    want = training_state_bytes(cfg) // 4 + ENGINE_BYTES + tokens * bytes_per_token(cfg, True) // 2
    assert bounds.process_bytes(cfg, lay, tokens) == want
    need, what, hint = bounds.training_part(cfg, lay, tokens, 2, "on this node")
    assert (
        need == 2 * want and hint == "lower --micro-batch or --tokens-per-micro-batch"
    )  # activations dominate
    assert "(2 of the run's 4 process(es) on this node)" in what
    big = debug_config(vocab_size=384, hidden_dim=10**5)
    assert bounds.training_part(big, lay, tokens, 2, "")[2].startswith("use a smaller model")
    train = np.array([100, 3, 0])
    assert bounds.largest_micro_batch(train, [16, 32, 64], 8, 0, False) == 8 * 16  # 3 x 32 is smaller
    assert bounds.largest_micro_batch(train, [16, 32, 64], 8, 0, True) == 8 * 64  # a stream micro-batch


def test_samples_or_a_device_that_cannot_hold_the_run_are_refused(prepared_dir, monkeypatch):
    """Rank 0's samples against the host's memory; on CUDA the run against the device's free memory
    (faked here: the check never needs a GPU), with ZeRO's CPU offload against both."""
    p, _, _ = plan(prepared_dir, "--samples", "100000", "--sample-tokens", "100000000", world=2)
    with pytest.raises(UserError) as e:
        p.check_fits([""])
    assert str(e.value).startswith(
        "--samples 100000 x 1 prompt(s) of --sample-tokens 100,000,000, from a model of "
    )
    assert str(e.value).endswith("lower --samples or --sample-tokens (--samples 0: none)")
    p, _, _ = plan(prepared_dir, "--samples", "0", "--micro-batch", "3000", "model.hidden_dim=512", world=2)
    free = {"cpu": 256 * GIB, "cuda:0": GIB // 4}  # (the device's part counts the GPU core's first call too)
    monkeypatch.setattr(bounds.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(bounds, "available_memory", free.get)
    with pytest.raises(UserError) as e:
        p.check_fits([""])
    assert "of memory on cuda:0 and 256 MiB is available; lower --micro-batch" in str(e.value)
    p.ds_json["zero_optimization"] = {"stage": 1, "offload_optimizer": {"device": "cpu"}}
    p.check_fits([""])  # the host's memory joins the device's


# `long`: a child process measured against the estimate, seconds each (bench/memory.py measures the same
# works; the default run keeps the fine-tuning estimate's measurement, tests/test_probing_bounds.py); what
# only this test runs is the measurement of a training step's estimate
@pytest.mark.long
def test_the_training_estimate_holds_a_step_of_one_process():
    """A DeepSpeed step (P = 1, ZeRO-2 and ZeRO-1) measured in a child process (tests/measured.py): one
    micro-batch whose activations dominate, and a model whose training state does (DeepSpeed holds ~30 bytes
    a parameter in fp32: base 2652e8d counted 16, and was 0.55x of such a run)."""
    check_estimate("train", embed=64, hidden=256, vocab=4096, rows=8, length=512)
    check_estimate("train", embed=128, hidden=512, layers=2, vocab=8192, rows=1, length=64, zero=1)
