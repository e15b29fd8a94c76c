"""What a training run's flags may ask of the machine (app.common.resources' rule): a count larger than the
data can use is capped in one line, and a model, micro-batch or samples whose memory is more than the
machine has free is refused in one line, before anything of that size exists. The caps are rules that
return the value in force; the run's resolve step (app.training.plan's `plan_run`) applies them all and
freezes the config it makes of them.

Capped (each in one line naming the flag, or the DeepSpeed key that set the value, the value and the cap):
- the micro-batch, at the largest split's examples: a micro-batch holds one bucket's sequences, never more;
- --tokens-per-micro-batch, at the largest split's tokens padded to its buckets: each bucket is then one
  micro-batch;
- the accumulation (--grad-accum, or --global-batch it is derived from), at the train split's micro-batches
  per data-parallel rank: a step then holds the whole epoch, and a larger one only adds empty micro-batches
  (each still a pass of the pipeline);
- --eval-max-batches and --sanity-eval-batches, at the validation split's batches;
- --dist-timeout-s, at a day.
None of these changes a batch the run computes, its loss or its gradient (with --carry-state the number of
streams follows the micro-batch and the accumulation, so there it lays the long documents out anew).

Refused: weights, gradients and Adam's moments plus the activations of the largest micro-batch (each in
flight on the first pipeline stage), app.model.memory's estimates, that need more than the device has free: on CPU the host's available memory,
shared by the node's processes; on CUDA each process's device (with ZeRO offload to the CPU, the device and
the host together; to NVMe, no check). And rank 0's samples (the whole model gathered on its CPU, then
--samples x prompts rows of --sample-tokens) against the host's memory.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable

import numpy as np
import torch

from app.batching.buckets import batch_size, bucket_counts
from app.batching.run_data import RunData
from app.common.resources import Part, available_memory, cap, refuse_over
from app.generation.config import generation_bytes
from app.model.config import ModelConfig, matrix_parameters
from app.model.first_call import first_call_bytes, op_paths_bytes
from app.model.memory import ENGINE_BYTES, bytes_per_token, training_state_bytes, weight_bytes
from app.parallel.layout import ACCUM, GLOBAL, MICRO, Layout
from app.training.config import TrainConfig

Say = Callable[[str], None] | None
MAX_DIST_TIMEOUT_S = 86400.0  # a peer silent for a day has died or hung: no collective waits longer


def cap_timeout(seconds: float, say: Say) -> float:
    """--dist-timeout-s at a day (a longer wait is a hang no one is watching; torch's timedelta also
    overflows near 10^14 s)."""
    why = "a peer silent for a day has died or hung; no collective waits longer"
    return float(cap("--dist-timeout-s", seconds, [(MAX_DIST_TIMEOUT_S, why)], say))


def split_counts(data: RunData, test_eval: bool) -> dict[str, np.ndarray]:
    """Examples per bucket of each split the run reads (train, validation, and test with --test-eval) that
    has any (an empty split is refused by `RunData.configure`, or skipped)."""
    stated = data.prepared.meta.get("splits") or {}
    n_buckets = len(data.prepared.meta["buckets"])
    names = ("train", "validation", "test") if test_eval else ("train", "validation")
    return {
        s: bucket_counts(data.store(s), n_buckets) for s in names if (stated.get(s) or {}).get("examples")
    }


def _origin(given: int | None, flag: str, key: str, ds_json: dict) -> str | None:
    """How a line names a batch setting: its flag when given, else the DeepSpeed config's key when it
    states it; None when the value was derived from the other two."""
    if given is not None:
        return flag
    return f"{key} (DeepSpeed config)" if isinstance(ds_json.get(key), int) else None


def cap_batches(
    cfg: TrainConfig,
    layout: Layout,
    counts: dict[str, np.ndarray],
    bounds: list[int],
    ds_json: dict,
    say: Say,
) -> tuple[Layout, int]:
    """The micro-batch, --tokens-per-micro-batch and the accumulation capped at what the splits can fill
    (module docstring) -> (the layout, the token budget) in force."""
    if not counts:
        return layout, cfg.tokens_per_micro_batch
    examples = {s: int(c.sum()) for s, c in counts.items()}
    most = max(examples, key=examples.__getitem__)
    glob = _origin(cfg.global_batch, "--global-batch", GLOBAL, ds_json) or "the global batch"
    name = _origin(cfg.micro_batch, "--micro-batch", MICRO, ds_json) or f"the micro-batch (from {glob})"
    why = f"no split has more examples ({most}: {examples[most]:,})"
    micro = cap(name, layout.micro_batch, [(examples[most], why)], say)
    padded = {s: int(np.dot(c, bounds)) for s, c in counts.items()}
    widest = max(padded, key=padded.__getitem__)
    why = f"no split has more tokens padded to its buckets ({widest}: {padded[widest]:,})"
    tpmb = cap("--tokens-per-micro-batch", cfg.tokens_per_micro_batch, [(padded[widest], why)], say)
    train = counts.get("train", np.zeros(len(bounds), np.int64))
    sizes = np.array([batch_size(b, micro, tpmb) for b in bounds], dtype=np.int64)
    accum = _cap_accum(cfg, layout, micro, max(1, int(np.sum(-(-train // sizes)))), ds_json, say)
    return dataclasses.replace(layout, micro_batch=micro, grad_accum=accum), tpmb


def _cap_accum(cfg: TrainConfig, layout: Layout, micro: int, n_micro: int, ds_json: dict, say: Say) -> int:
    """The accumulation at the train split's `n_micro` micro-batches per data-parallel rank, said in the
    units of the setting it came from (--grad-accum or --global-batch, or their DeepSpeed keys)."""
    dp = layout.data_parallel
    accum = -(-n_micro // dp)
    if layout.grad_accum <= accum:
        return layout.grad_accum
    per = f"{accum:,} per data-parallel rank" if dp > 1 else "one step holds the whole epoch"
    why = f"the train split makes {n_micro:,} micro-batch(es) ({per})"
    name = _origin(cfg.grad_accum, "--grad-accum", ACCUM, ds_json)
    glob = None if name else _origin(cfg.global_batch, "--global-batch", GLOBAL, ds_json)
    if glob is not None:
        cap(glob, micro * layout.grad_accum * dp, [(micro * accum * dp, why)], say)
    else:
        cap(name or "--grad-accum", layout.grad_accum, [(accum, why)], say)
    return accum


def cap_eval_batches(cfg: TrainConfig, batches: int, say: Say, note: Say = None) -> dict[str, int]:
    """--eval-max-batches and --sanity-eval-batches at the validation split's `batches` (0 stays 0); a line
    through `say`, or through `note` for a default (the sanity evaluation's 2 on a split of one batch)."""
    why = f"the validation split has {batches:,} batch(es)"
    defaults = {f.name: f.default for f in dataclasses.fields(TrainConfig)}
    return {
        name: cap(
            f"--{name.replace('_', '-')}", value, [(batches, why)], note if value == defaults[name] else say
        )
        for name in ("eval_max_batches", "sanity_eval_batches")
        for value in [getattr(cfg, name)]
    }


def largest_micro_batch(
    train: np.ndarray, bounds: list[int], micro: int, tpmb: int, carry_state: bool
) -> int:
    """Padded tokens of the largest micro-batch the train split makes: a bucket's (at most the micro-batch
    of its sequences, each as long as the bucket's bound), or with --carry-state a stream micro-batch (a
    chunk of up to the longest bound for each of its rows)."""
    sizes = [batch_size(b, micro, tpmb) for b in bounds]
    tokens = max((min(int(c), s) * b for c, s, b in zip(train, sizes, bounds)), default=0)
    if carry_state and len(bounds):
        rows = max(1, tpmb // max(bounds)) if tpmb else micro
        tokens = max(tokens, min(rows, int(train.sum())) * max(bounds))
    return tokens


def process_bytes(model_cfg: ModelConfig, layout: Layout, tokens: int, device=None) -> int:
    """Bytes (estimated, app.model.memory) one training process needs: its share of the training state
    (ZeRO-3 spreads it evenly over the world; other layouts hold more), and its stage's share of the
    activations of a micro-batch of `tokens` padded tokens through the whole model, for each micro-batch
    the pipeline keeps in flight (1F1B: the first stage holds up to P of them, or the accumulation's); on a
    CUDA `device`, the GPU core's first call at the micro-batch's bucket and its op's other paths
    (app.model.first_call)."""
    element = 2 if layout.precision in ("bf16", "fp16") else 4
    state = training_state_bytes(model_cfg) // layout.world_size + ENGINE_BYTES
    in_flight = min(layout.stages, max(1, layout.grad_accum))
    first = first_call_bytes(model_cfg, layout.micro_batch, device, backward=True, element=element)
    graphs = op_paths_bytes(model_cfg, tokens, device, element)
    return (
        state
        + in_flight * tokens * bytes_per_token(model_cfg, True, element) // layout.stages
        + first
        + graphs
    )


def _offload(ds_json: dict) -> str | None:
    """Where ZeRO offloads the optimizer or the parameters ("cpu", "nvme"), None when it does not."""
    zero = ds_json.get("zero_optimization")
    if not isinstance(zero, dict):
        return None
    keys = ("offload_optimizer", "offload_param")
    places = {sec.get("device") for k in keys if isinstance(sec := zero.get(k), dict)}
    return "nvme" if "nvme" in places else "cpu" if "cpu" in places else None


def model_line(model_cfg: ModelConfig) -> str:
    m = model_cfg
    return (
        f"a model of {matrix_parameters(m):,} parameters (model.hidden_dim {m.hidden_dim}, num_layers "
        f"{m.num_layers}, embed_dim {m.embed_dim}, vocab_size {m.vocab_size})"
    )


def training_part(
    model_cfg: ModelConfig, layout: Layout, tokens: int, processes: int, where: str, device=None
) -> Part:
    """The training state and a micro-batch's activations of `processes` processes (`process_bytes`)."""
    state = training_state_bytes(model_cfg) // layout.world_size
    need = process_bytes(model_cfg, layout, tokens, device)
    if state >= need - state - ENGINE_BYTES:  # the model's state against the activations
        hint = "use a smaller model (model.hidden_dim, model.num_layers, model.embed_dim) or more processes"
    else:
        hint = "lower --micro-batch or --tokens-per-micro-batch"
    what = (
        f"training {model_line(model_cfg)} with micro-batches of up to {tokens:,} padded tokens "
        f"({processes} of the run's {layout.world_size} process(es) {where})"
    )
    return need * processes, what, hint


def samples_part(cfg: TrainConfig, model_cfg: ModelConfig, prompts: list[str]) -> Part:
    """Rank 0's samples at a validation: the whole model gathered on its CPU, then prompts x --samples rows
    of --sample-tokens after the longest prompt (its bytes: no tokenizer makes more tokens of them)."""
    rows = len(prompts) * cfg.samples
    if not rows:
        return 0, "", ""
    longest = max(len(p.encode()) for p in prompts) + 1  # BOS
    need = weight_bytes(model_cfg) + generation_bytes(rows, longest, cfg.sample_tokens, model_cfg)
    what = (
        f"--samples {cfg.samples} x {len(prompts)} prompt(s) of --sample-tokens {cfg.sample_tokens:,}, from "
        f"{model_line(model_cfg)} gathered on rank 0's CPU"
    )
    return need, what, "lower --samples or --sample-tokens (--samples 0: none)"


def check_run_fits(
    cfg: TrainConfig, model_cfg: ModelConfig, layout: Layout, data: RunData, ds_json: dict, prompts: list[str]
) -> None:
    """Every rank, before the engine exists: the run's memory (module docstring) against what this rank's
    device has free: on the CPU for this node's processes (LOCAL_SIZE), on CUDA for this rank's device; on the
    node of rank 0 (ranks are numbered node by node) with rank 0's samples of `prompts`, against the host's."""
    bounds = data.prepared.meta["buckets"]
    train = split_counts(data, False).get("train", np.zeros(len(bounds), np.int64))
    tokens = largest_micro_batch(
        train, bounds, layout.micro_batch, cfg.tokens_per_micro_batch, cfg.carry_state
    )
    local = int(os.environ.get("LOCAL_SIZE", "1"))
    here = int(os.environ.get("RANK", "0")) < local
    samples = samples_part(cfg, model_cfg, prompts) if here else (0, "", "")
    if not torch.cuda.is_available():
        training = training_part(model_cfg, layout, tokens, local, "on this node")
        refuse_over(available_memory("cpu"), [training, samples])
        return
    device = f"cuda:{os.environ.get('LOCAL_RANK', '0')}"
    offload = _offload(ds_json)
    if offload != "nvme":
        free = available_memory(device)
        if free is not None and offload == "cpu":
            free += available_memory("cpu") or 0
        part = training_part(model_cfg, layout, tokens, 1, f"on {device}", device)
        refuse_over(free, [part], f" on {device}")
    refuse_over(available_memory("cpu"), [samples])
