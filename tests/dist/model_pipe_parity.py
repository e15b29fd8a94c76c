"""Pipeline vs sequential parity, run under the deepspeed launcher with 4 CPU processes (gloo).

Phase A: P=4 stages (dp=1), tied embeddings (tied weight split between stage 0 and 3).
Phase B: P=2 stages x dp=2, untied, "cost" partition, two steps with changing sequence lengths.
Each phase trains with SGD(lr=1) so a parameter's gradient is old - new; every rank compares the
gradients of its own stage's parameters, and the loss DeepSpeed reports, against the sequential
model (same seeds -> same weights) run in-process on the whole global batch. Results go to
<out_dir>/rank<r>.json for tests/test_parallel_pipeline.py to check.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
from pathlib import Path

# Run as a script: import this checkout's app/, not whatever `app` an installed copy points at.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import deepspeed
import torch

from app.model.config import debug_config
from app.model.loss import IGNORE_INDEX, loss_scale, token_loss
from app.parallel.pipeline import build_pipeline, build_sequential
from app.parallel.runtime import init_distributed

B, GAS, VOCAB = 3, 2, 61


def make_batch(gen: torch.Generator, T: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded batch: ids (B, T), targets (B, T) with -100 after each row's random length."""
    ids = torch.randint(0, VOCAB, (B, T), generator=gen)
    tgt = torch.randint(0, VOCAB, (B, T), generator=gen)
    lengths = torch.randint(1, T + 1, (B,), generator=gen)
    pad = torch.arange(T)[None, :] >= lengths[:, None]  # (B, T)
    ids[pad] = 0
    tgt[pad] = IGNORE_INDEX
    return ids, tgt


def run_phase(
    name: str, cfg, stages: int, lengths: list[list[list[int]]], partition: str, ckpt_dir: str | None = None
) -> dict:
    world, rank = torch.distributed.get_world_size(), torch.distributed.get_rank()
    dp = world // stages
    pipe = build_pipeline(cfg, num_stages=stages, loss_fn=token_loss, partition_method=partition)
    ds_cfg = {
        "train_batch_size": B * GAS * dp,
        "train_micro_batch_size_per_gpu": B,
        "gradient_accumulation_steps": GAS,
        "steps_per_print": 10**9,
        "zero_optimization": {"stage": 0},
    }
    opt = torch.optim.SGD(pipe.parameters(), lr=1.0)
    engine, _, _, _ = deepspeed.initialize(model=pipe, optimizer=opt, config=ds_cfg)
    seq = build_sequential(cfg)
    seq_params = dict(seq.named_parameters())

    def seq_name(n: str) -> str:
        return "0.weight" if n.startswith("tied_modules.") else n

    mine = dict(pipe.named_parameters())
    weights_match = all(torch.equal(p, seq_params[seq_name(n)]) for n, p in mine.items())
    dp_rank = engine.grid.data_parallel_id
    out = {"phase": name, "rank": rank, "stage": engine.stage_id, "parts": list(map(int, pipe.parts))}
    out.update(weights_match=weights_match, n_params=len(mine), steps=[])
    gen = torch.Generator().manual_seed(7)
    for step_lengths in lengths:  # one list per dp rank of micro-batch lengths
        batches = [[make_batch(gen, T) for T in per_rank] for per_rank in step_lengths]
        n_tokens = sum(int((t != IGNORE_INDEX).sum()) for per_rank in batches for _, t in per_rank)
        scale = loss_scale(n_tokens, GAS, dp)
        local = [(ids, (tgt, scale)) for ids, tgt in batches[dp_rank]]
        before = {n: p.detach().clone() for n, p in mine.items()}
        ds_loss = float(engine.train_batch(iter(local)))
        # Reference: mean CE over every real token of the global batch, one process, no DeepSpeed.
        seq.zero_grad()
        ref_loss = 0.0
        for per_rank in batches:
            for ids, tgt in per_rank:
                loss = token_loss(seq(ids), (tgt, loss_scale(n_tokens)))
                loss.backward()
                ref_loss += float(loss.detach())
        grad_err, grad_scale = 0.0, 0.0
        for n, p in mine.items():
            ref = seq_params[seq_name(n)].grad
            got = before[n] - p.detach()
            grad_err = max(grad_err, float((got - ref).abs().max()))
            grad_scale = max(grad_scale, float(ref.abs().max()))
        with torch.no_grad():  # keep the reference in step with the pipeline's SGD(lr=1)
            for p in seq.parameters():
                p -= p.grad
        out["steps"].append(
            dict(T=step_lengths, ds_loss=ds_loss, ref_loss=ref_loss, grad_err=grad_err, grad_scale=grad_scale)
        )
    if ckpt_dir is not None:  # record DeepSpeed's per-layer checkpoint layout (files and their keys)
        engine.save_checkpoint(ckpt_dir, tag="t")
        torch.distributed.barrier()
        tag_dir = os.path.join(ckpt_dir, "t")
        layer_files = sorted(f for f in os.listdir(tag_dir) if f.startswith("layer_"))
        out["ckpt"] = {
            f: sorted(torch.load(os.path.join(tag_dir, f), weights_only=True)) for f in layer_files
        }
    del engine, pipe, opt
    gc.collect()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out_dir", required=True)
    ap.add_argument("--local_rank", type=int, default=0)
    args = ap.parse_args()
    init_distributed()  # gloo on CPU; unlinks DeepSpeed's /dev/shm buffers at exit
    torch.manual_seed(0)
    rank = torch.distributed.get_rank()
    results = []
    tied = debug_config(VOCAB, embed_dim=64, hidden_dim=64, tie_embeddings=True)
    ckpt = os.path.join(args.out_dir, "ckpt")
    results.append(run_phase("p4_tied", tied, 4, [[[6, 9]]], partition="cost", ckpt_dir=ckpt))
    untied = debug_config(VOCAB, num_layers=3, residual=True)
    lengths = [[[7, 4], [10, 5]], [[3, 12], [8, 8]]]
    results.append(run_phase("p2_dp2_untied", untied, 2, lengths, partition="cost"))
    with open(os.path.join(args.out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(results, f)
    torch.distributed.barrier()


if __name__ == "__main__":
    main()
