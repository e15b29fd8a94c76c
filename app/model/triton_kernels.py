"""The Triton kernels of the GPU mLSTM core (app/model/gpu_loops.py drives them, triton_core.py holds the op).

Two kernels, one per direction, each made of two PHASES per time step; a phase is a loop over output tiles,
and a tile is a small product with the step's elementwise work in its epilogue:

    forward   phase 1  r = W_mh h_{t-1}          epilogue: keep r, m_t = pm_t * r
              phase 2  z = W_m m_t (4 gates)     epilogue: + (W_x x_t + b), gates, c_t, tanh c_t, h_t
    backward  phase 1  dh = W_mh^T d(r_{t+1})    epilogue: + dy_t, then step t's gate and cell derivatives:
                                                 dG_t, and the dc carry to c_{t-1}
              phase 2  dm = W_m^T dG_t (K = 4H)  epilogue: d(pm_t) = dm * r_t, d(r_t) = dm * pm_t
    Split over K (SPLIT_R, SPLIT_H, SPLIT > 1): a phase's product is cut into K slices, each written to `part`
    by a program of its own on a large tile (the weights and the state each read once per slice, not once per
    unit tile or batch tile), and a phase of small tiles sums the slices in a fixed order (deterministic: no
    atomics) and runs the epilogue: r's slices before phase 1 (R_PART_PHASE), dh's before the backward's
    phase 1 (DH_PART_PHASE), dm's in phase 2 itself, summed by phase 3 (SUM_PHASE).

Every phase-2 tile of the forward (phase-1 of the backward) owns all FOUR gates of its units (W_m's rows
g*H + unit, g = i, f, o, u: the gate-interleaved slice, gathered in place), so the cell math needs nothing
from another tile and the dc carry is read and written by its owner only: two synchronisations per step.
Those two phases hand their product to the epilogue through a scratch buffer (`_through`: the tile's own
part, fp32, stored and read back by the same program): the epilogue then runs in the loads' layout, with one
store and one load instead of a layout conversion per load and store, and (64, 128) tiles need no spill.

Operands are swapped against the usual (batch x K) @ (K x units): a tile computes (units x batch) =
(weight rows) @ (state)^T, so the weight rows are the product's M side. Hopper's warpgroup MMA needs
M % 64 == 0: with the batch as M, a batch of 16 or 32 rows could not use it; 4 gates x 16 units can.

One kernel body, three ways to run it (constexprs). PHASES is a set of the named phases below (bits):
    one phase, SYNC off       one phase of one step per launch, a program per tile (the step loop; and
                              the interpreter, which runs programs one after another and cannot wait)
    every phase, SYNC on      the persistent loop: every step of the sequence in one launch, a grid no
                              larger than the SM count (a cooperative launch), each program looping over
                              its tiles, a grid barrier between phases
    USE_DOT off               the product is read from `prod` (cuBLAS computed it): the phase is then only
                              its epilogue (the cuBLAS loop)
A pointer a launch does not use (`prod_*` where the kernel computes the product, `bar` without SYNC, `part`
without a split) is passed as None: the kernels take their arguments by keyword (gpu_loops.py).

Only H is specialised on (its divisibility by 16 keeps the loads vectorised); the batch size appears only
multiplied by H, so a micro-batch with another row count reuses the compiled kernels.

The grid barrier is an epoch counter: each program adds 1 (release) and waits (acquire) until the counter
reaches (epoch + 1) * programs, polling the counter alone (the failure flag is read once per FLAG_EVERY
polls). The wait is bounded (MAX_SPIN polls): a program that never sees the others sets the failure flag and
every later barrier returns at once (as does every barrier of a launch that finds the flag already set). After
its last step each program reads the flag, and where it is set, POISONS every output tile it owns, at every
step of the launch, with NaN (`_poison_fwd` / `_poison_bwd`): whatever ran with a broken barrier never leaves
the kernel as a finite number. The flag stays set (it is the loop's health flag, app/model/gpu_health.py): the
host reads it where it already waits (the training step's loss, an inference batch's result), never after the
launch. Data another program wrote in this launch is read with cache_modifier ".cg" (L2, not the SM's own
L1).

Operands are the compute dtype (bf16/fp16/fp32, fp64 for tests); accumulation, gates and cell state are
ACC (fp32, or fp64 with fp64 operands). Interpreter notes (TRITON_INTERPRET=1, the CPU tests): UPCAST
converts 16-bit operands to ACC after loading (the interpreter's bf16 arithmetic is wrong; the values are
the same); tanh is written with exp (no libdevice there). Every load is masked.
"""

from __future__ import annotations

import triton
import triton.language as tl

from app.model.triton_parts import (
    _gate_rows,
    _part_tile,
    _rows_dot,
    _sigmoid,
    _slices,
    _tanh,
    _through,
    _tile,
    _z,
)

# The phases (PHASES is a sum of these; the persistent loop runs them all, a grid barrier after each)
R_PHASE = tl.constexpr(1)  # forward: r = W_mh h_{t-1} (or the sum of its K slices), m = pm * r
GATES_PHASE = tl.constexpr(2)  # forward: z = W_m m, gates, c, h
R_PART_PHASE = tl.constexpr(4)  # forward, split over K only: r's K slices, before R_PHASE
DH_PHASE = tl.constexpr(1)  # backward: dh = dy + W_mh^T d(r_{t+1}) (or its slices summed), dG, the dc carry
DM_PHASE = tl.constexpr(2)  # backward: dm = W_m^T dG (K = 4H), or its K slices under a split
SUM_PHASE = tl.constexpr(4)  # backward, split over K only: the slices summed, dm's epilogue
DH_PART_PHASE = tl.constexpr(8)  # backward, split over K only: dh's K slices, before DH_PHASE
# in the order they run within a step (a phase whose split is 1 is not run)
FWD_PHASES = (int(R_PART_PHASE.value), int(R_PHASE.value), int(GATES_PHASE.value))
BWD_PHASES = (int(DH_PART_PHASE.value), int(DH_PHASE.value), int(DM_PHASE.value), int(SUM_PHASE.value))
FLAG_EVERY = tl.constexpr(256)  # barrier polls between reads of the failure flag
QUIET_NAN = tl.constexpr(0x7FC00000)  # float32's quiet NaN, as bits: what a tile of a poisoned launch holds


# ---- forward


@triton.jit
def _fwd_r_tile(tile, t, hs, w_mh, pm, rs, ms, prod, part, B, H,
                BB: tl.constexpr, BU: tl.constexpr, BK: tl.constexpr, SPLIT: tl.constexpr, USE_DOT: tl.constexpr,
                UPCAST: tl.constexpr, ACC: tl.constexpr, PREC: tl.constexpr, CACHE: tl.constexpr):  # fmt: skip
    """r_t = W_mh h_{t-1} (hs row t holds h_{t-1}) for a (units, batch) tile, or (SPLIT > 1) the sum of its K
    slices R_PART_PHASE wrote; m_t = pm_t * r_t."""
    rb, ru, bok, uok = _tile(tile, B, H, BB, BU)
    mask = uok[:, None] & bok[None, :]
    off = rb[None, :] * H + ru[:, None]  # (BU, BB) within one step's (B, H)
    if SPLIT > 1:
        acc = _slices(part, off, mask, B, H, BB, BU, SPLIT, ACC, CACHE)
    elif USE_DOT:
        acc = tl.zeros((BU, BB), dtype=ACC)
        acc = _rows_dot(acc, w_mh, ru * H, uok, hs + t * B * H, rb * H, bok, H, BK, UPCAST, ACC, PREC, CACHE)
    else:
        acc = tl.load(prod + off, mask=mask, other=0.0).to(ACC)
    p = tl.load(pm + t * B * H + off, mask=mask, other=0.0).to(ACC)
    tl.store(rs + t * B * H + off, acc.to(rs.dtype.element_ty), mask=mask)
    tl.store(ms + t * B * H + off, (p * acc).to(ms.dtype.element_ty), mask=mask)


@triton.jit
def _fwd_gates_tile(tile, t, ms, w_m, pg, gates, cs, tcs, hs, prod, B, H,
                    BB: tl.constexpr, BU: tl.constexpr, EB: tl.constexpr, BK: tl.constexpr,
                    USE_DOT: tl.constexpr, UPCAST: tl.constexpr, ACC: tl.constexpr, PREC: tl.constexpr,
                    CACHE: tl.constexpr):  # fmt: skip
    """The four gates of a tile's units: pre = pg_t + W_m m_t; gates [si, sf, so, tu], c_t, tanh c_t, h_t.
    pg (T, B, 4H): [i, f, o, u] pre-activations W_x x_t + b; gates (T, B, 4H) in the same order. The epilogue
    runs on EB batch rows at a time (the product is in memory: a (4 x 32, 128) tile's epilogue in one piece
    held 16 registers a thread for each of its ~10 tensors, and beside the persistent loop's other phases
    spilled under Triton 3.9)."""
    rb, ru, bok, uok = _tile(tile, B, H, BB, BU)
    if USE_DOT:
        rows = _gate_rows(ru, H, BU)  # (4 BU,) W_m rows = columns of the step's (B, 4H) pre-activations
        rok = tl.reshape(tl.broadcast_to(uok[None, :], (4, BU)), (4 * BU,))
        acc = tl.zeros((4 * BU, BB), dtype=ACC)
        acc = _rows_dot(acc, w_m, rows * H, rok, ms + t * B * H, rb * H, bok, H, BK, UPCAST, ACC, PREC, CACHE)
        _through(prod, rb[None, :] * 4 * H + rows[:, None], acc, rok[:, None] & bok[None, :])
    # the step's z = m_t W_m^T (B, 4H) is in prod (this tile's product, or cuBLAS's)
    row0 = (tile % tl.cdiv(B, BB)) * BB
    for c in tl.static_range(BB // EB):
        rows_c = row0 + c * EB + tl.arange(0, EB)
        _gates_epilogue(t, rows_c, ru, rows_c < B, uok, pg, gates, cs, tcs, hs, prod, B, H, ACC, CACHE)


@triton.jit
def _gates_epilogue(t, rb, ru, bok, uok, pg, gates, cs, tcs, hs, prod, B, H, ACC: tl.constexpr,
                    CACHE: tl.constexpr):  # fmt: skip
    """The gate and cell math of units ru, batch rows rb, from the product in prod."""
    mask = uok[:, None] & bok[None, :]
    g = rb[None, :] * (4 * H) + ru[:, None]  # (BU, EB): gate i of (b, u); + g H for the others
    pgt = pg + t * B * 4 * H + g
    z = prod + g
    si = _sigmoid(_z(z, mask, ACC) + tl.load(pgt, mask=mask, other=0.0).to(ACC))
    sf = _sigmoid(_z(z + H, mask, ACC) + tl.load(pgt + H, mask=mask, other=0.0).to(ACC))
    so = _sigmoid(_z(z + 2 * H, mask, ACC) + tl.load(pgt + 2 * H, mask=mask, other=0.0).to(ACC))
    tu = _tanh(_z(z + 3 * H, mask, ACC) + tl.load(pgt + 3 * H, mask=mask, other=0.0).to(ACC))
    off = rb[None, :] * H + ru[:, None]
    c = sf * tl.load(cs + t * B * H + off, mask=mask, other=0.0, cache_modifier=CACHE).to(ACC) + si * tu
    tc = _tanh(c)
    gt = gates + t * B * 4 * H + g
    ty = gates.dtype.element_ty
    tl.store(gt, si.to(ty), mask=mask)
    tl.store(gt + H, sf.to(ty), mask=mask)
    tl.store(gt + 2 * H, so.to(ty), mask=mask)
    tl.store(gt + 3 * H, tu.to(ty), mask=mask)
    tl.store(cs + (t + 1) * B * H + off, c.to(cs.dtype.element_ty), mask=mask)
    tl.store(tcs + t * B * H + off, tc.to(tcs.dtype.element_ty), mask=mask)
    tl.store(hs + (t + 1) * B * H + off, (so * tc).to(hs.dtype.element_ty), mask=mask)


@triton.jit
def _grid_sync(bar, epoch, nprog, MAX_SPIN: tl.constexpr):
    """Wait until every program has arrived here for the epoch-th time; returns epoch + 1. bar: int32
    [arrivals, failed]. A wait past MAX_SPIN polls (or one a failed program already gave up) sets failed.
    Only the counter is polled; the flag every FLAG_EVERY polls (half the atomics of reading both)."""
    tl.debug_barrier()  # this program's stores are issued before its arrival is published
    tl.atomic_add(bar, 1, sem="release", scope="gpu")
    target = (epoch + 1) * nprog
    seen = tl.atomic_add(bar, 0, sem="acquire", scope="gpu")
    failed = tl.atomic_add(bar + 1, 0, sem="relaxed", scope="gpu")
    spins = 0
    while (seen < target) & (failed == 0) & (spins < MAX_SPIN):
        seen = tl.atomic_add(bar, 0, sem="acquire", scope="gpu")
        spins += 1
        if spins % FLAG_EVERY == 0:
            failed = tl.atomic_add(bar + 1, 0, sem="relaxed", scope="gpu")
    if (seen < target) & (failed == 0):
        tl.atomic_xchg(bar + 1, 1, sem="release", scope="gpu")
    tl.debug_barrier()
    return epoch + 1


@triton.jit
def _gave_up(bar):
    """Whether this launch's barrier gave up (read after the last barrier: any program's give-up is seen)."""
    return tl.atomic_add(bar + 1, 0, sem="acquire", scope="gpu") != 0


@triton.jit
def _nan_tile(ptr, rb, ru, bok, uok, row, BB: tl.constexpr, BU: tl.constexpr):
    """NaN into a (units, batch) tile of `ptr` whose rows (batch) are `row` elements apart."""
    nan = tl.full((BU, BB), QUIET_NAN, tl.int32).to(tl.float32, bitcast=True).to(ptr.dtype.element_ty)
    tl.store(ptr + rb[None, :] * row + ru[:, None], nan, mask=uok[:, None] & bok[None, :])


@triton.jit
def _poison_fwd(pid, nprog, t0, t1, rs, ms, gates, cs, tcs, hs, B, H,
                BB_R: tl.constexpr, BU_R: tl.constexpr, BB_G: tl.constexpr, BU_G: tl.constexpr):  # fmt: skip
    """NaN in every forward output this program owns, steps t0 .. t1-1: its r tiles' r and m, its gate tiles'
    four gates, c, tanh c and h (the state rows t+1; row 0, the initial state, is an input)."""
    n_r = tl.cdiv(B, BB_R) * tl.cdiv(H, BU_R)
    n_g = tl.cdiv(B, BB_G) * tl.cdiv(H, BU_G)
    for t in range(t0, t1):
        for tile in range(pid, n_r, nprog):
            rb, ru, bok, uok = _tile(tile, B, H, BB_R, BU_R)
            _nan_tile(rs + t * B * H, rb, ru, bok, uok, H, BB_R, BU_R)
            _nan_tile(ms + t * B * H, rb, ru, bok, uok, H, BB_R, BU_R)
        for tile in range(pid, n_g, nprog):
            rb, ru, bok, uok = _tile(tile, B, H, BB_G, BU_G)
            for g in tl.static_range(4):
                _nan_tile(gates + t * B * 4 * H + g * H, rb, ru, bok, uok, 4 * H, BB_G, BU_G)
            _nan_tile(cs + (t + 1) * B * H, rb, ru, bok, uok, H, BB_G, BU_G)
            _nan_tile(tcs + t * B * H, rb, ru, bok, uok, H, BB_G, BU_G)
            _nan_tile(hs + (t + 1) * B * H, rb, ru, bok, uok, H, BB_G, BU_G)


@triton.jit(do_not_specialize=["t0", "t1", "B"])
def mlstm_fwd(hs, cs, w_mh, w_m, pm, pg, rs, ms, gates, tcs, prod_r, prod_g, part, bar, t0, t1, B, H,
              PHASES: tl.constexpr, SYNC: tl.constexpr, USE_DOT: tl.constexpr,
              BB_R: tl.constexpr, BU_R: tl.constexpr, BB_G: tl.constexpr, BU_G: tl.constexpr,
              BB_RK: tl.constexpr, BU_RK: tl.constexpr, SPLIT_R: tl.constexpr, EB_G: tl.constexpr,
              BK: tl.constexpr, UPCAST: tl.constexpr, ACC: tl.constexpr, PREC: tl.constexpr,
              CACHE: tl.constexpr, MAX_SPIN: tl.constexpr):  # fmt: skip
    """Steps t0 .. t1-1 of the forward. Buffers: hs (T+1, B, H) h_0..h_T; cs (T+1, B, H) c_0..c_T; pm
    (T, B, H) W_mx x_t; pg (T, B, 4H) W_x x_t + b; out rs, ms (T, B, H), gates (T, B, 4H), tcs (T, B, H).
    SPLIT_R > 1: r's K slices on (BU_RK, BB_RK) tiles into part (SPLIT_R, B, H) fp32, summed by phase 1. EB_G:
    the gate epilogue's batch rows at a time (a divisor of BB_G)."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    n_r = tl.cdiv(B, BB_R) * tl.cdiv(H, BU_R)
    n_g = tl.cdiv(B, BB_G) * tl.cdiv(H, BU_G)
    n_rk = tl.cdiv(B, BB_RK) * tl.cdiv(H, BU_RK) * SPLIT_R
    epoch = 0
    for t in range(t0, t1):
        if SPLIT_R > 1:
            if R_PART_PHASE & PHASES:
                for tile in range(pid, n_rk, nprog):
                    _part_tile(tile, w_mh, H, hs + t * B * H, H, H, part, B, H, BB_RK, BU_RK, BK, SPLIT_R,
                               UPCAST, ACC, PREC, CACHE)  # fmt: skip
            if SYNC:
                epoch = _grid_sync(bar, epoch, nprog, MAX_SPIN)
        if R_PHASE & PHASES:
            for tile in range(pid, n_r, nprog):
                _fwd_r_tile(tile, t, hs, w_mh, pm, rs, ms, prod_r, part, B, H, BB_R, BU_R, BK, SPLIT_R, USE_DOT,
                            UPCAST, ACC, PREC, CACHE)  # fmt: skip
        if SYNC:
            epoch = _grid_sync(bar, epoch, nprog, MAX_SPIN)
        if GATES_PHASE & PHASES:
            for tile in range(pid, n_g, nprog):
                _fwd_gates_tile(tile, t, ms, w_m, pg, gates, cs, tcs, hs, prod_g, B, H, BB_G, BU_G, EB_G, BK,
                                USE_DOT, UPCAST, ACC, PREC, CACHE)  # fmt: skip
        if SYNC:
            epoch = _grid_sync(bar, epoch, nprog, MAX_SPIN)
    if SYNC:  # noqa: SIM102 (nested: without SYNC `bar` is None, and Triton's `and` does not short-circuit)
        if _gave_up(bar):
            _poison_fwd(pid, nprog, t0, t1, rs, ms, gates, cs, tcs, hs, B, H, BB_R, BU_R, BB_G, BU_G)


# ---- backward


@triton.jit
def _bwd_h_tile(tile, t, WITH_DOT, dr, w_mh_t, dy, gates, cs, tcs, dc, dp, prod, part, B, H,
                BB: tl.constexpr, BU: tl.constexpr, EB: tl.constexpr, BK: tl.constexpr, SPLIT: tl.constexpr,
                USE_DOT: tl.constexpr, UPCAST: tl.constexpr, ACC: tl.constexpr, PREC: tl.constexpr,
                CACHE: tl.constexpr):  # fmt: skip
    """dh_t = dy_t + W_mh^T d(r_{t+1}) (no product at t = T-1; SPLIT > 1: the sum of its K slices
    DH_PART_PHASE wrote), then step t's gate derivatives, EB batch rows at a time (the product is in memory: a
    (64, 128) tile's epilogue in one piece, beside the persistent loop's other phases, spilled under Triton
    3.9). w_mh_t: W_mh^T, contiguous (its rows are W_mh's columns)."""
    rb, ru, bok, uok = _tile(tile, B, H, BB, BU)
    if SPLIT == 1:  # noqa: SIM102  (a constexpr branch, apart: compiled away, never tested at run time)
        if WITH_DOT and USE_DOT:
            acc = tl.zeros((BU, BB), dtype=ACC)
            acc = _rows_dot(
                acc, w_mh_t, ru * H, uok, dr + (t + 1) * B * H, rb * H, bok, H, BK, UPCAST, ACC, PREC, CACHE
            )
            _through(prod, rb[None, :] * H + ru[:, None], acc, uok[:, None] & bok[None, :])
    row0 = (tile % tl.cdiv(B, BB)) * BB
    for c in tl.static_range(BB // EB):
        rows_c = row0 + c * EB + tl.arange(0, EB)
        _bwd_h_epilogue(t, WITH_DOT, rows_c, ru, rows_c < B, uok, dy, gates, cs, tcs, dc, dp, prod, part, B, H,
                        EB, BU, SPLIT, ACC, CACHE)  # fmt: skip


@triton.jit
def _bwd_h_epilogue(t, WITH_DOT, rb, ru, bok, uok, dy, gates, cs, tcs, dc, dp, prod, part, B, H,
                    BB: tl.constexpr, BU: tl.constexpr, SPLIT: tl.constexpr, ACC: tl.constexpr,
                    CACHE: tl.constexpr):  # fmt: skip
    """dh = dy_t + the product (in prod, this tile's or cuBLAS's, or in its K slices), then step t's gate
    derivatives: dc += dh so (1 - tc^2); dG_t = [dc tu si', dc c_{t-1} sf', dh tc so', dc si tu'] into
    dP[..., H:]; the carry dc * sf_t is left in dc (B, H) for step t-1."""
    mask = uok[:, None] & bok[None, :]
    off = rb[None, :] * H + ru[:, None]  # (BU, BB)
    dh = tl.load(dy + t * B * H + off, mask=mask, other=0.0).to(ACC)
    if WITH_DOT:  # d(r_{t+1}) W_mh (B, H) is in prod (this tile's product, or cuBLAS's), or in its slices
        if SPLIT > 1:
            dh += _slices(part, off, mask, B, H, BB, BU, SPLIT, ACC, CACHE)
        else:
            dh += tl.load(prod + off, mask=mask, other=0.0).to(ACC)
    # each gate's derivative is stored as soon as its operands are in: a (64 units, 128 rows) tile keeps at
    # most four (BU, BB) fp32 tensors live beside the accumulator, not ten (their spill was 1.6 KB at B256)
    g = gates + t * B * 4 * H + rb[None, :] * (4 * H) + ru[:, None]
    d = dp + t * B * 5 * H + rb[None, :] * (5 * H) + H + ru[:, None]
    ty = dp.dtype.element_ty
    so = tl.load(g + 2 * H, mask=mask, other=0.0).to(ACC)
    tc = tl.load(tcs + t * B * H + off, mask=mask, other=0.0).to(ACC)
    tl.store(d + 2 * H, (dh * tc * so * (1.0 - so)).to(ty), mask=mask)
    dcv = tl.load(dc + off, mask=mask, other=0.0, cache_modifier=CACHE).to(ACC) + dh * so * (1.0 - tc * tc)
    si = tl.load(g, mask=mask, other=0.0).to(ACC)
    tu = tl.load(g + 3 * H, mask=mask, other=0.0).to(ACC)
    tl.store(d, (dcv * tu * si * (1.0 - si)).to(ty), mask=mask)
    tl.store(d + 3 * H, (dcv * si * (1.0 - tu * tu)).to(ty), mask=mask)
    sf = tl.load(g + H, mask=mask, other=0.0).to(ACC)
    c_prev = tl.load(cs + t * B * H + off, mask=mask, other=0.0).to(ACC)
    tl.store(d + H, (dcv * c_prev * sf * (1.0 - sf)).to(ty), mask=mask)
    tl.store(dc + off, (dcv * sf).to(dc.dtype.element_ty), mask=mask)


@triton.jit
def _bwd_m_epilogue(acc, t, dp, rs, pm, dr, rb, ru, bok, uok, B, H, ACC: tl.constexpr):
    """d(pm_t) = dm * r_t into dP[..., :H], d(r_t) = dm * pm_t, for a (units, batch) tile of dm."""
    mask = uok[:, None] & bok[None, :]
    off = rb[None, :] * H + ru[:, None]
    r = tl.load(rs + t * B * H + off, mask=mask, other=0.0).to(ACC)
    p = tl.load(pm + t * B * H + off, mask=mask, other=0.0).to(ACC)
    row = dp + t * B * 5 * H
    tl.store(row + rb[None, :] * (5 * H) + ru[:, None], (acc * r).to(dp.dtype.element_ty), mask=mask)
    tl.store(dr + t * B * H + off, (acc * p).to(dr.dtype.element_ty), mask=mask)


@triton.jit
def _bwd_m_tile(tile, t, dp, w_m_t, rs, pm, dr, prod, B, H,
                BB: tl.constexpr, BU: tl.constexpr, BK: tl.constexpr, USE_DOT: tl.constexpr,
                UPCAST: tl.constexpr, ACC: tl.constexpr, PREC: tl.constexpr, CACHE: tl.constexpr):  # fmt: skip
    """dm = W_m^T dG_t (K = 4H), then its epilogue. w_m_t: W_m^T (H, 4H), contiguous. dP (T, B, 5H):
    [d(pm) | dG] per row, w_in's row order (one product gives d(w_in))."""
    rb, ru, bok, uok = _tile(tile, B, H, BB, BU)
    if USE_DOT:
        acc = tl.zeros((BU, BB), dtype=ACC)
        acc = _rows_dot(acc, w_m_t, ru * 4 * H, uok, dp + t * B * 5 * H + H, rb * 5 * H, bok, 4 * H, BK,
                        UPCAST, ACC, PREC, CACHE)  # fmt: skip
    else:  # cuBLAS wrote dG_t W_m (B, H)
        acc = tl.load(prod + rb[None, :] * H + ru[:, None], mask=uok[:, None] & bok[None, :], other=0.0)
        acc = acc.to(ACC)
    _bwd_m_epilogue(acc, t, dp, rs, pm, dr, rb, ru, bok, uok, B, H, ACC)


@triton.jit
def _bwd_m_sum(tile, t, part, dp, rs, pm, dr, B, H,
               BB: tl.constexpr, BU: tl.constexpr, SPLIT: tl.constexpr, ACC: tl.constexpr,
               CACHE: tl.constexpr):  # fmt: skip
    """dm = the SPLIT slices summed in a fixed order (deterministic: no atomics), then its epilogue."""
    rb, ru, bok, uok = _tile(tile, B, H, BB, BU)
    mask = uok[:, None] & bok[None, :]
    off = rb[None, :] * H + ru[:, None]
    acc = _slices(part, off, mask, B, H, BB, BU, SPLIT, ACC, CACHE)
    _bwd_m_epilogue(acc, t, dp, rs, pm, dr, rb, ru, bok, uok, B, H, ACC)


@triton.jit
def _poison_bwd(pid, nprog, t0, t1, dp, dr, B, H,
                BB_H: tl.constexpr, BU_H: tl.constexpr, BB_M: tl.constexpr, BU_M: tl.constexpr,
                SPLIT: tl.constexpr):  # fmt: skip
    """NaN in every backward output this program owns, steps t0 .. t1-1: its first-phase tiles' dG (dP[..., H:]);
    d(pm) (dP[..., :H]) and d(r) of its K = 4H phase's tiles, or under a split of its sum phase's (the first
    phase's tiles), which write them."""
    n_h = tl.cdiv(B, BB_H) * tl.cdiv(H, BU_H)
    n_m = tl.cdiv(B, BB_M) * tl.cdiv(H, BU_M)
    for t in range(t0, t1):
        for tile in range(pid, n_h, nprog):
            rb, ru, bok, uok = _tile(tile, B, H, BB_H, BU_H)
            for g in tl.static_range(4):
                _nan_tile(dp + t * B * 5 * H + (g + 1) * H, rb, ru, bok, uok, 5 * H, BB_H, BU_H)
            if SPLIT > 1:
                _nan_tile(dp + t * B * 5 * H, rb, ru, bok, uok, 5 * H, BB_H, BU_H)
                _nan_tile(dr + t * B * H, rb, ru, bok, uok, H, BB_H, BU_H)
        if SPLIT == 1:
            for tile in range(pid, n_m, nprog):
                rb, ru, bok, uok = _tile(tile, B, H, BB_M, BU_M)
                _nan_tile(dp + t * B * 5 * H, rb, ru, bok, uok, 5 * H, BB_M, BU_M)
                _nan_tile(dr + t * B * H, rb, ru, bok, uok, H, BB_M, BU_M)


@triton.jit(do_not_specialize=["t0", "t1", "T", "B"])
def mlstm_bwd(dr, w_mh_t, w_m_t, dy, gates, cs, tcs, dc, dp, rs, pm, prod_h, prod_m, part, bar, t0, t1, T, B, H,
              PHASES: tl.constexpr, SYNC: tl.constexpr, USE_DOT: tl.constexpr,
              BB_H: tl.constexpr, BU_H: tl.constexpr, BB_M: tl.constexpr, BU_M: tl.constexpr,
              SPLIT: tl.constexpr, BB_HK: tl.constexpr, BU_HK: tl.constexpr, SPLIT_H: tl.constexpr, EB_H: tl.constexpr,
              BK: tl.constexpr, UPCAST: tl.constexpr, ACC: tl.constexpr,
              PREC: tl.constexpr, CACHE: tl.constexpr, MAX_SPIN: tl.constexpr):  # fmt: skip
    """Steps t1-1 down to t0 of the backward (T: the sequence length; step T-1 has no d(r_{t+1})).
    dc (B, H) must be zero before step T-1. Out: dp (T, B, 5H), dr (T, B, H). SPLIT > 1: phase 2 writes the
    K slices of dm into part (SPLIT, B, H) fp32 and a third phase (tiles as phase 1's) sums them. SPLIT_H > 1:
    dh's K slices on (BU_HK, BB_HK) tiles into the same part first, summed by phase 1 (which reads them all
    before phase 2 writes there). EB_H: phase 1's epilogue's batch rows at a time (a divisor of BB_H)."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    n_h = tl.cdiv(B, BB_H) * tl.cdiv(H, BU_H)
    n_m = tl.cdiv(B, BB_M) * tl.cdiv(H, BU_M)
    n_hk = tl.cdiv(B, BB_HK) * tl.cdiv(H, BU_HK) * SPLIT_H
    epoch = 0
    for i in range(t0, t1):
        t = t1 - 1 - (i - t0)
        if SPLIT_H > 1:
            if DH_PART_PHASE & PHASES:  # noqa: SIM102  (constexpr, apart from the run-time test)
                if t < T - 1:
                    for tile in range(pid, n_hk, nprog):
                        _part_tile(tile, w_mh_t, H, dr + (t + 1) * B * H, H, H, part, B, H, BB_HK, BU_HK, BK,
                                   SPLIT_H, UPCAST, ACC, PREC, CACHE)  # fmt: skip
            if SYNC:
                epoch = _grid_sync(bar, epoch, nprog, MAX_SPIN)
        if DH_PHASE & PHASES:
            for tile in range(pid, n_h, nprog):
                _bwd_h_tile(tile, t, t < T - 1, dr, w_mh_t, dy, gates, cs, tcs, dc, dp, prod_h, part, B, H,
                            BB_H, BU_H, EB_H, BK, SPLIT_H, USE_DOT, UPCAST, ACC, PREC, CACHE)  # fmt: skip
        if SYNC:
            epoch = _grid_sync(bar, epoch, nprog, MAX_SPIN)
        if DM_PHASE & PHASES:
            if SPLIT == 1:
                for tile in range(pid, n_m, nprog):
                    _bwd_m_tile(tile, t, dp, w_m_t, rs, pm, dr, prod_m, B, H, BB_M, BU_M, BK, USE_DOT,
                                UPCAST, ACC, PREC, CACHE)  # fmt: skip
            else:
                for tile in range(pid, n_m * SPLIT, nprog):
                    _part_tile(tile, w_m_t, 4 * H, dp + t * B * 5 * H + H, 5 * H, 4 * H, part, B, H, BB_M, BU_M,
                               BK, SPLIT, UPCAST, ACC, PREC, CACHE)  # fmt: skip
        if SYNC:
            epoch = _grid_sync(bar, epoch, nprog, MAX_SPIN)
        if SPLIT > 1:
            if SUM_PHASE & PHASES:
                for tile in range(pid, n_h, nprog):
                    _bwd_m_sum(tile, t, part, dp, rs, pm, dr, B, H, BB_H, BU_H, SPLIT, ACC, CACHE)
            if SYNC:
                epoch = _grid_sync(bar, epoch, nprog, MAX_SPIN)
    if SYNC:  # noqa: SIM102 (as in mlstm_fwd)
        if _gave_up(bar):
            _poison_bwd(pid, nprog, t0, t1, dp, dr, B, H, BB_H, BU_H, BB_M, BU_M, SPLIT)
