"""Whether overlapping the backward's weight-gradient products with its time loop pays
(app/model/wgrad_overlap.py, MLSTM_WGRAD_OVERLAP=N time chunks): one recurrent layer's training step (forward and
backward, bf16, T = 256) at the large preset's batches, without the overlap and with 2, 4 and 8 chunks, the
contenders round-robin in one process, median ms of each. The gradients of each variant are compared with
those without it (their largest difference over the largest gradient). JSON line last (`--save`: to
bench/results/, results.py).

    python bench/wgrad_overlap.py [--shapes 128x4096,256x4096] [--chunks 0,2,4,8] [--reps 7] [--save]
    python bench/wgrad_overlap.py --device cpu --shapes 3x20 --seq-len 5 --reps 1   # Triton's interpreter
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def _step(B: int, T: int, H: int, device: str, dtype):
    import torch

    from app.model.triton_core import TritonMLSTMFunction

    g = torch.Generator(device=device).manual_seed(0)
    D = 64
    x = torch.randn(B, T, D, device=device, generator=g).to(dtype).requires_grad_()
    ws = [(torch.randn(s, device=device, generator=g) * a) for s, a in
          (((5 * H, D), D**-0.5), ((4 * H,), 0.1), ((H, H), H**-0.5), ((4 * H, H), H**-0.5))]  # fmt: skip
    ws = [w.to(torch.float32 if i == 1 else dtype).requires_grad_() for i, w in enumerate(ws)]
    dy = torch.randn(B, T, H, device=device, generator=g).to(dtype)

    def run() -> list:
        for t in (x, *ws):
            t.grad = None
        TritonMLSTMFunction.apply(x, *ws).backward(dy)
        return [t.grad.double() for t in (x, *ws)]

    return run


def _ms(run, chunks: int, device: str) -> tuple[float, list]:
    import torch

    os.environ["MLSTM_WGRAD_OVERLAP"] = str(chunks)
    cuda = device.startswith("cuda")
    if cuda:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    grads = run()
    if cuda:
        torch.cuda.synchronize()
    return 1e3 * (time.perf_counter() - t0), grads


def measure(B: int, H: int, T: int, chunks: list[int], reps: int, device: str, dtype) -> dict:
    run = _step(B, T, H, device, dtype)
    for n in chunks:  # warm: the tuner's choice (cached by bench/warm_gpu.py), graphs, the side stream
        _ms(run, n, device)
    times: dict[int, list[float]] = {n: [] for n in chunks}
    grads: dict[int, list] = {}
    for _ in range(reps):
        for n in chunks:
            ms, grads[n] = _ms(run, n, device)
            times[n].append(ms)
    base = grads[chunks[0]]
    diff = {n: max(((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item() for a, b in zip(grads[n], base))
            for n in chunks}  # fmt: skip
    ms = {n: round(statistics.median(v), 3) for n, v in times.items()}
    return {"B": B, "H": H, "T": T, "ms": ms, "vs_no_overlap": {n: round(ms[chunks[0]] / ms[n], 3) for n in chunks},
            "grad_rel_diff": diff}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default="128x4096,256x4096", help="comma list of BxH")
    ap.add_argument(
        "--chunks", default="0,2,4,8", help="MLSTM_WGRAD_OVERLAP values; the first is the baseline"
    )
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--save", action="store_true", help="append the JSON line to bench/results/")
    args = ap.parse_args(argv)
    import torch
    from results import save

    dtype = torch.bfloat16 if args.device.startswith("cuda") else torch.float64
    chunks = [int(c) for c in args.chunks.split(",")]
    result: dict = {"bench": "wgrad_overlap", "dtype": str(dtype).removeprefix("torch."), "shapes": {}}
    for shape in args.shapes.split(","):
        B, H = (int(v) for v in shape.split("x"))
        try:
            result["shapes"][shape] = measure(B, H, args.seq_len, chunks, args.reps, args.device, dtype)
        except Exception as e:  # reported, never a crash of the benchmark
            result["shapes"][shape] = (
                f"failed: {type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
            )
        print(shape, result["shapes"][shape], flush=True)
    print(json.dumps(result))
    if args.save:
        device = torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"
        print("saved to", save(result, "wgrad_overlap", device))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
