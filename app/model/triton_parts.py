"""The pieces the GPU core's kernels (app/model/triton_kernels.py) are built from: the activations, a product of
two sets of rows over K, a tile's batch rows and units, and a product split over K (each slice on a tile of
its own, the slices summed in a fixed order). Interpreter notes as in triton_kernels.py: tanh is written with
exp; every load is masked."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _tanh(x):
    e = tl.exp(-2.0 * tl.abs(x))  # in (0, 1]: no overflow for any x
    t = (1.0 - e) / (1.0 + e)
    return tl.where(x < 0, -t, t)


@triton.jit
def _sigmoid(x):
    return 1.0 / (1.0 + tl.exp(-x))


@triton.jit
def _rows_dot(acc, a_ptr, a_off, a_ok, b_ptr, b_off, b_ok, K,
              BK: tl.constexpr, UPCAST: tl.constexpr, ACC: tl.constexpr, PREC: tl.constexpr,
              CACHE: tl.constexpr):  # fmt: skip
    """acc[m, n] += sum_k a_ptr[a_off[m] + k] * b_ptr[b_off[n] + k]: two sets of rows, contiguous along K.
    The A side (weights) is read through L1; the B side (state another program may have written) with CACHE."""
    rk = tl.arange(0, BK)
    for k0 in range(0, K, BK):
        kk = k0 + rk
        kin = kk < K
        a = tl.load(a_ptr + a_off[:, None] + kk[None, :], mask=a_ok[:, None] & kin[None, :], other=0.0)
        b = tl.load(
            b_ptr + b_off[None, :] + kk[:, None], mask=kin[:, None] & b_ok[None, :], other=0.0,
            cache_modifier=CACHE,
        )  # fmt: skip
        if UPCAST:
            a = a.to(ACC)
            b = b.to(ACC)
        acc += tl.dot(a, b, input_precision=PREC, out_dtype=ACC)
    return acc


@triton.jit
def _through(scratch, off, acc, mask):
    """A product's accumulator out to `scratch` (this program's own tile of it, fp32) for its epilogue to read
    back in the loads' layout. Done in registers, the epilogue ran in the tensor cores' layout, converting each
    of its ~12 loads and stores through shared memory and holding ~16 registers an element: a (64, 128) tile
    spilled at 255. Through L1/L2 it is one store and one load, and no spill."""
    tl.store(scratch + off, acc, mask=mask)
    tl.debug_barrier()  # the CTA's stores are visible to all its threads before any reads them back


@triton.jit
def _z(ptr, mask, ACC: tl.constexpr):
    return tl.load(ptr, mask=mask, other=0.0).to(ACC)


@triton.jit
def _tile(tile, B, H, BB: tl.constexpr, BU: tl.constexpr):
    """A tile's batch rows (BB,) and units (BU,), with their masks; tiles sharing units are adjacent."""
    nb = tl.cdiv(B, BB)
    rb = (tile % nb) * BB + tl.arange(0, BB)
    ru = (tile // nb) * BU + tl.arange(0, BU)
    return rb, ru, rb < B, ru < H


@triton.jit
def _gate_rows(ru, H, BU: tl.constexpr):
    """W_m's rows for the four gates of units ru: row j = g * BU + u of the tile is g * H + ru[u]."""
    j = tl.arange(0, 4 * BU)
    return (j // BU) * H + tl.reshape(tl.broadcast_to(ru[None, :], (4, BU)), (4 * BU,))


# ---- split over K


@triton.jit
def _part_tile(tile, a_ptr, a_row, b_ptr, b_row, K, part, B, H,
               BB: tl.constexpr, BU: tl.constexpr, BK: tl.constexpr, SPLIT: tl.constexpr,
               UPCAST: tl.constexpr, ACC: tl.constexpr, PREC: tl.constexpr, CACHE: tl.constexpr):  # fmt: skip
    """Slice s = tile % SPLIT of a (units, batch) product over K, into part[s] (SPLIT, B, H): rows ru * a_row of
    the weights `a_ptr` against rows rb * b_row of the state `b_ptr`, k in [s KS, (s + 1) KS). The SPLIT slices
    of one output tile are adjacent tiles. The last slices may be short, or empty (their part is zeros)."""
    s = tile % SPLIT
    rb, ru, bok, uok = _tile(tile // SPLIT, B, H, BB, BU)
    ks = tl.cdiv(tl.cdiv(K, SPLIT), BK) * BK
    k0 = s * ks
    klen = tl.minimum(ks, K - k0)
    acc = tl.zeros((BU, BB), dtype=ACC)
    acc = _rows_dot(acc, a_ptr + k0, ru * a_row, uok, b_ptr + k0, rb * b_row, bok, klen, BK, UPCAST, ACC, PREC,
                    CACHE)  # fmt: skip
    off = s * B * H + rb[None, :] * H + ru[:, None]
    tl.store(part + off, acc.to(part.dtype.element_ty), mask=uok[:, None] & bok[None, :])


@triton.jit
def _slices(part, off, mask, B, H, BB: tl.constexpr, BU: tl.constexpr, SPLIT: tl.constexpr,
            ACC: tl.constexpr, CACHE: tl.constexpr):  # fmt: skip
    """The SPLIT K slices of a (units, batch) tile's product summed in a fixed order (no atomics)."""
    acc = tl.zeros((BU, BB), dtype=ACC)
    for s in tl.static_range(SPLIT):
        acc += tl.load(part + s * B * H + off, mask=mask, other=0.0, cache_modifier=CACHE).to(ACC)
    return acc
