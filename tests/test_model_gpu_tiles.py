"""app/model/gpu_tiles.py: the tilings the tuner ranks, the l2 tiles the traffic model picks, the switch between
old and new tilings, and `describe`."""

import pytest
import torch

from app.common.errors import UserError
from app.model import gpu_traffic
from app.model.gpu_tiles import (
    describe,
    l2_tiles,
    model,
    persistent_tiles,
    predicted_us,
    tile_sets,
    tiles_for,
)

H100 = gpu_traffic.RATES["H100 SXM"]


@pytest.mark.parametrize("B", [128, 256])
def test_the_large_model_gets_l2_tiles_all_on_warpgroup_mma(B):
    """B128 and B256 H4096 in bf16 on 132 SMs (the weights stream from HBM each step): every product of the l2
    tiles has M 64 or 128 (a warpgroup MMA) on whole-batch tiles (128 rows), at most 128 x 128 (spill-free in
    the kernel report), and the model predicts a step at most 0.9 of today's persistent tiles'."""
    t = l2_tiles(B, 4096, torch.bfloat16, 132, False)
    assert t is not None
    phases = gpu_traffic.forward_phases(t, B, 4096, 2, True) + gpu_traffic.backward_phases(
        t, B, 4096, 2, True
    )
    products = [p for p in phases if p.m]
    assert products and all(p.m in (64, 128) and p.wgmma and p.n == 128 for p in products), products
    assert all(p.m * p.n <= 128 * 128 for p in products)
    old = persistent_tiles(tiles_for(B, 4096, torch.bfloat16, 132, False), torch.bfloat16)

    def step(tiles):
        return sum(
            predicted_us(tiles, d, B, 4096, torch.bfloat16, H100, True, "persistent") for d in (True, False)
        )

    assert step(t) <= 0.9 * step(old), (step(t), step(old))


def test_l2_tiles_only_where_they_pay_and_run_on_wgmma():
    assert l2_tiles(16, 256, torch.bfloat16, 132, True) is None  # small: barriers and latency, not traffic
    assert l2_tiles(128, 4096, torch.float32, 132, False) is None  # fp32: no warpgroup MMA of its products
    assert l2_tiles(128, 4096, torch.bfloat16, 108, False, cc=80) is None  # before Hopper


def test_old_and_new_tilings_are_both_ranked_unless_one_is_asked_for(monkeypatch):
    """MLSTM_GPU_TILES: both (default) ranks today's persistent and split tiles beside persistent-l2 at B128
    H4096; old leaves persistent-l2 out; new leaves the persistent and split ones out where persistent-l2 is
    there; anything else is one line."""

    def labels():
        return [c.label for c in tile_sets(128, 4096, torch.bfloat16, 132, 50 << 20)]

    monkeypatch.delenv("MLSTM_GPU_TILES", raising=False)
    assert labels() == ["cublas", "step", "persistent", "splitk", "persistent-l2"]
    monkeypatch.setenv("MLSTM_GPU_TILES", "old")
    assert labels() == ["cublas", "step", "persistent", "splitk"]
    monkeypatch.setenv("MLSTM_GPU_TILES", "new")
    assert labels() == ["cublas", "step", "persistent-l2"]
    small = [c.label for c in tile_sets(16, 256, torch.bfloat16, 132, 50 << 20)]
    assert "persistent" in small and "persistent-l2" not in small  # no l2 tiles there: today's stay
    monkeypatch.setenv("MLSTM_GPU_TILES", "newest")
    with pytest.raises(
        UserError, match="MLSTM_GPU_TILES must be one of both, old, new or unset, got 'newest'"
    ):
        labels()


def test_describe_prints_tiles_programs_products_and_predictions(monkeypatch):
    monkeypatch.delenv("MLSTM_GPU_TILES", raising=False)
    text = describe(128, 4096, torch.bfloat16, "H100 SXM")
    lines = text.splitlines()
    assert lines[0].startswith("B128 H4096 bfloat16 on H100 SXM (132 SMs, L2 50 MiB; rates: run 3")
    assert "the weights stream from HBM each step; HBM floor" in lines[0]
    m = model(128, 4096, torch.bfloat16, "H100 SXM")
    l2 = m["candidates"]["fwd/persistent-l2"]
    assert (
        f"  fwd/persistent-l2 [{l2['tiles']}], {l2['programs']} programs: {l2['us']} us per step predicted"
        in lines
    )
    assert any("r slices" in ln and "M 128 x N 128 x K 1024 wgmma" in ln for ln in lines), text
    assert any(ln.strip().startswith("r ") and "M 32 x N 128 x K 4096 mma.sync" in ln for ln in lines), text
    assert "fwd/cublas" in text and "not modelled (cuBLAS's products)" in text
    for key in ("fwd/persistent", "bwd/persistent", "bwd/splitk", "bwd/persistent-l2"):
        assert m["candidates"][key]["us"] > 0, key
    assert m["candidates"]["fwd/persistent-l2"]["us"] < m["candidates"]["fwd/persistent"]["us"]
    assert 55 < m["hbm_floor_us"]["fwd"] < m["candidates"]["fwd/persistent-l2"]["us"]
