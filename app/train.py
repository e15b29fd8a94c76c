"""Train an mLSTM language model with DeepSpeed: pipeline stages x ZeRO data parallelism.

    deepspeed --num_gpus 2 app/train.py --deepspeed_config ds_configs/cpu_pp2_zero1.json \
        --data data/default --pipeline-stages 2 --out runs/quickstart --max-steps 300

Rerunning the same command in the same --out resumes from its latest complete checkpoint.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script by the deepspeed launcher: import the repo, not app/
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

import argparse
import itertools
import json
import math
import os
import time

import numpy as np
import torch
import torch.distributed as dist

from app import checkpoint as ckpt
from app import faults
from app.cli_fields import add_dataclass_flags, collect_flags, parse_value
from app.config import TrainConfig
from app.data import BucketSchedule, TokenStore, collate
from app.ds_config import engine_config, load_ds_json, resolve_layout
from app.engine import Engine
from app.errors import UserError, exit_on_user_error
from app.evaluation import evaluate
from app.flops import measure_matmul_peak
from app.logs import setup_logging
from app.model.config import ModelConfig, flops_per_token
from app.presets import load_model_config
from app.runtime import exit_on_lost_peer, init_distributed, seed_everything, set_threads
from app.save_guard import deepspeed_save, run_on_all_ranks
from app.tracking import Tracker, resolve_wandb_mode


def parse_args(argv: list[str] | None) -> tuple[TrainConfig, str, dict, bool]:
    import deepspeed

    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False
    )
    p.add_argument("--local_rank", type=int, default=-1, help=argparse.SUPPRESS)  # set by the launcher
    deepspeed.add_config_arguments(p)
    add_dataclass_flags(p, TrainConfig)
    p.add_argument("--dry-run", action="store_true", help="Validate configs and data, print the plan, exit.")
    p.add_argument(
        "overrides",
        nargs="*",
        metavar="KEY=VALUE",
        help="model.<field>=V overrides the model config (e.g. model.hidden_dim=512); "
        "<field>=V or train.<field>=V sets a training field.",
    )
    ns = p.parse_args(argv)
    values = collect_flags(ns, TrainConfig)
    model_over: dict = {}
    for item in ns.overrides:
        key, eq, raw = item.partition("=")
        if not eq:
            raise UserError(f"override {item!r}: expected KEY=VALUE")
        if key.startswith("model."):
            model_over[key[6:]] = parse_value(ModelConfig, key[6:], raw)
        else:
            field = key.removeprefix("train.")
            values[field] = parse_value(TrainConfig, field, raw)
    try:
        cfg = TrainConfig(**values)
    except ValueError as e:
        raise UserError(str(e)) from None
    return cfg, ns.deepspeed_config, model_over, ns.dry_run


def fmt_count(x: float) -> str:
    for unit, div in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= div:
            return f"{x / div:.1f}{unit}"
    return f"{x:.0f}"


@exit_on_lost_peer
@exit_on_user_error
def main(argv: list[str] | None = None) -> int:
    cfg, ds_path, model_over, dry_run = parse_args(argv)
    log = setup_logging(cfg.verbose)
    ds_json = load_ds_json(ds_path)  # before any process group: a bad path fails in a second

    from data_prep.format import PreparedDataError, load_prepared

    try:
        data = load_prepared(cfg.data)
    except PreparedDataError as e:
        raise UserError(f"--data: {e}") from None
    tok = data.meta["tokenizer"]
    model_cfg = load_model_config(cfg.model_config, tok["vocab_size"], model_over)

    init_distributed(cfg.dist_timeout_s)
    rank, world = dist.get_rank(), dist.get_world_size()
    threads = set_threads()
    layout = resolve_layout(ds_json, world, cfg.pipeline_stages, src=f"--deepspeed_config {ds_path}")
    if layout.zero_stage == 0 and layout.precision != "fp16":
        raise UserError(
            f"--deepspeed_config {ds_path}: ZeRO stage 0 has no non-finite-gradient check in DeepSpeed for "
            f"{layout.precision}; use stage 1 (the same memory use at data_parallel 1)"
        )
    seed_everything(cfg.seed, cfg.deterministic)

    train_store = TokenStore(data.split("train"))
    val_store = TokenStore(data.split("validation"))
    if len(train_store) == 0:
        raise UserError(f"--data {cfg.data}: the train split is empty")
    bounds = data.meta["buckets"]
    batch_args = dict(
        micro_batch=layout.micro_batch,
        grad_accum=layout.grad_accum,
        data_parallel=layout.data_parallel,
        seed=cfg.seed,
        tokens_per_micro_batch=cfg.tokens_per_micro_batch,
    )
    train_sched = BucketSchedule(train_store, bounds, **batch_args)
    val_sched = BucketSchedule(val_store, bounds, shuffle=False, **batch_args)
    spe = train_sched.steps_per_epoch
    total_steps = cfg.max_steps or max(1, math.ceil((cfg.epochs or 1.0) * spe))

    run_dir = Path(cfg.out)
    root = run_dir / "checkpoints"
    resolved = {
        "train": cfg.to_dict(),
        "model": model_cfg.to_dict(),
        "deepspeed": ds_json,
        "layout": _layout_dict(layout),
        "data": {"path": str(data.path), "tokenizer": tok, "splits": data.meta.get("splits")},
        "total_steps": total_steps,
        "steps_per_epoch": spe,
        "world_size": world,
        "threads_per_process": threads,
    }
    if rank == 0:
        log.info(
            f"world {world} = {layout.stages} stages x {layout.data_parallel} data-parallel | "
            f"batch {layout.train_batch} = micro {layout.micro_batch} x accum {layout.grad_accum} x dp "
            f"{layout.data_parallel} | ZeRO-{layout.zero_stage} {layout.precision} | "
            f"{total_steps} steps ({spe}/epoch) | {threads} threads/process"
        )
    if dry_run:
        if rank == 0:
            print(json.dumps(resolved, indent=1, default=str))
        return 0

    # ---- resume: what the checkpoint fixes (data order, stage split) is read before building the engine
    tag = ckpt.find_resume_tag(root, cfg.resume)
    state = ckpt.read_app_state(root / tag) if tag is not None else None
    if state is not None:
        ckpt.check_resumable(state, tag, _layout_dict(layout), train_sched.fingerprint(), run_dir)
    # the same split as the checkpoint, so each stage's optimizer state fits its layers
    recorded_costs = state["config"].get("layer_costs") if state is not None else None
    timing_len = max(8, int(np.median(train_store.lengths)))
    timing_batch = cfg.tokens_per_micro_batch // timing_len or layout.micro_batch
    engine = Engine(
        model_cfg,
        layout,
        engine_config(ds_json, layout),
        seed=cfg.seed,
        partition_method=cfg.partition_method,
        total_steps=total_steps,
        warmup=cfg.warmup_steps,
        decay=cfg.lr_decay,
        min_lr_ratio=cfg.min_lr_ratio,
        layer_costs=recorded_costs,
        timing_shape=(max(1, timing_batch), timing_len),
    )
    resolved["layer_costs"] = engine.layer_costs
    resolved["partition"] = engine.partition
    if rank == 0 and layout.stages > 1:
        log.info(
            f"stages hold layers {[list(range(a, b)) for a, b in itertools.pairwise(engine.partition)]} "
            f"(--partition-method {cfg.partition_method}{', as recorded in ' + tag if recorded_costs else ''})"
        )
    # Stages hold disjoint layers and replicas identical ones; ZeRO-3 keeps the true size in ds_numel.
    local = sum(getattr(p, "ds_numel", p.numel()) for p in engine.module.parameters())
    counted = torch.tensor(float(local), device=engine.device)
    dist.all_reduce(counted)
    n_params = int(counted.item()) // layout.data_parallel

    step, skipped_total, wandb_id = 0, 0, None
    if rank == 0:
        run_dir.mkdir(parents=True, exist_ok=True)
        root.mkdir(exist_ok=True)
        ckpt.prune(root, keep_last=10**9)  # drop saves a crash interrupted; complete ones stay
    dist.barrier()
    if state is not None:
        engine.ds.load_checkpoint(str(root), tag=tag)
        ckpt.set_rng_state(ckpt.read_rank_state(root / tag, rank))
        step, skipped_total, wandb_id = state["step"], state["skipped_total"], state.get("wandb_id")
        if rank == 0:
            log.info(f"resumed from {root / tag} at step {step}")
    if rank == 0:
        (run_dir / "config.json").write_text(json.dumps(resolved, indent=1, default=str))
        _truncate_metrics(run_dir / "metrics.jsonl", step)

    tracker = None
    if rank == 0:
        mode = resolve_wandb_mode(cfg.wandb_mode)
        tracker = Tracker(
            run_dir,
            project=cfg.wandb_project,
            mode=mode,
            name=cfg.wandb_run_name or run_dir.name,
            config=resolved,
            resume_id=wandb_id,
        )
        wandb_id = tracker.run_id
    bos, pad = tok["bos_id"], tok["pad_id"]

    def run_eval(sched: BucketSchedule, store: TokenStore, prefix: str, max_steps: int = 0) -> dict:
        t0 = time.perf_counter()
        res = evaluate(engine, sched, store, bos, pad, max_steps)
        out = res.as_dict(prefix)
        if rank == 0:
            log.info(
                f"{prefix} @ step {step}: loss {res.loss:.4f} nats/token | ppl {res.perplexity:.2f} | "
                f"{res.bits_per_byte:.4f} bits/byte | {res.tokens} tokens in {time.perf_counter() - t0:.1f}s"
            )
            tracker.log_metrics(out, step)
        if not math.isfinite(res.loss):
            raise RuntimeError(f"{prefix} loss is not finite ({res.loss}) at step {step}")
        return out

    def save() -> None:
        tag = ckpt.tag_for(step)

        def write() -> None:
            deepspeed_save(engine.ds, root, tag)
            ckpt.write_rank_state(root / tag, rank)
            faults.crash_in_save(step)

        def commit() -> None:
            if rank != 0:
                return
            app_state = {
                "step": step,
                "skipped_total": skipped_total,
                "sampler": train_sched.fingerprint(),
                "wandb_id": wandb_id,
                "config": resolved,
                "model_config": model_cfg.to_dict(),
                "tokenizer": tok,
                "layout": _layout_dict(layout),
            }
            ckpt.commit(root, tag, app_state, world, data.tokenizer_path)
            removed = ckpt.prune(root, cfg.keep_last)
            log.info(f"saved {root / tag}" + (f" (removed {', '.join(removed)})" if removed else ""))

        # every rank learns of a failed write (disk full) on any rank: one line, the partial save removed
        run_on_all_ranks(write, root, tag, engine.device)
        run_on_all_ranks(commit, root, tag, engine.device)

    if cfg.sanity_eval_batches:
        run_eval(val_sched, val_store, "sanity", cfg.sanity_eval_batches)

    # ---- train
    flops_tok = flops_per_token(model_cfg)
    peak = measure_matmul_peak(
        {"bf16": torch.bfloat16, "fp16": torch.float16}.get(layout.precision, torch.float32), engine.device
    )
    bar = None
    if rank == 0 and cfg.progress:
        from tqdm import tqdm

        bar = tqdm(total=total_steps, initial=step, unit="step", dynamic_ncols=True, file=sys.stderr)
    consecutive_skips, plan, plan_epoch = 0, None, -1
    window_tokens, window_time, last_saved = 0, 0.0, step if tag else -1
    while step < total_steps:
        epoch, k = divmod(step, spe)
        if epoch != plan_epoch:
            plan, plan_epoch = train_sched.epoch(epoch), epoch
        global_mbs = plan[k]
        tokens = sum(mb.tokens for mb in global_mbs)
        mine = train_sched.for_rank(global_mbs, engine.dp_rank)
        batches = [collate(train_store, mb, bos, pad) for mb in mine] if engine.needs_data else None

        lr = engine.lr()  # the rate this step uses (the scheduler advances inside the step)
        t0 = time.perf_counter()
        loss = engine.train_step(batches, tokens, nan=faults.nan_at(step + 1))
        dt = time.perf_counter() - t0
        step += 1
        applied = engine.step_applied() and math.isfinite(loss)
        consecutive_skips = 0 if applied else consecutive_skips + 1
        skipped_total += 0 if applied else 1
        if not applied and rank == 0:
            log.warning(f"step {step}: non-finite loss/gradient (loss {loss}); update skipped on every rank")
        window_tokens += tokens
        window_time += dt
        if rank == 0:
            padded = sum(mb.padded for mb in global_mbs)
            gnorm = engine.grad_norm()
            nbytes = sum(mb.num_bytes for mb in global_mbs)
            metrics = {
                "train/loss": loss,
                "train/bpb": loss * tokens / math.log(2) / max(1, nbytes),
                "train/lr": lr,
                "train/grad_norm": gnorm if gnorm is not None and math.isfinite(gnorm) else float("nan"),
                "train/tokens_per_s": tokens / dt,
                "train/padding_efficiency": tokens / max(1, padded),
                "train/skipped_steps": skipped_total,
                "train/mfu": flops_tok * tokens / dt / (peak * world),
                "train/epoch": step / spe,
            }
            tracker.log_metrics(metrics, step)
            if bar is not None:
                bar.update(1)
                bar.set_postfix(loss=f"{loss:.3f}", tok_s=fmt_count(tokens / dt))
            if step % cfg.log_every == 0 or step == total_steps:
                tps = window_tokens / max(window_time, 1e-9)
                line = (
                    f"step {step}/{total_steps} | loss {loss:.4f} | bpb {metrics['train/bpb']:.3f} | "
                    f"lr {metrics['train/lr']:.2e} | gnorm {metrics['train/grad_norm']:.3f} | "
                    f"tok/s {fmt_count(tps)} | pad {metrics['train/padding_efficiency']:.3f} | "
                    f"mfu {flops_tok * tps / (peak * world):.1%} | skipped {skipped_total}"
                )
                (bar.write(line, file=sys.stderr) if bar is not None else log.info(line))
                window_tokens, window_time = 0, 0.0
        if consecutive_skips >= cfg.max_consecutive_skips:  # every rank agrees: the skip decision is global
            if rank == 0:
                log.error(
                    f"stopping: {consecutive_skips} consecutive non-finite steps (up to step {step}); lower the "
                    f"learning rate or check the data. Last good checkpoint: "
                    f"{ckpt.find_resume_tag(root, None) or 'none'}"
                )
                tracker.close()
            return 3
        if cfg.eval_every and step % cfg.eval_every == 0 and step < total_steps:
            run_eval(val_sched, val_store, "val", cfg.eval_max_batches)
        if cfg.save_every and step % cfg.save_every == 0:
            save()
            last_saved = step
        faults.hang_after(step)

    if bar is not None:
        bar.close()
    final = run_eval(val_sched, val_store, "val")
    if last_saved != step:
        save()
    if cfg.test_eval:
        test_store = TokenStore(data.split("test"))
        if len(test_store):
            final |= run_eval(
                BucketSchedule(test_store, bounds, shuffle=False, **batch_args), test_store, "test"
            )
    if rank == 0:
        summary = {**final, "step": step, "skipped_total": skipped_total, "params": n_params}
        (run_dir / "final_metrics.json").write_text(json.dumps(summary, indent=1))
        tracker.summary(summary)
        tracker.close()
        log.info(f"done: {step} steps, {n_params / 1e6:.2f}M parameters; run directory {run_dir}")
    dist.barrier()
    return 0


def _layout_dict(layout) -> dict:
    return {f: getattr(layout, f) for f in layout.__slots__}


def _truncate_metrics(path: Path, step: int) -> None:
    """On resume, drop records of steps after the checkpoint: the resumed run writes them again."""
    if not path.exists():
        return
    keep = [
        ln for ln in path.read_text().splitlines() if ln.strip() and json.loads(ln).get("step", 0) <= step
    ]
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(ln + "\n" for ln in keep))
    os.replace(tmp, path)


if __name__ == "__main__":
    sys.exit(main())
