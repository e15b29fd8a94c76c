"""app/model/first_call.py: the GPU core's first call at a new batch bucket, counted in the GPU memory estimates.
The count is held against the tuner's own tensors, counted at the dispatcher while it ranks a shape in Triton's
interpreter (tests/triton_checks.py tuner_memory); and the estimates that admit GPU work add it there only."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_model_triton_core import _check

from app.model import first_call, gpu_ranking, gpu_tuning
from app.model.config import ModelConfig


@pytest.fixture(scope="module")
def counted(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("tuner_memory")
    return _check("tuner_memory", tmp, TRITON_INTERPRET="1", MLSTM_MATMUL="mm", MLSTM_CACHE_DIR=str(tmp))


@pytest.mark.long  # an interpreter run of minutes on 2 cores: `--all`
def test_the_count_is_1x_to_2x_of_what_the_tuner_holds(counted):
    """fp32 and fp64, forward alone (inference) and forward and backward (training): the tuner's peak of live
    tensor bytes while it checks every candidate against float64 and times it, against the closed form."""
    assert len(counted) == 4
    for case, r in counted.items():
        assert r["peak"] > 100_000 and 1.0 <= r["count"] / r["peak"] <= 2.0, (case, r)


CFG = ModelConfig(vocab_size=256, embed_dim=64, hidden_dim=256, num_layers=1)


@pytest.fixture
def nothing_ranked(monkeypatch):
    monkeypatch.setattr(gpu_tuning, "_choices", {})
    monkeypatch.setattr(first_call, "_cached", lambda *a: False)


def test_only_a_new_shape_on_cuda_costs_a_first_call(nothing_ranked, monkeypatch):
    cuda = torch.device("cuda", 0)
    full = first_call.first_call_bytes(CFG, 2000, cuda, backward=False)
    assert full == first_call.tuner_bytes(2048, 256, 64, 4, False, True, gpu_ranking.T_TUNE, 16, op=True)
    assert full > 3 << 30  # GBs at a 2,048-row bucket
    assert first_call.first_call_bytes(CFG, 2000, "cpu", backward=False) == 0
    assert (
        first_call.first_call_bytes(ModelConfig(**{**CFG.to_dict(), "core": "python"}), 2000, cuda, False)
        == 0
    )
    monkeypatch.setattr(first_call, "_cached", lambda *a: True)  # a ranking on disk: only its checks
    checked = first_call.first_call_bytes(CFG, 2000, cuda, backward=False)
    assert 0 < checked < full // 2
    key = (cuda, 2048, 256, torch.float32, False, None)
    monkeypatch.setitem(gpu_tuning._choices, key, object())  # ranked in this process (a larger bucket too)
    assert first_call.first_call_bytes(CFG, 2000, cuda, backward=False) == 0
    assert first_call.first_call_bytes(CFG, 700, cuda, backward=True) == 0


def test_the_gpu_estimates_add_it_and_the_cpu_ones_do_not(nothing_ranked):
    from app.generation.config import generation_bytes
    from app.generation.decoder import prefill_tokens
    from app.probing.bounds import featurize_bytes, finetune_bytes, largest_batch

    cuda = torch.device("cuda", 0)
    seqs = [np.arange(600) % 200 for _ in range(64)]
    graphs = first_call.op_paths_bytes(CFG, largest_batch(seqs, 8192, 8)[0], cuda)  # fine-tuning's op paths
    for fn, args, rows, backward, more in (
        (featurize_bytes, (seqs, 8192, CFG, 1), 13, False, 0),
        (finetune_bytes, (seqs, 8192, 8, CFG, 1), 8, True, graphs),
    ):
        extra = fn(*args, device=cuda) - fn(*args, device="cpu")
        assert extra == first_call.first_call_bytes(CFG, rows, cuda, backward) + more, fn.__name__
    extra = generation_bytes(2000, 21, 20, CFG, cuda) - generation_bytes(2000, 21, 20, CFG, "cpu")
    group_rows = prefill_tokens(CFG) // 21  # the prompts a prefill group reads at once: its bucket is timed
    assert extra == first_call.first_call_bytes(CFG, group_rows, cuda, backward=False) > 0


def test_buckets_are_the_tuners():
    assert [first_call.bucket(r) for r in (1, 16, 17, 2000)] == [
        gpu_tuning.batch_bucket(r) for r in (1, 16, 17, 2000)
    ]
