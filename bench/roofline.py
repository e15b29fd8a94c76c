"""How far a shape of the mLSTM layer is from the hardware: the FLOPs, HBM bytes and L2 bytes one training step
must move, over the device's measured ceilings; used by bench/mlstm_layer.py beside the cuDNN ratio.

Per training step of one layer (B rows, T steps, H units, input width D = H, operands of `b` bytes):
    FLOPs   3 x the forward's products: 2 (5 H D + 5 H^2) per token (app/model/config.py's count)
    HBM     the time loop's state once each way (what each phase must read and write, nothing re-read): forward
            reads pm, pg (fp32) and writes h, m (b bytes), c, r, tanh c, the four gates (fp32); backward reads dy,
            the gates, c, tanh c, r, pm and writes dP (5H, b bytes) and dr; the weights W_mh, W_m once per
            direction, and per time step where they do not fit in half the L2 (they stream from HBM each step);
            the input projection and the weight gradients' products read their operands once
    L2      what the loop's tiles read and write through L2 per time step, phase by phase (app/model/gpu_traffic.py:
            each tile its weight rows and its batch rows' state over the product's K, a split phase's slices and
            their sum, the epilogues' state); from the tiles of the loops the tuner chose, or None for the cuBLAS
            loop (its tiling is cuBLAS's)
The bound is the largest of FLOPs / peak, HBM / bandwidth, L2 / bandwidth; `of_bound` = bound / measured time
(1.0 = at the hardware's limit for that resource).

Run as a script it prints the traffic model of every candidate the tuner would rank at each shape (phases,
tiles, products, L2 and HBM bytes, predicted us per step: app/model/gpu_tiles.describe), no GPU needed, and a
JSON line last with each candidate's predicted us per step:

    python bench/roofline.py --shapes 128x4096,256x4096 --device "H100 SXM"   # B x H; "H100 PCIe", "H200"
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


def l2_phases(loop, fwd: bool, B: int, H: int, b: int) -> list:
    """The L2 traffic of each phase of `loop`'s direction per time step (gpu_traffic.Phase: tiles, product,
    bytes), split phases included."""
    from app.model.gpu_traffic import backward_phases, forward_phases

    return (forward_phases if fwd else backward_phases)(loop.tiles, B, H, b, streamed=False)


def l2_bytes_per_step(fwd, bwd, B: int, H: int, b: int) -> float | None:
    """Bytes the chosen loops' tiles move through L2 per time step (both directions, every phase); None for the
    cuBLAS loop."""
    if fwd is None or bwd is None or "cublas" in (fwd.name, bwd.name):
        return None
    return float(sum(p.l2 for p in l2_phases(fwd, True, B, H, b) + l2_phases(bwd, False, B, H, b)))


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
    """The device's HBM bandwidth (a 2 GiB device copy, bytes read + written), L2 read bandwidth (16 MiB summed
    32 times over in one kernel, through a stride-0 view: every read after the first from L2) and bf16 matmul
    rate (8192^3 on random data), timed with CUDA events. (Run 3 timed L2 as 20 copies of 8 MiB: launch-bound,
    1.6 TB/s, under the HBM copy's 3.0: the L2 figures of that run are not the L2's.)"""
    import torch

    from app.model.gpu_ranking import time_ms

    def best_ms(fn, reps: int = 10) -> float:  # a peak rate: the fastest of `reps` after one warm-up run
        return time_ms(fn, reps, warmup=1, stat=min)

    def copy_gbs(floats: int) -> float:
        src, dst = (torch.empty(floats, dtype=torch.float32, device=device) for _ in range(2))
        return 2 * floats * 4 / (best_ms(lambda: dst.copy_(src)) * 1e-3) / 1e9

    hbm = copy_gbs(1 << 29)  # 2 GiB each way
    block = torch.randn(1 << 22, dtype=torch.float32, device=device)  # 16 MiB: fits in any L2 it is run on
    rows = 32
    l2 = rows * block.numel() * 4 / (best_ms(lambda: block.expand(rows, -1).sum(0)) * 1e-3) / 1e9
    a = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
    w = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
    tflops = 2 * 8192**3 / (best_ms(lambda: a @ w, reps=5) * 1e-3) / 1e12
    return {"hbm_gbs": round(hbm, 1), "l2_gbs": round(l2, 1), "matmul_tflops": round(tflops, 1)}


def main() -> None:
    import argparse
    import json
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import torch

    from app.model.gpu_tiles import describe, model

    ap = argparse.ArgumentParser(
        description="The traffic model of the tuner's candidates at each shape (no GPU)."
    )
    ap.add_argument("--shapes", default="128x4096,256x4096", help="comma list of BxH (batch bucket x hidden)")
    ap.add_argument(
        "--device", default="H100 SXM", help="a GPU the model has rates for: H100 SXM, H100 PCIe, H200"
    )
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"])
    args = ap.parse_args()
    dtype = getattr(torch, args.dtype)
    out = []
    for shape in args.shapes.split(","):
        B, H = (int(v) for v in shape.lower().split("x"))
        print(describe(B, H, dtype, args.device), flush=True)
        m = model(B, H, dtype, args.device)
        out.append({"B": B, "H": H, "hbm_floor_us": m["hbm_floor_us"],
                    "us": {k: c["us"] for k, c in m["candidates"].items()}})  # fmt: skip
    print(json.dumps({"bench": "roofline", "device": args.device, "dtype": args.dtype, "shapes": out}))


if __name__ == "__main__":
    main()
