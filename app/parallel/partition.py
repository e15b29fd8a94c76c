"""Per-layer costs that decide the pipeline split: measured on this device, or estimated from FLOPs.

The FLOP estimate (`app.parallel.pipeline.layer_costs`) misjudges the mLSTM badly: a recurrent layer runs
T sequential steps of small (B, H) products at a fraction of the machine's peak, while the head is one
large product. Measured on the 2-core dev box (1 thread, B 8, T 100, fwd + bwd, ms): recurrent layer
in 256 / 512 -> hidden 512: 255 / 292; head 512 -> 2000 (+ loss): 51. FLOPs rate the head at a third of
a layer, time at a sixth. For the quickstart model ([embedding, 2 layers, head] on 2 stages) FLOPs put
the head alone on stage 2; the measured split ([embedding, layer] | [layer, head]) trained 1.3x faster.

So partition_method "time" (the default) times one forward + backward of each distinct layer on global
rank 0 at the run's micro-batch shape and broadcasts the costs, so every rank splits identically. The
costs are recorded in the run's config and checkpoints and reused on resume: the split, and with it the
per-stage optimizer state files, never changes under a resumed run.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist
from deepspeed.pipe import TiedLayerSpec

from app.model.config import ModelConfig
from app.model.loss import token_loss
from app.parallel.pipeline import layer_costs, layer_specs

TIMED_REPEATS = 3


def _timed(fn, sync, repeats: int = TIMED_REPEATS) -> float:
    """Median seconds of `fn()` after one warm-up call."""
    fn()
    sync()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t)
    return sorted(times)[len(times) // 2]


def measure_layer_costs(
    cfg: ModelConfig, micro_batch: int, seq_len: int, device: torch.device
) -> list[float]:
    """Seconds of one forward + backward of each `layer_specs(cfg)` entry on a (micro_batch, seq_len) batch.

    The last layer is timed with the loss, as it runs on the last stage. Layers of the same kind and
    input width share one measurement.
    """
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):  # leave the run's RNG be
        return _measure(cfg, micro_batch, seq_len, device)


def _measure(cfg: ModelConfig, micro_batch: int, seq_len: int, device: torch.device) -> list[float]:
    specs = layer_specs(cfg)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    last = len(specs) - 1
    targets = torch.randint(0, cfg.vocab_size, (micro_batch, seq_len), device=device)
    scale = torch.ones(1, device=device)
    cache: dict[tuple, float] = {}
    costs = []
    for i, spec in enumerate(specs):
        # what spec i receives: ids for the embedding, activations (embed width into the first layer)
        width = 0 if i == 0 else cfg.embed_dim if i == 1 else cfg.hidden_dim
        key = ("last" if i == last else "layer", width)
        if key not in cache:
            module = spec.build().to(device)
            run = module if not isinstance(spec, TiedLayerSpec) or spec.forward_fn is None else module.logits
            shape = (micro_batch, seq_len)
            x = (
                torch.randint(0, cfg.vocab_size, shape, device=device)
                if i == 0
                else torch.randn(*shape, width, device=device, requires_grad=True)
            )

            def step(run=run, x=x, final=i == last) -> None:
                y = run(x)
                (token_loss(y, (targets, scale)) if final else y.float().sum()).backward()

            cache[key] = _timed(step, sync)
            del module
        costs.append(cache[key])
    return costs


def pipeline_layer_costs(
    method: str, cfg: ModelConfig, micro_batch: int, seq_len: int, device: torch.device
) -> list[float] | None:
    """Costs for CostPipelineModule: measured on rank 0 and broadcast ("time"), FLOPs ("cost"), else None
    (DeepSpeed's own methods need none). Needs torch.distributed initialised."""
    if method == "cost":
        return layer_costs(cfg)
    if method != "time":
        return None
    n = cfg.num_layers + 2
    costs = torch.zeros(n, dtype=torch.float64, device=device)
    if dist.get_rank() == 0:
        costs.copy_(torch.tensor(measure_layer_costs(cfg, micro_batch, seq_len, device), dtype=torch.float64))
    dist.broadcast(costs, src=0)
    return [float(c) for c in costs.cpu()]
