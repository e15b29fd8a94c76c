"""bench/roofline.py: the FLOPs, HBM bytes and L2 bytes a training step of the layer must move, from the tiles."""

import sys

import pytest
import torch
from launcher import ROOT

sys.path.append(str(ROOT / "bench"))  # after the root: bench/data_prep.py must not hide the package
import roofline

from app.model.gpu_loops import PersistentLoop, SplitKLoop
from app.model.gpu_tiles import Tiles, tiles_for


def test_flops_are_three_forwards_of_the_layers_products():
    # 5 H D input side + 5 H^2 recurrent multiply-adds per token, 2 FLOPs each, x3 for training
    assert roofline.flops(B=2, T=3, H=4) == 3 * 2 * (5 * 16 + 5 * 16) * 6


def test_streamed_weights_cost_each_step_resident_ones_once():
    resident = roofline.hbm_bytes(128, 128, 4096, 2, weights_in_l2=True)
    streamed = roofline.hbm_bytes(128, 128, 4096, 2, weights_in_l2=False)
    assert streamed - resident == pytest.approx(
        2 * 127 * 5 * 4096**2 * 2
    )  # both directions, T - 1 more reads


def test_l2_reads_follow_the_tiles_and_the_backward_tiles_cut_them_threefold():
    """B256 H4096: the backward's K = 4H phase on (64 units x 128 rows) tiles reads about a third of what it
    read on the forward gate phase's (16 x 128): the issue's estimate, from the tiles alone."""
    B, H = 256, 4096
    old = Tiles(128, 64, 128, 16, 64, warps=8, bb_h=128, bu_h=64, bb_m=128, bu_m=16)
    new = tiles_for(B, H, torch.bfloat16, sms=132, weights_in_l2=False)
    assert (new.bb_m, new.bu_m) == (128, 64)

    def m_reads(t: Tiles) -> float:
        return t.n_m(B, H) * (t.bu_m + t.bb_m) * 4 * H // t.split

    assert m_reads(old) / m_reads(new) == pytest.approx(3.0, rel=0.05)
    fwd, bwd = PersistentLoop(new, 132), SplitKLoop(new, 132)
    phases = roofline.l2_phases(fwd, True, B, H, 2) + roofline.l2_phases(bwd, False, B, H, 2)
    assert roofline.l2_bytes_per_step(fwd, bwd, B, H, 2) == sum(p.l2 for p in phases)
    # the products' operands are most of it: each tile its weight rows and batch rows over K
    operands = 2 * (new.n_r(B, H) * (new.bu_r + new.bb_r) * H + new.n_g(B, H) * (4 * new.bu_g + new.bb_g) * H
                    + new.n_h(B, H) * (new.bu_h + new.bb_h) * H + m_reads(new))  # fmt: skip
    assert operands < sum(p.l2 for p in phases) < 1.2 * operands


def test_every_phase_of_a_split_candidate_is_counted():
    """The l2 tiles at B128 H4096: r, dh and dm split over K: their slices and their sums are phases of their own,
    each with its L2 bytes; a loop's step is the sum of its phases'."""
    from app.model.gpu_tiles import l2_tiles

    t = l2_tiles(128, 4096, torch.bfloat16, 132, False)
    loop = PersistentLoop(t, 132, tag="l2")
    names = [
        p.name
        for p in roofline.l2_phases(loop, True, 128, 4096, 2) + roofline.l2_phases(loop, False, 128, 4096, 2)
    ]
    assert names == ["r slices", "r sum", "gates", "dh slices", "dh sum", "dm slices", "dm sum"], names
    assert all(p.l2 > 0 for p in roofline.l2_phases(loop, False, 128, 4096, 2))


def test_the_script_prints_the_model_and_a_json_line(tmp_path):
    """`python bench/roofline.py`: the traffic model of each shape's candidates, no GPU, a JSON line last."""
    import json
    import subprocess

    p = subprocess.run([sys.executable, str(ROOT / "bench" / "roofline.py"), "--shapes", "128x4096",
                        "--device", "H200"], cwd=ROOT, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout.strip().splitlines()[-1])
    (shape,) = out["shapes"]
    assert out["device"] == "H200" and shape["us"]["fwd/persistent-l2"] < shape["us"]["fwd/persistent"]
    assert "fwd/persistent-l2 [r 128x128/4+32x128 g 4x32x128]" in p.stdout


def test_the_bound_names_what_binds():
    ceil = {"matmul_tflops": 700.0, "hbm_gbs": 3000.0, "l2_gbs": 6000.0}
    t = tiles_for(128, 4096, torch.bfloat16, sms=132, weights_in_l2=False)
    b = roofline.bound(dict(B=128, T=128, H=4096), 2, False, ceil, PersistentLoop(t, 132), SplitKLoop(t, 132))
    times = {k[:-3]: v for k, v in b.items() if k.endswith("_ms") and k != "bound_ms"}
    assert b["bound_ms"] == max(times.values()) == times[b["bound_by"]] and set(times) == {
        "compute",
        "hbm",
        "l2",
    }
    assert roofline.bound(dict(B=16, T=128, H=256), 2, True, ceil)["l2_ms"] is None  # no tiles given
