"""The optimizer step on one GPU: torch's fused AdamW (the default on CUDA, app/parallel/optimizer.py) against
its foreach AdamW and DeepSpeed's FusedAdam (built here first if it can be: TORCH_CUDA_ARCH_LIST must be
one DeepSpeed parses, e.g. 9.0 on an H100). JSON line last.

    python bench/gpu_optimizer.py [--params 86e6] [--reps 20]

Parameters: one flat fp32 tensor with its gradient (what a ZeRO stage holds per rank), by default the `large`
preset's size. Times: median ms per step (CUDA events) after warm-up; a contender that cannot run (FusedAdam
that does not build) is reported as unavailable with the reason.
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch

from app.parallel.optimizer import build_fused_adam


def step_ms(opt: torch.optim.Optimizer, reps: int) -> float:
    for _ in range(3):
        opt.step()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        opt.step()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--params", type=float, default=86e6)
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()
    p = torch.nn.Parameter(torch.randn(int(args.params), device="cuda"))
    p.grad = torch.randn_like(p) * 1e-3
    kw = dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    out: dict = {"bench": "gpu_optimizer", "device": torch.cuda.get_device_name(), "params": int(args.params)}
    ms: dict = {
        "torch_fused_adamw": step_ms(torch.optim.AdamW([p], fused=True, **kw), args.reps),
        "torch_foreach_adamw": step_ms(torch.optim.AdamW([p], foreach=True, **kw), args.reps),
    }
    why = build_fused_adam()
    if why is None:
        from deepspeed.ops.adam import FusedAdam

        ms["deepspeed_fused_adam"] = step_ms(FusedAdam([p], adam_w_mode=True, **kw), args.reps)
    else:
        ms["deepspeed_fused_adam"] = f"unavailable: {why}"
    out["step_ms"] = {k: round(v, 3) if isinstance(v, float) else v for k, v in ms.items()}
    if isinstance(ms["deepspeed_fused_adam"], float):
        out["torch_fused_vs_deepspeed_fused"] = round(ms["deepspeed_fused_adam"] / ms["torch_fused_adamw"], 3)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
