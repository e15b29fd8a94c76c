"""The tuner's log at the 4096-wide training shapes: each candidate loop checked and timed afresh (no ranking read
from disk; the kernels compiled already, bench/warm_gpu.py), its tiles, its times forward and backward and the
whole op against the reference core, as `model.core=auto` sees them. JSON line last (`--save`: to
bench/results/, results.py). Run it once per tile variant (bench/gpu_session.sh sets the tile switch's
variable, TILES_SWITCH, to each): the line records the variable's value and the tiles each loop ran.

    python bench/tuner_log.py [--shapes 128x4096,256x4096] [--dtype bf16] [--save]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def tune(B: int, H: int, dtype, device: str) -> dict:
    """A fresh ranking of (B, H): every candidate's tiles and time (ms for T_TUNE steps, or why it was left
    out), the chosen loops, the whole op against the reference core; gpu_tiles.describe's prediction where
    that function exists (the re-tiled tables)."""
    import torch

    from app.model import gpu_loops, gpu_tiles, gpu_tuning
    from app.model.mlstm_core import MLSTMFunction
    from app.model.triton_core import TritonMLSTMFunction

    gpu_tuning._choices.clear()
    x = torch.zeros(B, 2, 64, device=device, dtype=dtype)
    w = torch.zeros(H, H, device=device, dtype=dtype)
    t0 = time.perf_counter()
    choice = gpu_tuning.loops_for(x, w, backward=True)
    gpu_tuning.prefers_reference(x, w, True, TritonMLSTMFunction, MLSTMFunction)
    out = {
        "candidates": [repr(lp) for lp in gpu_tuning.candidates(B, H, dtype, torch.device(device))],
        "fwd": [repr(lp) for lp in choice.fwd_order], "bwd": [repr(lp) for lp in choice.bwd_order or []],
        "python": choice.python, "times_ms": choice.times, "T_TUNE": gpu_tuning.T_TUNE,
        "seconds": round(time.perf_counter() - t0, 2),
    }  # fmt: skip
    describe = getattr(gpu_tiles, "describe", None)
    if describe is not None:  # the traffic model's prediction beside the measurement
        try:
            out["predicted"] = describe(B, H, dtype, torch.device(device))
        except Exception as e:
            out["predicted"] = f"failed: {type(e).__name__}: {e}"
    gpu_loops.clear_graphs()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default="128x4096,256x4096", help="comma list of BxH")
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--save", action="store_true", help="append the JSON line to bench/results/")
    args = ap.parse_args(argv)
    import torch
    from results import save

    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[args.dtype]
    switch = os.environ.get("TILES_SWITCH", "")
    result: dict = {"bench": "tuner_log", "dtype": args.dtype, "tiles_switch": switch,
                    "tiles_variant": os.environ.get(switch, "") if switch else "", "shapes": {}}  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["MLSTM_CACHE_DIR"] = tmp  # timed afresh: no ranking read from disk (and none left there)
        for shape in args.shapes.split(","):
            B, H = (int(v) for v in shape.split("x"))
            result["shapes"][shape] = tune(B, H, dtype, args.device)
            print(shape, json.dumps(result["shapes"][shape])[:800], flush=True)
    print(json.dumps(result))
    if args.save:
        device = torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"
        print("saved to", save(result, "tuner_log", device))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
