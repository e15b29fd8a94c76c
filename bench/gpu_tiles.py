"""The tuner's ranking at the large model's shapes, today's tiles and the l2 ones side by side in one run: each
candidate loop checked, then timed as the layer runs it (the whole op, forward and backward back to back), alone,
and predicted by the traffic model (app/model/gpu_traffic.py). JSON line last.

    python bench/gpu_tiles.py                                   # B128 and B256 at H4096, bf16, on cuda
    python bench/gpu_tiles.py --shapes 128x4096 --save          # and append the JSON line to bench/results/
    TRITON_INTERPRET=1 python bench/gpu_tiles.py --device cpu --shapes 16x20 --steps 2 --reps 1   # no GPU

Per shape it prints the tuner's ranking line (`ranked the mLSTM core's GPU loops ...`: per loop its tiles and
ms for --steps steps: whole op / loop alone / traffic model) and `describe`'s phases; the JSON line holds each
candidate's three times, the ranking each way, and old-against-new ratios: the best of today's persistent
tilings (persistent, splitk) over persistent-l2, whole op and loop alone (above 1: the l2 tiles are faster).
The shapes' tunings are fresh (no choice cache: MLSTM_CACHE_DIR is pointed at a new folder).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

OLD = ("persistent", "splitk")  # today's persistent tilings, against persistent-l2


def ratios(times: dict) -> dict:
    """Per direction and clock (whole op "", loop alone "loop/"): the best of OLD over persistent-l2."""
    out = {}
    for d in ("fwd", "bwd"):
        for clock in ("", "loop/"):
            old = [times.get(f"{clock}{d}/{n}") for n in OLD]
            old = [v for v in old if isinstance(v, float)]
            new = times.get(f"{clock}{d}/persistent-l2")
            if old and isinstance(new, float):
                out[f"{clock or 'op/'}{d}"] = round(min(old) / new, 3)
    return out


def one(B: int, H: int, dtype: torch.dtype, device: torch.device) -> dict:
    """Tune the shape afresh and return what the tuner measured, with the model's prediction."""
    from app.model import gpu_loops, gpu_ranking, gpu_tuning
    from app.model.gpu_tiles import describe
    from app.model.triton_core import run_op

    t0 = time.perf_counter()
    choice = gpu_tuning._tune(B, H, H, dtype, device, True, run_op)
    gpu_loops.clear_graphs()
    line = gpu_tuning.ranking_line(choice, B, H, dtype)
    print(line, flush=True)
    if device.type == "cuda":
        print(describe(B, H, dtype, device), flush=True)
    return {"B": B, "H": H, "steps": gpu_ranking.T_TUNE, "fwd": [lp.label for lp in choice.fwd_order],
            "bwd": [lp.label for lp in choice.bwd_order], "times_ms": choice.times,
            "old_over_new": ratios(choice.times), "tiles": {lp.label: [lp.tiles.short(True), lp.tiles.short(False)]
            for lp in [*choice.fwd_order, *choice.bwd_order]}, "seconds": round(time.perf_counter() - t0, 1)}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default="128x4096,256x4096", help="comma list of BxH (batch bucket x hidden)")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--device", default="cuda", help="cuda, or cpu under TRITON_INTERPRET=1 (a smoke run)")
    ap.add_argument("--steps", type=int, default=64, help="time steps of each timed run (the tuner's T_TUNE)")
    ap.add_argument("--reps", type=int, default=5, help="timed runs per candidate (median), after 3 warm-up")
    ap.add_argument("--save", action="store_true", help="append the JSON line to bench/results/ (results.py)")
    args = ap.parse_args()
    device = torch.device(args.device)
    if device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        ap.error("--device cpu runs only in Triton's interpreter (TRITON_INTERPRET=1)")
    os.environ["MLSTM_CACHE_DIR"] = tempfile.mkdtemp(prefix="gpu_tiles_")  # every shape timed afresh
    os.environ.pop("MLSTM_GPU_LOOP", None)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    from app.model import gpu_ranking

    gpu_ranking.T_TUNE, gpu_ranking.REPS = args.steps, args.reps
    if device.type != "cuda":
        gpu_ranking.WARMUP = 0
    shapes = [tuple(int(v) for v in s.lower().split("x")) for s in args.shapes.split(",")]
    rows = [one(B, H, getattr(torch, args.dtype), device) for B, H in shapes]
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "triton interpreter"
    import triton

    result = {"bench": "gpu_tiles", "dtype": args.dtype, "torch": torch.__version__, "triton": triton.__version__,
              "driver": _driver(), "shapes": rows}  # fmt: skip
    if args.save:
        from results import save  # bench/results.py

        print(f"saved to {save(result, 'gpu_tiles', name)}", flush=True)
    print(json.dumps({**result, "device": name}))


def _driver() -> str:
    from app.model.gpu_choice_cache import driver_version

    return driver_version()


if __name__ == "__main__":
    main()
