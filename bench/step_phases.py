"""One training step split into its phases, in this process, two ways side by side: a plain loop (the model,
torch's fused AdamW, bf16 autocast on a GPU) and the app's DeepSpeed engine (app/parallel/engine.py, the
`gpu_bf16_zero2.json` config on a GPU, `cpu_zero2.json` on the CPU: bf16 weights, fp32 master copy, ZeRO-2),
so a difference between their step times is named by phase. Used by bench/train_gpu.py (`--phase-split`).

Phases (median ms over `reps` steps after `warmup`; CUDA events on a GPU, no sync between them; a wall clock
on the CPU):
    forward     embedding, recurrent layers and head          plain: model(x); DeepSpeed: engine(x)
    loss        the token loss
    backward    loss.backward()                                DeepSpeed: engine.backward (ZeRO's gradient
                                                               hooks, bucketing and reduction included)
    optimizer   the update                                     DeepSpeed: engine.step (its clipping, the
                                                               fp32 master step, the copy back)
    loss read   float(loss): the host waits for the step
and with `profile`, the DeepSpeed step's 12 costliest kernels (or CPU operators) by total time from
torch.profiler: what the extra time is made of. (DeepSpeed's own `wall_clock_breakdown` timers are not used:
they synchronise the device inside the step and reset themselves each step.)
"""

from __future__ import annotations

import statistics
import time

NAMES = ("forward", "loss", "backward", "optimizer", "loss read")


class _Clock:
    """Marks within a step: CUDA events on a GPU (no sync until the step's end), perf_counter elsewhere."""

    def __init__(self, cuda: bool) -> None:
        import torch

        self.cuda, self.torch, self.points = cuda, torch, []

    def mark(self) -> None:
        if self.cuda:
            ev = self.torch.cuda.Event(enable_timing=True)
            ev.record()
            self.points.append(ev)
        else:
            self.points.append(time.perf_counter())

    def ms(self) -> list[float]:
        if self.cuda:
            self.points[-1].synchronize()
            return [a.elapsed_time(b) for a, b in zip(self.points, self.points[1:])]
        return [1e3 * (b - a) for a, b in zip(self.points, self.points[1:])]


def _model_and_batch(preset: str, vocab: int, batch: int, seq_len: int, device):
    import torch

    from app.model.config import PRESETS, ModelConfig

    cfg = ModelConfig(vocab_size=vocab, **PRESETS[preset])
    g = torch.Generator(device=device).manual_seed(0)
    ids = torch.randint(0, vocab, (batch, seq_len), device=device, generator=g)
    tgt = torch.randint(0, vocab, (batch, seq_len), device=device, generator=g)
    return cfg, ids, tgt


def _summary(times: list[list[float]]) -> dict:
    ms = {n: round(statistics.median(t[i] for t in times), 3) for i, n in enumerate(NAMES)}
    total = sum(ms.values())
    return {"ms": ms, "step_ms": round(total, 3), "share": {n: round(v / total, 3) for n, v in ms.items()}}


def plain(
    preset: str, vocab: int, batch: int, seq_len: int, device: str, reps: int = 5, warmup: int = 3
) -> dict:
    """The plain loop's step, phase by phase."""
    import contextlib

    import torch

    from app.model.lm import LanguageModel
    from app.model.loss import token_loss

    cfg, ids, tgt = _model_and_batch(preset, vocab, batch, seq_len, device)
    cuda = device.startswith("cuda")
    model = LanguageModel(cfg).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=cuda)
    scale = torch.ones(1, device=device) / (batch * seq_len)
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if cuda else contextlib.nullcontext()
    times = []
    for step in range(warmup + reps):
        c = _Clock(cuda)
        c.mark()
        with autocast:
            logits = model(ids)
            c.mark()
            loss = token_loss(logits, (tgt, scale))
        c.mark()
        loss.backward()
        c.mark()
        opt.step()
        opt.zero_grad(set_to_none=True)
        c.mark()
        float(loss)
        c.mark()
        if step >= warmup:
            times.append(c.ms())
    return _summary(times)


def under_deepspeed(preset: str, vocab: int, batch: int, seq_len: int, device: str, reps: int = 5,
                    warmup: int = 3, profile: bool = False) -> dict:  # fmt: skip
    """The DeepSpeed engine's step (one process, rank 0 of 1), phase by phase; `profile`: the last step's
    costliest kernels."""
    import json
    from pathlib import Path

    import torch

    from app.model.loss import token_loss
    from app.parallel.engine import Engine
    from app.parallel.layout import engine_config, resolve_layout
    from app.parallel.runtime import init_distributed

    cuda = device.startswith("cuda")
    root = Path(__file__).resolve().parents[1]
    ds = json.loads((root / "ds_configs" / ("gpu_bf16_zero2.json" if cuda else "cpu_zero2.json")).read_text())
    ds |= {
        "train_micro_batch_size_per_gpu": batch,
        "gradient_accumulation_steps": 1,
        "wall_clock_breakdown": True,
    }
    init_distributed()
    layout = resolve_layout(ds, 1, 1, training=True)
    cfg, ids, tgt = _model_and_batch(preset, vocab, batch, seq_len, device)
    eng = Engine(cfg, layout, engine_config(ds, layout), seed=0, partition_method="parameters").ds
    scale = torch.ones(1, device=device) / (batch * seq_len)
    times, kernels = [], None
    for step in range(warmup + reps):
        prof = _profiler(cuda) if profile and step == warmup + reps - 1 else None
        with prof if prof is not None else _null():
            c = _Clock(cuda)
            c.mark()
            logits = eng(ids)
            c.mark()
            loss = token_loss(logits, (tgt, scale))
            c.mark()
            eng.backward(loss)
            c.mark()
            eng.step()
            c.mark()
            float(loss)
            c.mark()
        if step >= warmup:
            times.append(c.ms())
        if prof is not None:
            kernels = _top(prof, cuda)
    out = _summary(times)
    if kernels is not None:
        out["top_kernels_us"] = kernels
    return out


def _null():
    import contextlib

    return contextlib.nullcontext()


def _profiler(cuda: bool):
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    return profile(activities=acts)


def _top(prof, cuda: bool, n: int = 12) -> dict:
    """The step's costliest kernels (GPU) or operators (CPU) by total self time, µs."""
    key = "self_device_time_total" if cuda else "self_cpu_time_total"
    rows = [(e.key, getattr(e, key, 0.0)) for e in prof.key_averages()]
    rows = sorted((r for r in rows if r[1] > 0), key=lambda r: -r[1])[:n]
    return {k[:80]: round(v, 1) for k, v in rows}


def split(preset: str, vocab: int, batch: int, seq_len: int, device: str, reps: int = 5, warmup: int = 3,
          profile: bool = False) -> dict:  # fmt: skip
    """Both splits and their difference per phase (DeepSpeed less the plain loop, ms)."""
    a = plain(preset, vocab, batch, seq_len, device, reps, warmup)
    b = under_deepspeed(preset, vocab, batch, seq_len, device, reps, warmup, profile)
    extra = {n: round(b["ms"][n] - a["ms"][n], 3) for n in NAMES}
    return {"batch": batch, "seq_len": seq_len, "device": device, "plain": a, "deepspeed": b,
            "deepspeed_extra_ms": extra, "deepspeed_extra_step_ms": round(b["step_ms"] - a["step_ms"], 3)}  # fmt: skip
