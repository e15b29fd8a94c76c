"""The tile sizes of the GPU mLSTM core, in one table (TABLE) and the two rules that read it: the tuner
(app/model/gpu_tuning.py), the loops (gpu_loops.py), the interpreter tests and the kernel compile test and
report (bench/kernel_report.py) all take their tiles from here.

A phase's output is an (H units x B rows) result; a tile is BU units x BB batch rows of it (a forward gate tile:
4 BU weight rows, all four gates of its units), its product run over K in BK steps. The weight rows are the
product's M side (Hopper's warpgroup MMA needs M % 64 == 0: 64 units, or 4 gates x 16 units), the batch rows
its N side.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace

import torch


def interpreting() -> bool:
    """Whether Triton runs in its interpreter (TRITON_INTERPRET=1: the CPU tests)."""
    return os.environ.get("TRITON_INTERPRET") == "1"


@dataclass(frozen=True)
class Tiles:
    """Tile sizes of the phases (batch rows BB, units BU; a forward gate tile holds 4 BU weight rows), the K step,
    the launch's warps and pipeline depth: r = the forward's phase 1, g = its gate phase, h = the backward's
    phase 1 (and the split's sum), m = the backward's K = 4H phase, split `split` ways over K (1: not split)."""

    bb_r: int
    bu_r: int
    bb_g: int
    bu_g: int
    bk: int
    warps: int = 4
    stages: int = 3
    bb_h: int = 16
    bu_h: int = 16
    bb_m: int = 16
    bu_m: int = 16
    split: int = 1

    def n_r(self, B: int, H: int) -> int:
        return -(-B // self.bb_r) * -(-H // self.bu_r)

    def n_g(self, B: int, H: int) -> int:
        return -(-B // self.bb_g) * -(-H // self.bu_g)

    def n_h(self, B: int, H: int) -> int:
        return -(-B // self.bb_h) * -(-H // self.bu_h)

    def bwd(self) -> tuple[int, int, int, int]:
        """(BB_H, BU_H, BB_M, BU_M)."""
        return self.bb_h, self.bu_h, self.bb_m, self.bu_m

    def n_m(self, B: int, H: int) -> int:
        """Programs of the backward's phase 2 (its output tiles times the K slices)."""
        return -(-B // self.bb_m) * -(-H // self.bu_m) * self.split


# Every tile size the tuner can choose comes from here. Units per tile shrink from `start` towards `least` while
# twice the tiles still fit in one wave over the SMs (more programs, each reading less); `least` keeps M >= 64 for
# the warpgroup MMA, `last` gives it up where even then few SMs would work.
TABLE = dict(
    # K step of the products. fp32 without tf32 runs Triton's FMA product, whose operands it holds in registers
    # K deep: at 32 a (64 x 32) tile of it needed over 255 registers; 16 halves them
    bk={torch.bfloat16: 64, torch.float16: 64, torch.float32: 32, torch.float64: 32, "fp32_fma": 16},
    # batch rows per tile at most, by operand bytes, where the weights stay in L2 (re-reading them is cheap) and
    # where they stream from HBM each step (the whole batch, up to 128, in one tile). 4-byte operands take their
    # products off the tensor cores' warpgroup MMA (fp32: FMA) or into more registers (tf32): 64-row tiles of
    # them spilled on sm_90 (bench/kernel_report.py)
    rows_in_l2={2: 64, 4: 32, 8: 32},
    rows_streamed={2: 128, 4: 32, 8: 32},
    rows_least=16,  # tl.dot's least N
    r_units=dict(start=64, least=16),  # forward phase 1 (r = W_mh h) and the backward's phase 1
    g_units_in_l2=dict(start=16, least=16, last=4),  # forward phase 2: 4 x units weight rows (M 64 at 16)
    # large H: 4 x 32 = 128 weight rows, half the tiles' L2 reads (4-byte operands: 4 x 16; 4 x 32 spilled)
    g_units_streamed={2: dict(start=32, least=16, last=4), 4: dict(start=16, least=16, last=4)},
    m_units=dict(start=64, least=16, last=4),  # the backward's phase 2 (dm = W_m^T dG, K = 4H)
    split_tile=dict(rows={2: 128, 4: 32, 8: 32}, units=64, least_k_steps=2),  # split over K: whole batch x 64
    warps=4,
    warps_wide=8,  # a tile of 128 batch rows
    stages=3,
    # The persistent loop runs every phase in one kernel, and their live registers add up: accumulator elements
    # per thread at most, measured spill-free on sm_90 (bench/kernel_report.py); the gate phase's tile, then the
    # backward's first, lose batch rows until they fit. A (4 x 32, 128) gate tile beside a (64, 128) r tile
    # spilled 40 bytes; (4 x 32, 64) did not (176 registers). (64, 128) h beside (64, 128) m spilled 32; (64, 64)
    # h did not (208).
    persistent_per_thread=dict(gates=32, backward=48),
    # Before Hopper (sm_80/sm_89: mma.sync, operands through registers) the backward's first phase spilled 8
    # bytes at 32 accumulator elements per thread (64 x 128 on 8 warps, 64 x 64 on 4): 16 there, and the
    # persistent backward's two tiles 24 between them (fp32's 64 x 32 + 64 x 32 on 4 warps spilled)
    # (by operand bytes: fp32's FMA products, their operands in registers, spilled at half those)
    pre_hopper={2: dict(h_per_thread=16, backward=24), 4: dict(h_per_thread=8, backward=12)},
    # the interpreter (CPU tests): tiles that make the test shapes (H 18..24, B 3..17) span several tiles,
    # the last of each partial, and a 3-way split of K = 4H whose last slice is short
    interpreter=Tiles(bb_r=16, bu_r=16, bb_g=16, bu_g=4, bk=16, bb_h=16, bu_h=16, bb_m=16, bu_m=8, split=3),
)


def next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def _fit(B: int, H: int, sms: int, bu: int, bb: int, bu_least: int, rows_too: bool) -> tuple[int, int]:
    """Halve the units (then, with `rows_too`, the rows) of a tile while twice the tiles fit in one wave."""
    while 2 * -(-B // bb) * -(-H // bu) <= sms and bu > bu_least:
        bu //= 2
    while rows_too and 2 * -(-B // bb) * -(-H // bu) <= sms and bb > TABLE["rows_least"]:
        bb //= 2
    return bu, bb


def _units(B: int, H: int, sms: int, bb: int, rule: dict, rows_too: bool) -> tuple[int, int]:
    bu, bb = _fit(B, H, sms, rule["start"], bb, rule["least"], rows_too)
    if "last" in rule and 2 * -(-B // bb) * -(-H // bu) <= sms:  # still few tiles: give up M = 64
        bu, bb = _fit(B, H, sms, bu, bb, rule["last"], rows_too)
    return bu, bb


def tiles_for(B: int, H: int, dtype: torch.dtype, sms: int, weights_in_l2: bool, cc: int = 90) -> Tiles:
    """Tiles that give every SM work: units per tile shrink first; then, where the weights stay in L2, batch
    rows (re-reading a weight tile from L2 is cheap; from HBM it is not, so large layers keep the whole batch
    in one tile and take 4 x 32 gate rows per tile). `cc`: the compute capability (90 for sm_90)."""
    if interpreting():
        return replace(TABLE["interpreter"], split=1)
    nbytes = torch.finfo(dtype).bits // 8
    most = TABLE["rows_in_l2" if weights_in_l2 else "rows_streamed"][nbytes]
    bb = min(most, max(TABLE["rows_least"], next_pow2(B)))
    bu_r, bb_r = _units(B, H, sms, bb, TABLE["r_units"], weights_in_l2)
    g_rule = TABLE["g_units_in_l2"] if weights_in_l2 else TABLE["g_units_streamed"][min(4, nbytes)]
    bu_g, bb_g = _units(B, H, sms, bb, g_rule, weights_in_l2)
    bu_m, bb_m = _units(B, H, sms, bb, TABLE["m_units"], weights_in_l2)
    wide = max(bb_r, bb_g, bb_m) >= 128
    warps = TABLE["warps_wide" if wide else "warps"]
    bb_h = bb_r
    pre = TABLE["pre_hopper"][min(4, nbytes)]
    while cc < 90 and bu_r * bb_h > pre["h_per_thread"] * 32 * warps and bb_h > TABLE["rows_least"]:
        bb_h //= 2
    fma = dtype == torch.float32 and not torch.backends.cuda.matmul.allow_tf32
    return Tiles(bb_r, bu_r, bb_g, bu_g, TABLE["bk"]["fp32_fma" if fma else dtype], warps=warps,
                 stages=TABLE["stages"], bb_h=bb_h, bu_h=bu_r, bb_m=bb_m, bu_m=bu_m)  # fmt: skip


def split_tiles(base: Tiles, B: int, H: int, sms: int, dtype: torch.dtype) -> Tiles:
    """The backward's K = 4H phase on tiles of the whole batch (up to 128 rows: the weights read once) by 64
    units (a warpgroup MMA's M), split over K into as many slices as fill the SMs (each at least 2 K steps;
    1 where the tiles already fill them)."""
    if interpreting():
        return TABLE["interpreter"]
    rule = TABLE["split_tile"]
    rows = rule["rows"][torch.finfo(dtype).bits // 8]
    bb_m, bu_m = min(rows, max(TABLE["rows_least"], next_pow2(B))), rule["units"]
    outputs = -(-B // bb_m) * -(-H // bu_m)
    split = max(1, min(sms // outputs, 4 * H // (rule["least_k_steps"] * base.bk)))
    # 8 warps from 64 x 32 (2048 accumulators): on 4, fp32 FMA products spilled at sm_89 (B64 H1024)
    warps = TABLE["warps_wide"] if bb_m * bu_m >= 2048 else base.warps
    return replace(base, bb_m=bb_m, bu_m=bu_m, split=split, warps=warps)


def persistent_tiles(t: Tiles, dtype: torch.dtype, cc: int = 90) -> Tiles:
    """`t` as the persistent loop takes it: its gate tile, then its backward's first-phase tile, halved in batch
    rows until the accumulators per thread are within TABLE's caps (their phases share one kernel's registers)."""
    if interpreting():
        return t
    cap, threads = dict(TABLE["persistent_per_thread"]), 32 * t.warps
    if cc < 90:
        cap["backward"] = TABLE["pre_hopper"][min(4, torch.finfo(dtype).bits // 8)]["backward"]
    bb_g, bb_h = t.bb_g, t.bb_h
    while 4 * t.bu_g * bb_g > cap["gates"] * threads and bb_g > TABLE["rows_least"]:
        bb_g //= 2
    while (t.bu_h * bb_h + t.bu_m * t.bb_m) > cap["backward"] * threads and bb_h > TABLE["rows_least"]:
        bb_h //= 2
    return replace(t, bb_g=bb_g, bb_h=bb_h)


def weights_in_l2(H: int, dtype: torch.dtype, l2_bytes: int) -> bool:
    """Whether a layer's recurrent weights (5 H^2) fit in half the L2 (the other half for the state)."""
    return 5 * H * H * torch.finfo(dtype).bits // 8 <= l2_bytes // 2
