"""How far a shape of the mLSTM layer is from the hardware: the FLOPs, HBM bytes and L2 bytes one training step
must move, over the device's measured ceilings; used by bench/mlstm_layer.py beside the cuDNN ratio.

Per training step of one layer (B rows, T steps, H units, input width D = H, operands of `b` bytes):
    FLOPs   3 x the forward's products: 2 (5 H D + 5 H^2) per token (app/model/config.py's count)
    HBM     the time loop's state once each way (what each phase must read and write, nothing re-read): forward
            reads pm, pg (fp32) and writes h, m (b bytes), c, r, tanh c, the four gates (fp32); backward reads dy,
            the gates, c, tanh c, r, pm and writes dP (5H, b bytes) and dr; the weights W_mh, W_m once per
            direction, and per time step where they do not fit in half the L2 (they stream from HBM each step);
            the input projection and the weight gradients' products read their operands once
    L2      what the loop's tiles read per time step: each tile its weight rows and its batch rows' state over the
            product's K (a tile's reads are from L2 at best); from the tiles of the loops the tuner chose, or
            None for the cuBLAS loop (its tiling is cuBLAS's)
The bound is the largest of FLOPs / peak, HBM / bandwidth, L2 / bandwidth; `of_bound` = bound / measured time
(1.0 = at the hardware's limit for that resource).
"""

from __future__ import annotations

STATE_FWD = dict(read=4 + 16, write_f32=4 + 4 + 16 + 4)  # pm, pg; c, r, the gates, tanh c (+ h, m: b bytes)
STATE_BWD = dict(read=4 + 16 + 4 + 4 + 4 + 4, write_b=5 + 1)  # dy, gates, c, tanh c, r, pm; dP (5H), dr


def flops(B: int, T: int, H: int, D: int | None = None) -> float:
    D = H if D is None else D
    return 3 * 2.0 * (5 * H * D + 5 * H * H) * B * T


def hbm_bytes(B: int, T: int, H: int, b: int, weights_in_l2: bool, D: int | None = None) -> float:
    """The fewest bytes one training step moves through device memory."""
    D = H if D is None else D
    state = (
        B
        * T
        * H
        * (STATE_FWD["read"] + STATE_FWD["write_f32"] + 2 * b + STATE_BWD["read"] + STATE_BWD["write_b"] * b)
    )
    weight_reads = 2 * (1 if weights_in_l2 else T) * 5 * H * H * b
    outside = 3 * B * T * (D + 5 * H) * b + 3 * 5 * H * D * b  # projection, d(w_in), dx: operands and results
    return float(state + weight_reads + outside)


def l2_bytes_per_step(fwd, bwd, B: int, H: int, b: int) -> float | None:
    """Bytes the chosen loops' tiles read per time step (both directions); None for the cuBLAS loop."""
    if fwd is None or bwd is None or "cublas" in (fwd.name, bwd.name):
        return None
    f, g = fwd.tiles, bwd.tiles
    reads = (
        f.n_r(B, H) * (f.bu_r + f.bb_r) * H
        + f.n_g(B, H) * (4 * f.bu_g + f.bb_g) * H
        + g.n_h(B, H) * (g.bu_h + g.bb_h) * H
        + g.n_m(B, H) * (g.bu_m + g.bb_m) * (4 * H // g.split)
    )
    return float(reads * b)


def bound(shape: dict, b: int, weights_in_l2: bool, ceilings: dict, fwd=None, bwd=None) -> dict:
    """The three times a training step of `shape` (B, T, H) cannot beat, and which one binds."""
    B, T, H = shape["B"], shape["T"], shape["H"]
    times = {
        "compute_ms": 1e3 * flops(B, T, H) / (ceilings["matmul_tflops"] * 1e12),
        "hbm_ms": 1e3 * hbm_bytes(B, T, H, b, weights_in_l2) / (ceilings["hbm_gbs"] * 1e9),
    }
    l2 = l2_bytes_per_step(fwd, bwd, B, H, b)
    times["l2_ms"] = None if l2 is None else 1e3 * l2 * T / (ceilings["l2_gbs"] * 1e9)
    limit = max((k for k in times if times[k] is not None), key=lambda k: times[k])
    return {**{k: (round(v, 4) if v is not None else None) for k, v in times.items()}, "bound_by": limit[:-3],
            "bound_ms": round(times[limit], 4)}  # fmt: skip


def measure_ceilings(device) -> dict:
    """The device's HBM bandwidth (a 2 GiB device copy, bytes read + written), L2 bandwidth (a copy of 8 MiB
    into 8 MiB, repeated: both in L2) and bf16 matmul rate (8192^3 on random data), timed with CUDA events."""
    import torch

    def best_ms(fn, reps: int = 10) -> float:
        fn()
        times = []
        for _ in range(reps):
            a, z = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            z.record()
            z.synchronize()
            times.append(a.elapsed_time(z))
        return min(times)

    def copy_gbs(floats: int, rounds: int) -> float:
        src, dst = (torch.empty(floats, dtype=torch.float32, device=device) for _ in range(2))

        def go() -> None:
            for _ in range(rounds):
                dst.copy_(src)

        return rounds * 2 * floats * 4 / (best_ms(go) * 1e-3) / 1e9

    hbm = copy_gbs(1 << 29, 1)  # 2 GiB each way
    l2 = copy_gbs(1 << 21, 20)  # 8 MiB each way, both in L2
    a = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
    w = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
    tflops = 2 * 8192**3 / (best_ms(lambda: a @ w, reps=5) * 1e-3) / 1e12
    return {"hbm_gbs": round(hbm, 1), "l2_gbs": round(l2, 1), "matmul_tflops": round(tflops, 1)}
