"""app/model/gpu_traffic.py: the traffic model of the GPU loops' phases: bytes through L2 and HBM, products, and
the predicted time of a phase and a step on a device's rates."""

import math

import pytest

from app.model import gpu_traffic as gt
from app.model.gpu_tiles import Tiles

R = gt.RATES["H100 SXM"]


def test_a_phase_costs_its_fixed_cost_plus_its_largest_term():
    """L2 bytes over the L2 rate, or a program's waves over what one SM reads; HBM bytes over HBM; a program's
    products over its SM's share of the tensor cores (mma.sync at half the warpgroup MMA's rate)."""
    p = gt.Phase("x", tiles=132, m=128, n=128, k=4096, l2_tile=2e6, hbm=1e8, wgmma=True)
    l2_us = 132 * 2e6 / (R.l2_gbs * 1e3)
    assert gt.phase_us(p, R, 132, 4.5) == pytest.approx(4.5 + l2_us)
    few = gt.Phase("x", tiles=33, m=0, n=128, k=0, l2_tile=2e6, hbm=0.0)  # a quarter of the SMs: their share
    assert gt.phase_us(few, R, 132, 0.0) == pytest.approx(2e6 / (gt.SM_SHARE * R.l2_gbs / R.sms * 1e3))
    waves = gt.Phase("x", tiles=264, m=0, n=1, k=0, l2_tile=1.0, hbm=1e9)  # HBM binds
    assert gt.phase_us(waves, R, 132, 1.0) == pytest.approx(1.0 + 1e9 / (R.hbm_gbs * 1e3))
    mma = gt.Phase("x", tiles=132, m=32, n=128, k=1 << 20, l2_tile=1.0, hbm=0.0, wgmma=False)
    wg = gt.Phase("x", tiles=132, m=64, n=64, k=1 << 20, l2_tile=1.0, hbm=0.0, wgmma=True)
    assert gt.phase_us(mma, R, 132, 0.0) == pytest.approx(2 * gt.phase_us(wg, R, 132, 0.0))  # same FLOPs


def test_split_phases_are_counted_slice_by_slice_and_their_sums():
    """B128 H4096 bf16 with r and dh split 4 ways on (128, 128) tiles, dm 4 ways, sums on (32, 128) tiles: each
    slice reads its weight rows and batch rows over a quarter of K and writes its (fp32) part; each sum reads
    the 4 parts and runs the epilogue."""
    B, H = 128, 4096
    t = Tiles(128, 32, 128, 32, 64, warps=8, bb_h=128, bu_h=32, bb_m=128, bu_m=128, split=4, bb_rk=128,
              bu_rk=128, split_r=4, bb_hk=128, bu_hk=128, split_h=4)  # fmt: skip
    fwd = gt.forward_phases(t, B, H, 2, streamed=True)
    assert [p.name for p in fwd] == ["r slices", "r sum", "gates"]
    rk, rsum, gates = fwd
    assert (rk.tiles, rk.m, rk.n, rk.k, rk.wgmma) == (128, 128, 128, 1024, True)
    assert rk.l2 == 128 * ((128 + 128) * 1024 * 2 + 128 * 128 * 4)
    assert rk.hbm == H * H * 2  # W_mh streamed once per step
    assert rsum.m == 0 and rsum.l2 == 128 * 32 * 128 * (4 * 4 + 8 + 2)
    assert (gates.tiles, gates.m, gates.n, gates.k) == (128, 128, 128, 4096)
    bwd = gt.backward_phases(t, B, H, 2, streamed=False)
    assert [p.name for p in bwd] == ["dh slices", "dh sum", "dm slices", "dm sum"]
    assert bwd[2].k == 4096 and bwd[2].l2 == 128 * ((128 + 128) * 4096 * 2 + 128 * 128 * 4)
    assert bwd[0].hbm == 0.0  # weights in L2: only the state goes to HBM
    unsplit = gt.backward_phases(
        Tiles(128, 32, 128, 32, 64, bb_h=128, bu_h=32, bb_m=128, bu_m=32), B, H, 2, True
    )
    assert [p.name for p in unsplit] == ["dh", "dm"] and not any(p.wgmma for p in unsplit)  # M = 32: mma.sync


def test_the_model_is_near_run_3s_persistent_loop():
    """The H100's L2 rate and phase cost were fitted to run 3's persistent-loop times at B128 H4096 (ms per 64
    steps, bench/README.md: forward 8.739, backward 11.815, split backward 8.226) on the tiles it ran: the
    model stays within 15% of each."""
    import torch

    from app.model.gpu_tiles import persistent_tiles, predicted_us, split_tiles, tiles_for

    old = persistent_tiles(tiles_for(128, 4096, torch.bfloat16, 132, False), torch.bfloat16)
    split = persistent_tiles(split_tiles(old, 128, 4096, 132, torch.bfloat16), torch.bfloat16)
    for t, fwd, ms in ((old, True, 8.739), (old, False, 11.815), (split, False, 8.226)):
        us = predicted_us(t, fwd, 128, 4096, torch.bfloat16, R, True, "persistent")
        assert math.isclose(us * 64 / 1e3, ms, rel_tol=0.15), (fwd, us, ms)


def test_rates_are_found_by_device_name_and_sm_count():
    assert gt.rates_for("NVIDIA H100 80GB HBM3", 132) is R
    assert gt.rates_for("NVIDIA H100 PCIe", 114) is gt.RATES["H100 PCIe"]
    assert gt.rates_for("NVIDIA H200", 132) is gt.RATES["H200"]
    other = gt.rates_for("NVIDIA A100-SXM4-80GB", 108)
    assert "not measured" in other.source and other.sms == 108 and other.l2_gbs < R.l2_gbs
    assert gt.device_rates("H200")[1:] == (60 << 20, 90)
