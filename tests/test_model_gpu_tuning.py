"""app/model/gpu_tuning.py: which GPU loop runs, per shape, chosen by measurement; its tiles, its batch
buckets, the forced loop, and (in Triton's interpreter, a wall clock for CUDA events) the timing itself."""

import pytest
import torch
from test_model_triton_core import TIMED, _check

from app.common.errors import UserError
from app.model import gpu_tuning
from app.model.gpu_loops import StepLoop, Tiles


def test_the_tuner_times_every_loop_checks_them_and_compares_the_reference(tmp_path):
    """gpu_tuning's logic (in the interpreter, a wall clock for CUDA events): all three loops timed each way
    and none left out (they agree with the cuBLAS loop), a loop that computes something else left out with
    why, the whole op against the reference core (the interpreter is slow: the reference wins), one log line."""
    out = _check("tuning", tmp_path, TRITON_INTERPRET="1", MLSTM_MATMUL="mm")
    assert set(out["choice"]) == TIMED, out
    assert all(isinstance(v, float) for v in out["choice"].values()), out
    assert (
        out["wrong"]["picked"] == "cublas"
        and "outputs differ from the cublas loop's" in out["wrong"]["times"]["fwd/wrong"]
    )
    assert out["python"] == ["measured faster than the Triton core at this shape"] * 2 and out["logged"] == 1


def test_a_micro_batch_with_fewer_rows_shares_its_bucket():
    from app.model.gpu_tuning import _key, batch_bucket

    assert [batch_bucket(b) for b in (1, 16, 17, 64, 65, 256)] == [16, 16, 32, 64, 128, 256]
    w = torch.zeros(8, 8)
    assert _key(torch.zeros(3, 2, 4), w) == _key(torch.zeros(11, 2, 4), w) != _key(torch.zeros(17, 2, 4), w)


def test_tiles_give_every_sm_work_and_keep_large_layers_whole_batch():
    from app.model.gpu_tuning import tiles_for

    t = tiles_for(64, 1024, torch.bfloat16, sms=132, weights_in_l2=True)
    assert (t.n_r(64, 1024), t.n_g(64, 1024)) == (128, 128) and 4 * t.bu_g == 64, t  # one wave; M = 64
    big = tiles_for(128, 4096, torch.bfloat16, sms=132, weights_in_l2=False)
    assert big.bb_r == big.bb_g == 128, big  # weights streamed from HBM once per step, not per batch tile
    tiny = tiles_for(3, 20, torch.float32, sms=132, weights_in_l2=True)
    assert min(tiny.bb_r, tiny.bu_r, tiny.bb_g, 4 * tiny.bu_g, tiny.bk) >= 16, tiny  # tl.dot's minimum


def test_a_smaller_micro_batch_reuses_the_smallest_larger_bucket_timed(monkeypatch):
    """A length bucket's last micro-batch (100 rows in a B256 run) runs the choice its run already has, not a
    fresh timing and compile mid-run; a larger batch than any timed is timed."""
    monkeypatch.setattr(gpu_tuning, "_choices", {})
    t = Tiles(16, 16, 16, 4, 16)
    w = torch.zeros(8, 8)
    key = gpu_tuning._key(torch.zeros(256, 1, 4), w)
    big, mid = (gpu_tuning.Choice(StepLoop(t), StepLoop(t), python=False) for _ in range(2))
    gpu_tuning._choices[(*key, None)] = big
    gpu_tuning._choices[(key[0], 64, *key[2:], None)] = mid
    assert gpu_tuning._reuse((*gpu_tuning._key(torch.zeros(100, 1, 4), w), None), backward=True) is big
    assert gpu_tuning._reuse((*gpu_tuning._key(torch.zeros(20, 1, 4), w), None), backward=True) is mid
    assert gpu_tuning._reuse((*gpu_tuning._key(torch.zeros(300, 1, 4), w), None), backward=True) is None
    fwd_only = gpu_tuning.Choice(StepLoop(t), None)  # timed for inference only: not for a training step
    gpu_tuning._choices[(*key, None)] = fwd_only
    assert gpu_tuning._reuse((*gpu_tuning._key(torch.zeros(100, 1, 4), w), None), backward=True) is None
    assert gpu_tuning._reuse((*gpu_tuning._key(torch.zeros(100, 1, 4), w), None), backward=False) is fwd_only


def test_a_forced_loop_that_is_none_is_one_line_and_splitk_falls_back(monkeypatch):
    monkeypatch.setenv("MLSTM_GPU_LOOP", "fastest")
    with pytest.raises(
        UserError, match="MLSTM_GPU_LOOP must be one of step, cublas, persistent, splitk, python"
    ):
        gpu_tuning.forced_loop()
    # B256 H4096 (the large preset at B256): 128 output tiles of the split phase on 132 SMs, so no split
    base = gpu_tuning.tiles_for(256, 4096, torch.bfloat16, sms=132, weights_in_l2=False)
    assert gpu_tuning.split_tiles(base, 256, 4096, sms=132).split == 1
    loops = [StepLoop(base)]
    persistent = gpu_tuning.PersistentLoop(base, 132)
    assert gpu_tuning.pick("splitk", [*loops, persistent]) is persistent
    assert gpu_tuning.pick("python", [*loops, persistent]) is loops[0]
