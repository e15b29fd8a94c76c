"""What one phase of the GPU loops costs per time step: a traffic model, the bytes its tiles read from L2 and move
through HBM and its products' FLOPs over a device's rates, so tile choices can be ranked without a GPU
(app/model/gpu_tiles.py builds the phases from the tiles; bench/roofline.py and the tuner's log print them).

A phase of `tiles` tiles runs on `programs` programs (at most one per SM); each program takes its tiles one after
another (waves). Its predicted time is a fixed cost (a grid barrier and one tile's latency in the persistent
loop; a launch in a CUDA graph in the step loop) plus the largest of
    L2     all its tiles' L2 bytes over the L2 rate, or a program's waves of tile bytes over what one SM can
           read (SM_SHARE times its share of the L2 rate: a phase on half the SMs cannot use the whole L2 rate)
    HBM    the bytes that must come from or go to device memory (the weights where they stream each step, the
           state each step reads and writes)
    math   a program's waves of products over its SM's share of the tensor-core rate (mma.sync, the products
           of M < 64 and everything before Hopper, at MMA_SYNC_SHARE of the warpgroup MMA's rate)

RATES are per GPU. The H100's HBM and bf16 matmul rates are run 3's measurements (bench/README.md: a 2 GiB copy,
3,025 GB/s; an 8192^3 bf16 product, 805 TFLOP/s). Its L2 rate and the fixed phase cost are fitted to run 3's
persistent-loop times (ms per 64 steps, bench/README.md): B16 H256 (0.591 forward: 2 phases, nothing to move:
~4.5 us a phase) and B128 H4096 (8.739 forward, 11.815 and 8.226 backward: 570-839 MB of L2 reads per step at
4.4-4.9 TB/s once the fixed cost is off). The other GPUs' rates are the H100's scaled by their datasheets; the
GPU session's tuner log, which prints the prediction beside the measurement, is what calibrates them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

SM_SHARE = 2.0  # an SM reads from L2 at most this many times its even share of the L2 rate (assumed)
MMA_SYNC_SHARE = 0.5  # mma.sync's rate against the warpgroup MMA's (assumed)


@dataclass(frozen=True)
class Rates:
    """A GPU's rates as the model takes them: SMs, L2 size; HBM, L2-to-SM (all SMs together) in GB/s; 16-bit tensor-core
    products in TFLOP/s (dense); the fixed cost of a persistent loop's phase (a grid barrier, a tile's
    latency) and of a launch replayed in a CUDA graph, in us; `source`: where the figures come from."""

    name: str
    sms: int
    l2_mib: int
    hbm_gbs: float
    l2_gbs: float
    tflops: float
    phase_us: float
    launch_us: float
    source: str


_H100 = Rates(
    "H100 SXM", 132, 50, 3025.0, 5000.0, 805.0, 4.5, 5.0, "run 3 (H100 80GB HBM3): measured and fitted"
)


def _like_h100(name: str, sms: int, l2_mib: int, hbm_tbs: float, source: str) -> Rates:
    """The H100 SXM's rates for a GPU of `sms` SMs at the same clocks and `hbm_tbs` of datasheet HBM."""
    f = sms / _H100.sms
    hbm = _H100.hbm_gbs * hbm_tbs / 3.35  # the SXM's datasheet 3.35 TB/s measured at 3,025 GB/s
    return Rates(name, sms, l2_mib, hbm, _H100.l2_gbs * f, _H100.tflops * f, _H100.phase_us, _H100.launch_us,
                 source)  # fmt: skip


# the L2 sizes as bench/kernel_report.py's DEVICES have them
RATES = {
    "H100 SXM": _H100,
    "H100 PCIe": _like_h100("H100 PCIe", 114, 50, 2.0, "H100 SXM scaled by the datasheets"),
    "H200": _like_h100("H200", 132, 60, 4.8, "H100 SXM scaled by the datasheets"),
}


def rates_for(name: str, sms: int) -> Rates:
    """The rates of the GPU called `name` (torch's device name: "NVIDIA H100 80GB HBM3", or a RATES key) with
    `sms` SMs: a RATES entry of the same model and SM count (the H100 SXM and PCIe differ in SMs), else the
    H100's per-SM rates times `sms` (a rough figure, said in `source`)."""
    for key, r in RATES.items():
        if key.split()[0].lower() in name.lower() and r.sms == sms:
            return r
    source = "H100 SXM per SM, scaled by the SM count (not measured)"
    return _like_h100(name, sms, _H100.l2_mib, 3.35 * sms / _H100.sms, source)


def device_rates(device) -> tuple[Rates, int, int]:
    """(rates, L2 bytes, compute capability as 90) of a CUDA device, or of a GPU named in RATES (a str that is
    not a torch device: "H100 SXM", "H200")."""
    if isinstance(device, str) and device in RATES:
        r = RATES[device]
        return r, r.l2_mib << 20, 90
    import torch

    props = torch.cuda.get_device_properties(device)
    r = rates_for(props.name, props.multi_processor_count)
    return r, getattr(props, "L2_cache_size", r.l2_mib << 20), 10 * props.major + props.minor


@dataclass(frozen=True)
class Phase:
    """One phase of a loop's time step: `tiles` tiles (a split phase: output tiles x slices), each a product
    (m x n, over k; m = 0: no product: a sum of slices, or cuBLAS's product read back) that reads and writes
    `l2_tile` bytes through L2; `hbm`: the bytes the whole phase moves through device memory; `wgmma`: whether
    its product is a warpgroup MMA."""

    name: str
    tiles: int
    m: int
    n: int
    k: int
    l2_tile: float
    hbm: float
    wgmma: bool = False

    @property
    def l2(self) -> float:
        return self.tiles * self.l2_tile

    @property
    def flops(self) -> float:
        return 2.0 * self.m * self.n * self.k * self.tiles


def phase_us(p: Phase, r: Rates, programs: int, fixed_us: float) -> float:
    """The phase's predicted time on `programs` programs, its fixed cost included."""
    progs = max(1, min(programs, r.sms))
    waves = math.ceil(p.tiles / progs)
    per_sm_gbs = SM_SHARE * r.l2_gbs / r.sms
    l2 = max(p.l2 / r.l2_gbs, waves * p.l2_tile / per_sm_gbs) / 1e3  # GB/s = 1e3 bytes/us
    hbm = p.hbm / r.hbm_gbs / 1e3
    sm_flops = r.tflops * 1e6 / r.sms * (1.0 if p.wgmma else MMA_SYNC_SHARE)  # TFLOP/s = 1e6 FLOP/us
    math_us = waves * 2.0 * p.m * p.n * p.k / sm_flops
    return fixed_us + max(l2, hbm, math_us)


def step_us(phases: list[Phase], r: Rates, programs: int, persistent: bool) -> float:
    """A time step of one direction: its phases one after another, each with its fixed cost (a grid barrier in
    the persistent loop, a graph-replayed launch in the step loop, whose grid is one program per tile)."""
    if persistent:
        return sum(phase_us(p, r, programs, r.phase_us) for p in phases)
    return sum(phase_us(p, r, p.tiles, r.launch_us) for p in phases)


def _slice_k(K: int, split: int, bk: int) -> int:
    """A K slice's length (the kernels round it up to the K step; the last may be shorter)."""
    per = -(-K // split)
    return min(K, -(-per // bk) * bk)


def _wg(m: int, nbytes: int, cc: int) -> bool:
    """Whether a product of M = m is a warpgroup MMA: sm_90, 16-bit operands, M a multiple of 64 (the kernel
    report checks that every such product is one)."""
    return cc >= 90 and nbytes == 2 and m > 0 and m % 64 == 0


def _slices(name: str, programs: int, bu: int, bb: int, k: int, b: int, W: int, cc: int) -> Phase:
    """A split-K phase's partial products: each program reads a (bu + bb) x k slice of weights and state and
    writes its bu x bb partial sum (fp32) for the sum phase that follows."""
    return Phase(name, programs, bu, bb, k, (bu + bb) * k * b + bu * bb * 4, W, _wg(bu, b, cc))


def forward_phases(t, B: int, H: int, nbytes: int, streamed: bool, products: bool = True, cc: int = 90):
    """The forward's phases per time step with tiles `t` (app/model/gpu_tiles.Tiles; `products` off: the cuBLAS
    loop, whose kernels read its products back). Bytes per (unit, row) element of each epilogue: r reads pm and
    writes r (fp32) and m; the gates read 4 pre-activations and c_{t-1} and write 4 gates, c, tanh c (fp32) and h;
    a product handed to its epilogue through scratch is stored and read back (fp32)."""
    b, E, W = nbytes, B * H, H * H * nbytes if streamed else 0
    out = []
    if t.split_r > 1:
        k = _slice_k(H, t.split_r, t.bk)
        out.append(_slices("r slices", t.n_rk(B, H), t.bu_rk, t.bb_rk, k, b, W, cc))
        out.append(
            Phase("r sum", t.n_r(B, H), 0, t.bb_r, 0, t.bu_r * t.bb_r * (4 * t.split_r + 8 + b), E * (8 + b))
        )
    elif products:
        out.append(Phase("r", t.n_r(B, H), t.bu_r, t.bb_r, H, (t.bu_r + t.bb_r) * H * b + t.bu_r * t.bb_r * (8 + b),
                         W + E * (8 + b), _wg(t.bu_r, b, cc)))  # fmt: skip
    else:
        out.append(Phase("r", t.n_r(B, H), 0, t.bb_r, 0, t.bu_r * t.bb_r * (2 * b + 8), E * (8 + b)))
    epi = t.bu_g * t.bb_g * (44 + b)
    if products:
        out.append(Phase("gates", t.n_g(B, H), 4 * t.bu_g, t.bb_g, H,
                         (4 * t.bu_g + t.bb_g) * H * b + 32 * t.bu_g * t.bb_g + epi, 4 * W + E * (44 + b),
                         _wg(4 * t.bu_g, b, cc)))  # fmt: skip
    else:
        out.append(Phase("gates", t.n_g(B, H), 0, t.bb_g, 0, 4 * b * t.bu_g * t.bb_g + epi, E * (44 + b)))
    return out


def backward_phases(t, B: int, H: int, nbytes: int, streamed: bool, products: bool = True, cc: int = 90):
    """The backward's phases per time step with tiles `t`. dh's epilogue reads dy, the 4 gates, tanh c, c_{t-1}
    and the dc carry (fp32) and writes dG (4 values) and the carry; dm's reads r and pm (fp32) and writes d(pm)
    and d(r). The carry stays in L2 (one (B, H) buffer), as do the split's slices."""
    b, E, W = nbytes, B * H, H * H * nbytes if streamed else 0
    epi_h, hbm_h = 36 + 4 * b, E * (28 + 4 * b)
    out = []
    if t.split_h > 1:
        k = _slice_k(H, t.split_h, t.bk)
        out.append(_slices("dh slices", t.n_hk(B, H), t.bu_hk, t.bb_hk, k, b, W, cc))
        out.append(
            Phase("dh sum", t.n_h(B, H), 0, t.bb_h, 0, t.bu_h * t.bb_h * (4 * t.split_h + epi_h), hbm_h)
        )
    elif products:
        out.append(Phase("dh", t.n_h(B, H), t.bu_h, t.bb_h, H,
                         (t.bu_h + t.bb_h) * H * b + t.bu_h * t.bb_h * (8 + epi_h), W + hbm_h,
                         _wg(t.bu_h, b, cc)))  # fmt: skip
    else:
        out.append(Phase("dh", t.n_h(B, H), 0, t.bb_h, 0, t.bu_h * t.bb_h * (b + epi_h), hbm_h))
    epi_m, hbm_m = 8 + 2 * b, E * (8 + 2 * b)
    if t.split > 1:
        k = _slice_k(4 * H, t.split, t.bk)
        out.append(Phase("dm slices", t.n_m(B, H), t.bu_m, t.bb_m, k,
                         (t.bu_m + t.bb_m) * k * b + t.bu_m * t.bb_m * 4, 4 * W, _wg(t.bu_m, b, cc)))  # fmt: skip
        out.append(Phase("dm sum", t.n_h(B, H), 0, t.bb_h, 0, t.bu_h * t.bb_h * (4 * t.split + epi_m), hbm_m))
    elif products:
        out.append(Phase("dm", t.n_m(B, H), t.bu_m, t.bb_m, 4 * H,
                         (t.bu_m + t.bb_m) * 4 * H * b + t.bu_m * t.bb_m * epi_m, 4 * W + hbm_m,
                         _wg(t.bu_m, b, cc)))  # fmt: skip
    else:
        out.append(Phase("dm", t.n_m(B, H), 0, t.bb_m, 0, t.bu_m * t.bb_m * (b + epi_m), hbm_m))
    return out
