"""Warm a GPU machine's compile caches before anything is timed: every shape the GPU session's timed steps meet is
dispatched once (`model.core=auto`: the tuner checks, compiles and times each loop, and the whole op against
the reference core), so Triton's kernels land in TRITON_CACHE_DIR and the rankings in MLSTM_CACHE_DIR's
gpu_loops.json. A benchmark run after it compiles nothing and times nothing of the tuner's (except what it
asks to time: bench/gpu_tiles.py times afresh, from the compiled kernels). JSON line last: seconds per shape.

    python bench/warm_gpu.py [--shapes layer,train,field] [--device cuda]

Shapes (B, H, D, dtypes, backward): `layer` the layer benchmark's B16 H256 and B64 H1024 in bf16 and fp32 and
B128 H4096 in bf16 (bench/mlstm_layer.py SIZES); `train` bench/train_gpu.py's large preset at B128 and B256
(H4096, bf16) and small at B64 (H256, bf16, and its 2-layer input 256); `field`: only the 4096-wide ones.
MLSTM_GPU_TILES=both (the default) offers every tiling, so both are compiled. `--device cpu` (Triton's
interpreter, tiny shapes): the test's.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SHAPES = {  # name: [(B, H, D, dtypes, backward)]
    "layer": [(16, 256, 256, ("bf16", "fp32"), True), (64, 1024, 1024, ("bf16", "fp32"), True),
              (128, 4096, 4096, ("bf16",), True)],
    "train": [(128, 4096, 64, ("bf16",), True), (256, 4096, 64, ("bf16",), True),
              (64, 256, 128, ("bf16",), True), (64, 256, 256, ("bf16",), True)],
    "field": [(128, 4096, 4096, ("bf16",), True), (128, 4096, 64, ("bf16",), True), (256, 4096, 64, ("bf16",), True)],
    "tiny": [(3, 20, 8, ("fp32",), True)],  # the CPU test's (Triton's interpreter)
}  # fmt: skip


def warm(B: int, H: int, D: int, dtype: str, backward: bool, device: str) -> dict:
    """Dispatch one (B, H, D, dtype) once as the app does, a forward (and backward) through the chosen core."""
    import torch

    from app.model import core

    dt = {"bf16": torch.bfloat16, "fp32": torch.float32}[dtype]
    t0 = time.perf_counter()
    x = torch.randn(B, 8, D, device=device, dtype=dt, requires_grad=backward)
    ws = [torch.randn(s, device=device) * a for s, a in
          (((5 * H, D), D**-0.5), ((4 * H,), 0.1), ((H, H), H**-0.5), ((4 * H, H), H**-0.5))]  # fmt: skip
    ws = [w.to(torch.float32 if i == 1 else dt).requires_grad_(backward) for i, w in enumerate(ws)]
    fn = core.select("auto", x, ws[2], backward)
    y = fn.apply(x, *ws)
    if backward:
        y.float().sum().backward()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return {"core": fn.__name__, "seconds": round(time.perf_counter() - t0, 2)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default="layer,train", help="comma list of: " + ",".join(SHAPES))
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args(argv)
    names = [n for n in args.shapes.split(",") if n]
    if any(n not in SHAPES for n in names):
        print(f"error: --shapes: choose from {', '.join(SHAPES)}", file=sys.stderr)
        return 2
    out, t0 = {}, time.perf_counter()
    todo = sorted({s for n in names for s in SHAPES[n]}, key=lambda s: s[0] * s[1])
    for B, H, D, dtypes, backward in todo:
        for dt in dtypes:
            key = f"B{B} H{H} D{D} {dt}"
            try:
                out[key] = warm(B, H, D, dt, backward, args.device)
            except Exception as e:  # said and counted; the other shapes go on
                out[key] = f"failed: {type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
            print(key, out[key], flush=True)
    failed = [k for k, v in out.items() if isinstance(v, str)]
    print(json.dumps({"bench": "warm_gpu", "shapes": out, "failed": failed,
                      "seconds": round(time.perf_counter() - t0, 1)}))  # fmt: skip
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
