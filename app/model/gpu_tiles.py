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

from app.common.errors import UserError
from app.model import gpu_traffic


def interpreting() -> bool:
    """Whether Triton runs in its interpreter (TRITON_INTERPRET=1: the CPU tests)."""
    return os.environ.get("TRITON_INTERPRET") == "1"


TILINGS = ("both", "old", "new")


def tiles_wanted() -> str:
    """MLSTM_GPU_TILES: which tilings the tuner offers: both (default), old (today's table alone: no l2
    candidate), new (the l2 candidate instead of the persistent and split ones, where a shape has one)."""
    want = os.environ.get("MLSTM_GPU_TILES", "") or "both"
    if want not in TILINGS:
        raise UserError(f"MLSTM_GPU_TILES must be one of {', '.join(TILINGS)} or unset, got {want!r}")
    return want


@dataclass(frozen=True)
class Tiles:
    """Tile sizes of the phases (batch rows BB, units BU; a forward gate tile holds 4 BU weight rows), the K step,
    the launch's warps and pipeline depth: r = the forward's phase 1, g = its gate phase, h = the backward's
    phase 1 (and the split's sum), m = the backward's K = 4H phase, split `split` ways over K (1: not split);
    rk / hk: the K slices of r and dh (`split_r`, `split_h` ways; r's and h's tiles then sum them)."""

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
    bb_rk: int = 16
    bu_rk: int = 16
    split_r: int = 1
    bb_hk: int = 16
    bu_hk: int = 16
    split_h: int = 1

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

    def n_rk(self, B: int, H: int) -> int:
        """Programs of r's K slices (split_r > 1)."""
        return -(-B // self.bb_rk) * -(-H // self.bu_rk) * self.split_r

    def n_hk(self, B: int, H: int) -> int:
        """Programs of dh's K slices (split_h > 1)."""
        return -(-B // self.bb_hk) * -(-H // self.bu_hk) * self.split_h

    def most_tiles(self, B: int, H: int) -> int:
        """The most tiles any phase has (a persistent loop's grid: this, at most the SM count)."""
        n = [self.n_r(B, H), self.n_g(B, H), self.n_h(B, H), self.n_m(B, H)]
        return max(n + [self.n_rk(B, H)] * (self.split_r > 1) + [self.n_hk(B, H)] * (self.split_h > 1))

    def split_parts(self) -> int:
        """K slices the part buffer holds at once (1: no split)."""
        return max(self.split, self.split_r, self.split_h)

    def short(self, fwd: bool) -> str:
        """One direction's product tiles, units x rows (gates: 4 x units x rows), a split's ways after a slash and
        its sum's tiles after a plus: "r 128x128/2+32x128 g 4x32x128"."""

        def one(bu: int, bb: int, split: int = 1, sum_bu: int = 0, sum_bb: int = 0) -> str:
            return f"{bu}x{bb}" + (f"/{split}+{sum_bu}x{sum_bb}" if split > 1 else "")

        if fwd:
            r = (
                one(self.bu_rk, self.bb_rk, self.split_r, self.bu_r, self.bb_r)
                if self.split_r > 1
                else one(self.bu_r, self.bb_r)
            )
            return f"r {r} g 4x{self.bu_g}x{self.bb_g}"
        h = (
            one(self.bu_hk, self.bb_hk, self.split_h, self.bu_h, self.bb_h)
            if self.split_h > 1
            else one(self.bu_h, self.bb_h)
        )
        return f"dh {h} dm {one(self.bu_m, self.bb_m, self.split, self.bu_h, self.bb_h)}"


# TABLE's l2 rule (below)
_L2_RULE = dict(units=(64, 128), gate_units=(16, 32), splits=(1, 2, 4, 8), least_k_steps=2, gain=0.9, near=1.05,
                whole_k_units=64)  # fmt: skip
# the l2 candidate in the interpreter (TABLE's interpreter_l2)
_INTERPRETER_L2 = Tiles(16, 8, 16, 8, 16, bb_h=16, bu_h=8, bb_m=16, bu_m=16, split=2, bb_rk=16, bu_rk=16,
                        split_r=2, bb_hk=16, bu_hk=16, split_h=3)  # fmt: skip


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
    # split over K: whole batch x 64 units, at most 8 slices (their sum is unrolled: 32 slices of a B16 H256
    # fp32 split held 255 registers and spilled under Triton 3.9)
    split_tile=dict(rows={2: 128, 4: 32, 8: 32}, units=64, least_k_steps=2, most=8),
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
    # Re-tiled for L2 traffic (the `l2` candidates: the persistent loop, 16-bit operands on sm_90): every product
    # on whole-batch tiles (up to 128 rows) of 64 or 128 weight rows (the warpgroup MMA's M), r and dh split over
    # K where the traffic model (app/model/gpu_traffic.py) says it pays, their sums and epilogues on small
    # tiles (`r_units`) that fill the SMs. Chosen per phase by the model; offered where it predicts a step
    # `gain` times the tiles above or less. Spill-free at the largest: a (128, 128) r slice beside a (4 x 32,
    # 128) gate tile (its epilogue 64 rows at a time) 196 registers under Triton 3.9, 141 under 3.6; the
    # backward's (64, 128) dh tile (its epilogue 64 rows at a time) beside (128, 128) dm slices 230 / 236. A
    # product over the whole K keeps its epilogue in the accumulator's registers: at most `whole_k_units` units
    # (a (128, 128) dm tile so, beside a (64, 128) dh tile, spilled 24 bytes under Triton 3.6)
    l2=_L2_RULE,
    # the interpreter (CPU tests): tiles that make the test shapes (H 18..24, B 3..17) span several tiles,
    # the last of each partial, and a 3-way split of K = 4H whose last slice is short
    interpreter=Tiles(bb_r=16, bu_r=16, bb_g=16, bu_g=4, bk=16, bb_h=16, bu_h=16, bb_m=16, bu_m=8, split=3),
    # and the l2 candidate's there: r split 2 ways (K = H = 20 in K steps of 16: slices of 16 and 4), dh 3 ways
    # (16, 4 and an empty one), dm 2 ways, each with its own tiles and sums on tiles of 8 units
    interpreter_l2=_INTERPRETER_L2,
    # the gate and dh epilogues run on pieces of at most this many (unit, row) elements per gate, a few batch
    # rows at a time (triton_kernels: _fwd_gates_tile, _bwd_h_tile): a (4 x 32, 128) gate tile's in one piece,
    # beside the persistent loop's other phases, spilled under Triton 3.9, as did a (64, 64) dh tile's on 4 warps
    # (255 registers, 8 bytes); in the interpreter 8 rows, so its 16-row tiles run two pieces
    epilogue_elements=2048,
    epilogue_rows_interpreter=8,
)


def epilogue_rows(bb: int, bu: int) -> int:
    """The batch rows of a (bu units, bb rows) tile's epilogue piece: a power of two dividing bb, at least 16."""
    if interpreting():
        return min(bb, TABLE["epilogue_rows_interpreter"])
    return min(bb, max(TABLE["rows_least"], next_pow2(TABLE["epilogue_elements"] // bu + 1) // 2))


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
    split = max(1, min(sms // outputs, 4 * H // (rule["least_k_steps"] * base.bk), rule["most"]))
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


# ---- re-tiled for L2 traffic: the `l2` candidates, chosen by the traffic model


def _split_phase(B: int, H: int, K: int, sms: int, bb: int, bk: int, r: gpu_traffic.Rates, cost) -> tuple:
    """(units, split) of a product over K on whole-batch tiles that the model predicts fastest: `cost(bu, split)`
    its phases' time on the SMs (a split's slices at most one wave; each slice at least `least_k_steps` K
    steps). Of options within `near` of the fastest, the one on the most SMs: the model's L2 rate per SM is
    assumed (gpu_traffic.SM_SHARE), and a phase that fills the SMs depends on it least."""
    rule = TABLE["l2"]
    options = [
        (bu, s) for bu in rule["units"] for s in rule["splits"]
        if (s == 1 or K // s >= rule["least_k_steps"] * bk) and (s == 1 or -(-B // bb) * -(-H // bu) * s <= sms)
        and (s > 1 or bu <= rule["whole_k_units"])
    ]  # fmt: skip
    us = {o: cost(*o) for o in options}
    near = [o for o in options if us[o] <= rule["near"] * min(us.values())]
    return max(near, key=lambda o: (min(sms, -(-B // bb) * -(-H // o[0]) * o[1]), -o[1], o[0]))


def _l2_candidate(B: int, H: int, sms: int, bb: int, bk: int, streamed: bool, r: gpu_traffic.Rates) -> Tiles:
    """The l2 tiling of a shape: each phase's product tile and split the fastest by the model, phase by phase
    (the persistent loop's phases are apart, one after another)."""
    sum_u, sum_b = _units(
        B, H, sms, bb, TABLE["r_units"], False
    )  # sums and epilogues: tiles that fill the SMs
    base = Tiles(sum_b, sum_u, bb, 16, bk, warps=TABLE["warps_wide"], stages=TABLE["stages"], bb_h=sum_b,
                 bu_h=sum_u, bb_m=bb, bb_rk=bb, bb_hk=bb)  # fmt: skip

    def fwd_us(t: Tiles) -> float:
        return gpu_traffic.step_us(gpu_traffic.forward_phases(t, B, H, 2, streamed), r, sms, True)

    def bwd_us(t: Tiles) -> float:
        return gpu_traffic.step_us(gpu_traffic.backward_phases(t, B, H, 2, streamed), r, sms, True)

    def r_tiles(bu: int, s: int) -> Tiles:
        return replace(base, bu_rk=bu, split_r=s) if s > 1 else replace(base, bu_r=bu, bb_r=bb)

    def h_tiles(bu: int, s: int) -> Tiles:
        return replace(base, bu_hk=bu, split_h=s) if s > 1 else replace(base, bu_h=bu, bb_h=bb)

    t = r_tiles(*_split_phase(B, H, H, sms, bb, bk, r, lambda bu, s: fwd_us(r_tiles(bu, s))))
    t = min((replace(t, bu_g=u) for u in TABLE["l2"]["gate_units"]), key=fwd_us)
    h = h_tiles(*_split_phase(B, H, H, sms, bb, bk, r, lambda bu, s: bwd_us(h_tiles(bu, s))))
    t = replace(t, bb_h=h.bb_h, bu_h=h.bu_h, bb_hk=h.bb_hk, bu_hk=h.bu_hk, split_h=h.split_h)

    def m_tiles(bu: int, s: int) -> Tiles:
        return replace(t, bu_m=bu, split=s)

    return m_tiles(*_split_phase(B, H, 4 * H, sms, bb, bk, r, lambda bu, s: bwd_us(m_tiles(bu, s))))


def predicted_us(t: Tiles, fwd: bool, B: int, H: int, dtype: torch.dtype, r: gpu_traffic.Rates, streamed: bool,
                 kind: str, cc: int = 90) -> float | None:  # fmt: skip
    """The traffic model's time per step of one direction of a loop `kind` (step, persistent, splitk) on tiles
    `t`, in us; None for the cuBLAS loop (its products are cuBLAS's tiles, not modelled)."""
    if kind == "cublas":
        return None
    phases = gpu_traffic.forward_phases if fwd else gpu_traffic.backward_phases
    nbytes = torch.finfo(dtype).bits // 8
    persistent = kind != "step"
    programs = min(r.sms, t.most_tiles(B, H))
    return gpu_traffic.step_us(phases(t, B, H, nbytes, streamed, cc=cc), r, programs, persistent)


def l2_tiles(B: int, H: int, dtype: torch.dtype, sms: int, weights_in_l2: bool, cc: int = 90,
             rates: gpu_traffic.Rates | None = None) -> Tiles | None:  # fmt: skip
    """The l2 candidate's tiles where the traffic model predicts its step (forward plus backward) at most
    TABLE["l2"]["gain"] times the persistent loop's on today's tiles (and the split backward's), else None: on
    sm_90 with 16-bit operands only (its products are warpgroup MMAs)."""
    if interpreting():
        return TABLE["interpreter_l2"]
    if cc < 90 or torch.finfo(dtype).bits != 16:
        return None
    r = rates or gpu_traffic.rates_for("H100 SXM", sms)
    bk = TABLE["bk"][dtype]
    bb = min(TABLE["rows_streamed"][2], max(TABLE["rows_least"], next_pow2(B)))
    new = _l2_candidate(B, H, sms, bb, bk, not weights_in_l2, r)
    old = persistent_tiles(tiles_for(B, H, dtype, sms, weights_in_l2, cc), dtype, cc)
    split = persistent_tiles(split_tiles(old, B, H, sms, dtype), dtype, cc)

    def us(t: Tiles, fwd: bool) -> float:
        return predicted_us(t, fwd, B, H, dtype, r, not weights_in_l2, "persistent", cc) or 0.0

    before = us(old, True) + min(us(old, False), us(split, False))
    return new if us(new, True) + us(new, False) <= TABLE["l2"]["gain"] * before else None


# ---- the candidates' tilings, and what the traffic model makes of them


@dataclass(frozen=True)
class TileSet:
    """One candidate of the tuner as tiles: the loop `kind` (cublas, step, persistent, splitk) and its `tag` ("l2":
    re-tiled for L2 traffic), its tiles, its programs (a persistent loop's grid; 0: a program per tile) and the
    directions it is a candidate for."""

    kind: str
    tag: str
    tiles: Tiles
    programs: int
    directions: tuple[str, ...] = ("fwd", "bwd")

    @property
    def label(self) -> str:
        return f"{self.kind}-{self.tag}" if self.tag else self.kind


def tile_sets(B: int, H: int, dtype: torch.dtype, sms: int, l2_bytes: int, cc: int = 90) -> list[TileSet]:
    """The tilings the tuner ranks for a shape on a device of compute capability `cc` with `sms` SMs and
    `l2_bytes` of L2, in the fallback order (cuBLAS first): today's table for the cuBLAS, step and persistent
    loops; the split backward's where it differs from the persistent loop's; the l2 tiles (persistent-l2) where
    the traffic model picks them. MLSTM_GPU_TILES=old leaves out the l2 ones, new the persistent and split
    ones where an l2 one exists."""
    in_l2 = interpreting() or weights_in_l2(H, dtype, l2_bytes)
    tiles = tiles_for(B, H, dtype, sms, in_l2, cc)
    persistent = persistent_tiles(tiles, dtype, cc)
    split = persistent_tiles(split_tiles(tiles, B, H, sms, dtype), dtype, cc)

    def programs(t: Tiles) -> int:
        return min(sms, t.most_tiles(B, H))

    out = [TileSet("cublas", "", tiles, 0), TileSet("step", "", tiles, 0),
           TileSet("persistent", "", persistent, programs(persistent))]  # fmt: skip
    if split.bwd() != persistent.bwd() or split.split > 1:
        out.append(TileSet("splitk", "", split, programs(split), ("bwd",)))
    want = tiles_wanted()
    new = None if want == "old" else l2_tiles(B, H, dtype, sms, in_l2, cc)
    if new is not None:
        if want == "new":
            out = [c for c in out if c.kind not in ("persistent", "splitk")]
        out.append(TileSet("persistent", "l2", new, programs(new)))
    return out


def model(B: int, H: int, dtype: torch.dtype, device) -> dict:
    """The traffic model of every candidate of a shape on `device` (a CUDA device, or a GPU named in
    gpu_traffic.RATES: "H100 SXM", "H100 PCIe", "H200"): per candidate and direction its phases (tiles, the
    product's M x N x K and whether it is a warpgroup MMA, L2 and HBM bytes per step, predicted us) and the
    predicted us per step; the cuBLAS loop's products are cuBLAS's (not modelled)."""
    rates, l2, cc = gpu_traffic.device_rates(device)
    nbytes = torch.finfo(dtype).bits // 8
    streamed = not weights_in_l2(H, dtype, l2)
    out = {"B": B, "H": H, "dtype": str(dtype).removeprefix("torch."), "device": rates.name, "sms": rates.sms,
           "l2_mib": l2 >> 20, "rates": rates.source, "weights_streamed": streamed, "candidates": {}}  # fmt: skip
    base = tiles_for(B, H, dtype, rates.sms, not streamed, cc)  # the HBM bytes are any tiling's: the floor
    out["hbm_floor_us"] = {
        d: round(sum(p.hbm for p in f(base, B, H, nbytes, streamed, cc=cc)) / rates.hbm_gbs / 1e3, 1)
        for d, f in (("fwd", gpu_traffic.forward_phases), ("bwd", gpu_traffic.backward_phases))
    }
    for c in tile_sets(B, H, dtype, rates.sms, l2, cc):
        for d in c.directions:
            fwd = d == "fwd"
            phases = (gpu_traffic.forward_phases if fwd else gpu_traffic.backward_phases)(
                c.tiles, B, H, nbytes, streamed, products=c.kind != "cublas", cc=cc
            )
            persistent = c.kind in ("persistent", "splitk")
            fixed = rates.phase_us if persistent else rates.launch_us
            rows = [dict(name=p.name, tiles=p.tiles, M=p.m, N=p.n, K=p.k, wgmma=p.wgmma, l2_mb=round(p.l2 / 1e6, 2),
                         hbm_mb=round(p.hbm / 1e6, 2),
                         us=round(gpu_traffic.phase_us(p, rates, c.programs or p.tiles, fixed), 2)) for p in phases]  # fmt: skip
            us = predicted_us(c.tiles, fwd, B, H, dtype, rates, streamed, c.kind, cc)
            out["candidates"][f"{d}/{c.label}"] = dict(tiles=c.tiles.short(fwd), programs=c.programs or None,
                                                       phases=rows, us=None if us is None else round(us, 1))  # fmt: skip
    return out


def describe(B: int, H: int, dtype: torch.dtype, device) -> str:
    """The tiles, programs, products (M x N x K, warpgroup MMA or mma.sync) and predicted us per step of every
    candidate of a shape on `device` (`model`'s), as text: what the tuner's log prints the prediction of."""
    m = model(B, H, dtype, device)
    where = "stream from HBM each step" if m["weights_streamed"] else "stay in L2"
    floor = m["hbm_floor_us"]
    lines = [f"B{B} H{H} {m['dtype']} on {m['device']} ({m['sms']} SMs, L2 {m['l2_mib']} MiB; rates: {m['rates']}): "
             f"the weights {where}; HBM floor {floor['fwd']} us forward, {floor['bwd']} us backward per step"]  # fmt: skip
    for key, c in m["candidates"].items():
        grid = f"{c['programs']} programs" if c["programs"] else "a program per tile"
        us = "not modelled (cuBLAS's products)" if c["us"] is None else f"{c['us']} us per step predicted"
        lines.append(f"  {key} [{c['tiles']}], {grid}: {us}")
        for p in c["phases"]:
            prod = (
                f"M {p['M']} x N {p['N']} x K {p['K']} {'wgmma' if p['wgmma'] else 'mma.sync'}"
                if p["M"]
                else "no product"
            )
            lines.append(f"    {p['name']:10s} {p['tiles']:5d} tiles  {prod:34s} L2 {p['l2_mb']:8.1f} MB  "
                         f"HBM {p['hbm_mb']:7.1f} MB  {p['us']:7.1f} us")  # fmt: skip
    return "\n".join(lines)
