"""app/model/wgrad_overlap.py: the backward's weight-gradient products overlapped with its time loop, in time
pieces. Without a GPU: in Triton's interpreter (tests/triton_checks.py overlap), every loop forced, float64,
the gradients against the float64 reference and against the same loop without the overlap, at uneven pieces,
one step a piece, and more pieces than steps. With a GPU (`gpu`): the same at a real size in bf16, the
products on a side stream."""

from __future__ import annotations

import pytest
import torch
from test_model_triton_core import LOOPS, _check, _cuda_case, _grads

from app.common.errors import UserError
from app.model import wgrad_overlap


@pytest.fixture(scope="module")
def overlapped(tmp_path_factory) -> dict:
    return _check("overlap", tmp_path_factory.mktemp("overlap"), TRITON_INTERPRET="1", MLSTM_MATMUL="mm")


@pytest.mark.long  # an interpreter run of minutes on 2 cores: `--all`
@pytest.mark.parametrize("loop", LOOPS)
@pytest.mark.parametrize("chunks", ["3", "7", "50"])
def test_the_overlapped_backward_gives_the_same_gradients(overlapped, loop, chunks):
    """y, dx, d(w_in), d(bias), d(w_mh), d(w_m) at T = 7 in pieces of 3, 2, 2 (or 7 of one step, or 50 asked
    for: 7): within float64 rounding of the reference, and of the loop without the overlap."""
    r = overlapped[loop][chunks]
    assert max(r["vs_reference"]) < 1e-12 and max(r["vs_plain"]) < 1e-12, r
    assert max(overlapped[loop]["0"]["vs_plain"]) == 0.0  # the baseline is itself


def test_the_pieces_cover_the_steps_latest_first():
    assert wgrad_overlap.bounds(7, 3) == [(4, 7), (2, 4), (0, 2)]
    assert wgrad_overlap.bounds(5, 1) == [(0, 5)]
    assert wgrad_overlap.bounds(3, 8) == [(2, 3), (1, 2), (0, 1)]


def test_the_switch_is_a_chunk_count(monkeypatch):
    monkeypatch.delenv("MLSTM_WGRAD_OVERLAP", raising=False)
    assert wgrad_overlap.chunks() is None  # the tuner's, per shape
    monkeypatch.setenv("MLSTM_WGRAD_OVERLAP", "auto")
    assert wgrad_overlap.chunks() is None
    monkeypatch.setenv("MLSTM_WGRAD_OVERLAP", "0")
    assert wgrad_overlap.chunks() == 0
    monkeypatch.setenv("MLSTM_WGRAD_OVERLAP", "4")
    assert wgrad_overlap.chunks() == 4
    monkeypatch.setenv("MLSTM_WGRAD_OVERLAP", "some")
    with pytest.raises(
        UserError, match=r"MLSTM_WGRAD_OVERLAP must be a number of time chunks \(0: off\) or auto"
    ):
        wgrad_overlap.chunks()


@pytest.mark.gpu
@pytest.mark.parametrize("loop", ["cublas", "persistent"])
def test_cuda_the_overlapped_backward_gives_the_same_gradients(monkeypatch, loop):
    """B64 T48 H512 bf16, 4 pieces, the products on the side stream: the gradients of the loop without the
    overlap, to bf16's rounding of the pieces' sums."""
    from app.model import gpu_tuning
    from app.model.triton_core import TritonMLSTMFunction

    monkeypatch.setenv("MLSTM_GPU_LOOP", loop)
    gpu_tuning._choices.clear()
    x, ws, dy = _cuda_case(64, 48, 128, 512, torch.bfloat16, seed=11)
    monkeypatch.setenv("MLSTM_WGRAD_OVERLAP", "0")
    plain = _grads(TritonMLSTMFunction, x, ws, dy, torch.bfloat16)
    monkeypatch.setenv("MLSTM_WGRAD_OVERLAP", "4")
    got = _grads(TritonMLSTMFunction, x, ws, dy, torch.bfloat16)
    gpu_tuning._choices.clear()
    for name, a, b in zip(["y", "dx", "dw_in", "dbias", "dw_mh", "dw_m"], got, plain):
        assert (a - b).abs().max() <= 2e-2 * b.abs().max(), name
