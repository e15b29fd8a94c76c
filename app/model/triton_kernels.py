"""The per-step Triton kernels of the GPU mLSTM core (app/model/triton_core.py drives them).

Two kernels per time step each way, each a small GEMM with the step's elementwise work in its epilogue:

    forward   _fwd_r      r = h_{t-1} W_mh^T            epilogue: keep r, m_t = pm_t * r
              _fwd_gates  q = m_t W_m^T (4 gate tiles)  epilogue: + (W_x x_t + b), gates, c_t, tanh c_t, h_t
    backward  _bwd_m      dm = dG_t W_m                 epilogue: d(pm_t) = dm * r_t, d(r_t) = dm * pm_t
              _bwd_h      dh = d(r_{t+1}) W_mh + dy_t   epilogue: the gate / cell derivatives of step t:
                                                        dG_t, the dc carry to c_{t-1}

A program owns a (BM rows x BN units) tile and all FOUR gates of its units (W_m's rows g*H + unit, g = i, f,
o, u: the gate-interleaved packing, read in place), so the cell math needs nothing from another program and
the dc carry is read and written by its owner only. Operands are the compute dtype (bf16/fp16/fp32, fp64 for
tests); accumulation, gates and cell state are ACC (fp32, or fp64 with fp64 operands).

Interpreter notes (TRITON_INTERPRET=1, the CPU tests): UPCAST converts 16-bit operands to ACC right after
they are loaded (the interpreter's bf16 arithmetic is wrong; the values are the same, so the result is what
the GPU's fp32-accumulating dot gives); tanh is written with exp (no libdevice there, and no tl.tanh).
Every load is masked: out-of-bounds reads raise nothing in the interpreter.
"""

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
def _tile_dot(acc, a_ptr, a_stride, b_ptr, b_row_stride, b_col_stride, rm, rn, M, N, K,
              BK: tl.constexpr, UPCAST: tl.constexpr, ACC: tl.constexpr, PREC: tl.constexpr):  # fmt: skip
    """acc += A[rm, :K] @ B[:K, rn], A row-major with row stride a_stride, B[k, n] at
    b_ptr + k * b_row_stride + n * b_col_stride."""
    rk = tl.arange(0, BK)
    for k0 in range(0, K, BK):
        kk = k0 + rk
        a = tl.load(
            a_ptr + rm[:, None] * a_stride + kk[None, :],
            mask=(rm[:, None] < M) & (kk[None, :] < K),
            other=0.0,
        )
        b = tl.load(
            b_ptr + kk[:, None] * b_row_stride + rn[None, :] * b_col_stride,
            mask=(kk[:, None] < K) & (rn[None, :] < N),
            other=0.0,
        )
        if UPCAST:
            a = a.to(ACC)
            b = b.to(ACC)
        acc += tl.dot(a, b, input_precision=PREC, out_dtype=ACC)
    return acc


@triton.jit
def _gate_dot(a_ptr, w_m_ptr, g, rm, rn, B, H,
              BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
              UPCAST: tl.constexpr, ACC: tl.constexpr, PREC: tl.constexpr):  # fmt: skip
    """m_t W_m^T restricted to gate g's rows (g H .. g H + H) and units rn: a (BM, BN) tile in ACC."""
    acc = tl.zeros((BM, BN), dtype=ACC)
    return _tile_dot(acc, a_ptr, H, w_m_ptr + g * H * H, 1, H, rm, rn, B, H, H, BK, UPCAST, ACC, PREC)


@triton.jit
def fwd_r(h_ptr, w_mh_ptr, pm_ptr, r_ptr, m_ptr, t, B, H,
          BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
          UPCAST: tl.constexpr, ACC: tl.constexpr, PREC: tl.constexpr):  # fmt: skip
    """r_t = h_t W_mh^T (hs row t holds h_{t-1}); m_t = pm_t * r_t. Buffers (T[+1], B, H) contiguous."""
    rm = tl.program_id(0) * BM + tl.arange(0, BM)
    rn = tl.program_id(1) * BN + tl.arange(0, BN)
    acc = tl.zeros((BM, BN), dtype=ACC)
    # B operand W_mh^T: element (k, n) = W_mh[n, k]
    acc = _tile_dot(acc, h_ptr + t * B * H, H, w_mh_ptr, 1, H, rm, rn, B, H, H, BK, UPCAST, ACC, PREC)
    off = t * B * H + rm[:, None] * H + rn[None, :]
    mask = (rm[:, None] < B) & (rn[None, :] < H)
    pm = tl.load(pm_ptr + off, mask=mask, other=0.0).to(ACC)
    tl.store(r_ptr + off, acc.to(r_ptr.dtype.element_ty), mask=mask)
    tl.store(m_ptr + off, (pm * acc).to(m_ptr.dtype.element_ty), mask=mask)


@triton.jit
def fwd_gates(m_ptr, w_m_ptr, pg_ptr, gates_ptr, cs_ptr, tcs_ptr, hs_ptr, t, B, H, pg_stride,
              BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
              UPCAST: tl.constexpr, ACC: tl.constexpr, PREC: tl.constexpr):  # fmt: skip
    """pre = pg_t + m_t W_m^T for the four gates of units rn; gates [si, sf, so, tu], c_t, tanh c_t, h_t.

    pg (T, B, *) rows of pg_stride with [i, f, o, u] pre-activations (W_x x_t + b) at columns 0..4H."""
    rm = tl.program_id(0) * BM + tl.arange(0, BM)
    rn = tl.program_id(1) * BN + tl.arange(0, BN)
    a_ptr = m_ptr + t * B * H
    # W_m^T of gate g: element (k, n) = W_m[g H + n, k]
    zi = _gate_dot(a_ptr, w_m_ptr, 0, rm, rn, B, H, BM, BN, BK, UPCAST, ACC, PREC)
    zf = _gate_dot(a_ptr, w_m_ptr, 1, rm, rn, B, H, BM, BN, BK, UPCAST, ACC, PREC)
    zo = _gate_dot(a_ptr, w_m_ptr, 2, rm, rn, B, H, BM, BN, BK, UPCAST, ACC, PREC)
    zu = _gate_dot(a_ptr, w_m_ptr, 3, rm, rn, B, H, BM, BN, BK, UPCAST, ACC, PREC)
    mask = (rm[:, None] < B) & (rn[None, :] < H)
    pg = pg_ptr + t * B * pg_stride + rm[:, None] * pg_stride + rn[None, :]
    si = _sigmoid(zi + tl.load(pg, mask=mask, other=0.0).to(ACC))
    sf = _sigmoid(zf + tl.load(pg + H, mask=mask, other=0.0).to(ACC))
    so = _sigmoid(zo + tl.load(pg + 2 * H, mask=mask, other=0.0).to(ACC))
    tu = _tanh(zu + tl.load(pg + 3 * H, mask=mask, other=0.0).to(ACC))
    off = rm[:, None] * H + rn[None, :]  # within one step's (B, H)
    c_prev = tl.load(cs_ptr + t * B * H + off, mask=mask, other=0.0).to(ACC)
    c = sf * c_prev + si * tu
    tc = _tanh(c)
    g = gates_ptr + t * B * 4 * H + rm[:, None] * (4 * H) + rn[None, :]
    ty = gates_ptr.dtype.element_ty
    tl.store(g, si.to(ty), mask=mask)
    tl.store(g + H, sf.to(ty), mask=mask)
    tl.store(g + 2 * H, so.to(ty), mask=mask)
    tl.store(g + 3 * H, tu.to(ty), mask=mask)
    tl.store(cs_ptr + (t + 1) * B * H + off, c.to(cs_ptr.dtype.element_ty), mask=mask)
    tl.store(tcs_ptr + t * B * H + off, tc.to(tcs_ptr.dtype.element_ty), mask=mask)
    tl.store(hs_ptr + (t + 1) * B * H + off, (so * tc).to(hs_ptr.dtype.element_ty), mask=mask)


@triton.jit
def bwd_m(dp_ptr, w_m_ptr, rs_ptr, pm_ptr, dr_ptr, t, B, H,
          BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
          UPCAST: tl.constexpr, ACC: tl.constexpr, PREC: tl.constexpr):  # fmt: skip
    """dm = dG_t W_m (K = 4H); d(pm_t) = dm * r_t into dP[..., :H], d(r_t) = dm * pm_t.

    dP (T, B, 5H): [d(pm) | dG] per row, the layout of w_in's rows, so one product gives d(w_in)."""
    rm = tl.program_id(0) * BM + tl.arange(0, BM)
    rn = tl.program_id(1) * BN + tl.arange(0, BN)
    row = dp_ptr + t * B * 5 * H
    acc = tl.zeros((BM, BN), dtype=ACC)
    # A = dG_t (B, 4H) with row stride 5H; B operand W_m (4H, H): element (k, n) = W_m[k, n]
    acc = _tile_dot(acc, row + H, 5 * H, w_m_ptr, H, 1, rm, rn, B, H, 4 * H, BK, UPCAST, ACC, PREC)
    mask = (rm[:, None] < B) & (rn[None, :] < H)
    off = t * B * H + rm[:, None] * H + rn[None, :]
    r = tl.load(rs_ptr + off, mask=mask, other=0.0).to(ACC)
    pm = tl.load(pm_ptr + off, mask=mask, other=0.0).to(ACC)
    tl.store(row + rm[:, None] * (5 * H) + rn[None, :], (acc * r).to(dp_ptr.dtype.element_ty), mask=mask)
    tl.store(dr_ptr + off, (acc * pm).to(dr_ptr.dtype.element_ty), mask=mask)


@triton.jit
def bwd_h(dr_ptr, w_mh_ptr, dy_ptr, gates_ptr, cs_ptr, tcs_ptr, dc_ptr, dp_ptr, t, B, H,
          WITH_DOT: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
          UPCAST: tl.constexpr, ACC: tl.constexpr, PREC: tl.constexpr):  # fmt: skip
    """dh_t = dy_t + d(r_{t+1}) W_mh (no product at t = T-1), then step t's gate derivatives:
    dc += dh so (1 - tc^2); dG_t = [dc tu si', dc c_{t-1} sf', dh tc so', dc si tu'] into dP[..., H:];
    the carry dc * sf_t is left in dc (B, H) for step t-1."""
    rm = tl.program_id(0) * BM + tl.arange(0, BM)
    rn = tl.program_id(1) * BN + tl.arange(0, BN)
    mask = (rm[:, None] < B) & (rn[None, :] < H)
    off = rm[:, None] * H + rn[None, :]  # within one step's (B, H)
    dh = tl.load(dy_ptr + t * B * H + off, mask=mask, other=0.0).to(ACC)
    if WITH_DOT:
        # B operand W_mh: element (k, n) = W_mh[k, n]
        dh = _tile_dot(
            dh, dr_ptr + (t + 1) * B * H, H, w_mh_ptr, H, 1, rm, rn, B, H, H, BK, UPCAST, ACC, PREC
        )
    g = gates_ptr + t * B * 4 * H + rm[:, None] * (4 * H) + rn[None, :]
    si = tl.load(g, mask=mask, other=0.0).to(ACC)
    sf = tl.load(g + H, mask=mask, other=0.0).to(ACC)
    so = tl.load(g + 2 * H, mask=mask, other=0.0).to(ACC)
    tu = tl.load(g + 3 * H, mask=mask, other=0.0).to(ACC)
    c_prev = tl.load(cs_ptr + t * B * H + off, mask=mask, other=0.0).to(ACC)
    tc = tl.load(tcs_ptr + t * B * H + off, mask=mask, other=0.0).to(ACC)
    dc = tl.load(dc_ptr + off, mask=mask, other=0.0).to(ACC) + dh * so * (1.0 - tc * tc)
    d = dp_ptr + t * B * 5 * H + rm[:, None] * (5 * H) + H + rn[None, :]
    ty = dp_ptr.dtype.element_ty
    tl.store(d, (dc * tu * si * (1.0 - si)).to(ty), mask=mask)
    tl.store(d + H, (dc * c_prev * sf * (1.0 - sf)).to(ty), mask=mask)
    tl.store(d + 2 * H, (dh * tc * so * (1.0 - so)).to(ty), mask=mask)
    tl.store(d + 3 * H, (dc * si * (1.0 - tu * tu)).to(ty), mask=mask)
    tl.store(dc_ptr + off, (dc * sf).to(dc_ptr.dtype.element_ty), mask=mask)
