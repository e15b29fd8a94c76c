"""The training run: configure -> setup -> fit (the loop) -> finish (final evaluation, save, summary).

`fit` reads like the algorithm: take the step's global batch, one optimizer step, log, maybe validate,
maybe save. Everything it uses is built once before it; data is opened in one place (`RunData`); where
the run stands (`TrainState`) is the only thing the loop changes, and it is what a checkpoint records.
"""

from __future__ import annotations

import functools
import itertools
import json
import math
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from app.batching.buckets import collate
from app.checkpoints import resume as resume_check
from app.checkpoints import training as ckpt
from app.checkpoints import universal
from app.checkpoints.run_lock import acquire_run_lock
from app.checkpoints.safety import verify_tag_files, weights_only_loads
from app.checkpoints.save_guard import deepspeed_save, run_on_all_ranks
from app.checkpoints.warm_start import load_into, open_init_source
from app.common import faults
from app.common.errors import set_log_dir
from app.common.files import atomic_write
from app.common.logs import setup_logging
from app.common.version import code_version
from app.evaluation.held_out import evaluate
from app.model.config import flops_per_token
from app.parallel.engine import Engine
from app.parallel.gather import gather_full_state
from app.parallel.layout import DeepSpeedJson, engine_config
from app.parallel.precision import check_precision
from app.parallel.runtime import (
    arm_collective_timeout,
    deterministic_default,
    init_distributed,
    seed_everything,
    set_threads,
)
from app.training import carry_state
from app.training.artifacts import log_model_artifact
from app.training.config import TrainConfig
from app.training.metrics import StepLogger, StepStats
from app.training.peak_flops import mfu_peak
from app.training.plan import open_inputs, plan_run
from app.training.plots import plot_run
from app.training.preemption import EXIT_PREEMPTED, Preemption
from app.training.samples import read_prompts, sample_texts, samples_at_end
from app.training.schedule import lr_multiplier
from app.training.time_budget import TimeBudget
from app.training.tracking import Tracker, recorded_run_id, resolve_wandb_mode, truncate_metrics
from data_prep.tokenizer import load_tokenizer

EXIT_NON_FINITE = 3  # the exit status when too many consecutive steps were skipped


@dataclass(slots=True)
class TrainState:
    """Where the run stands; saved with every checkpoint and restored on resume."""

    step: int = 0
    skipped_total: int = 0
    consecutive_skips: int = 0
    tokens: int = 0  # tokens trained on so far (real ones, pads excluded)
    wandb_id: str | None = None
    last_saved: int = -1
    train_seconds: float = 0.0  # rank 0's training time up to the last save (--time-budget counts it)
    decay_from: float | None = None  # --time-budget: the budget fraction at which the warmup ended


class Trainer:
    def __init__(self, cfg: TrainConfig, ds: DeepSpeedJson, model_overrides: dict) -> None:
        """Configure: configs, data and layout checked (cheap, so `--dry-run` stops right after)."""
        self.log = setup_logging(cfg.verbose)
        # before any process group: bad data or a bad model config fails in a second
        self.data, self.model_cfg = open_inputs(cfg, model_overrides)
        self.init_source = None  # --init-from, checked before any process group: one line if it does not fit
        if cfg.init_from:
            prepared = self.data.prepared
            self.init_source = open_init_source(
                cfg.init_from, self.model_cfg, self.data.tokenizer, prepared.tokenizer_path
            )
        self.sample_prompts = read_prompts(cfg.sample_prompts) if cfg.samples else []
        self._sample_tokenizer = None
        init_distributed(cfg.dist_timeout_s)
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.threads = set_threads()
        plan = plan_run(cfg, ds, self.data, self.model_cfg, self.world)
        self.cfg = cfg = plan.cfg  # lr, batch and precision as in force
        self.ds_json, self.layout = plan.ds_json, plan.layout
        if self.rank == 0:
            device_type = "cuda" if torch.cuda.is_available() else "cpu"
            check_precision(self.layout.precision, device_type, plan.ds_source, self.log)
        seed_everything(cfg.seed, deterministic_default(cfg.deterministic))
        self.steps_per_epoch, self.total_steps = plan.steps_per_epoch, plan.total_steps
        self.run_dir = Path(cfg.out)
        self.root = self.run_dir / "checkpoints"
        self.resolved = plan.resolved(self.threads)
        self.resolved["code"] = code_version()  # config.json, checkpoints, W&B: the code that ran
        self.state = TrainState()
        self.preemption = Preemption()
        self.preemption.install()  # after init_distributed: the launcher watch keeps the default handlers
        self.budget: TimeBudget | None = None
        self.stopped_by = "steps"
        self._reserve_warned = False
        self._validation_at: tuple[int, dict | None] = (-1, None)  # (step, its validation loss record)
        lay = self.layout
        length = f"{self.total_steps} steps" if self.total_steps else "no step limit"
        if cfg.time_budget:
            length = f"time budget {cfg.time_budget:g} min, {length}"
        self._info(
            f"world {self.world} = {lay.stages} stages x {lay.data_parallel} data-parallel | "
            f"batch {lay.train_batch} = micro {lay.micro_batch} x accum {lay.grad_accum} x dp "
            f"{lay.data_parallel} | ZeRO-{lay.zero_stage} {lay.precision} | lr {cfg.lr:g} | "
            f"{length} ({self.steps_per_epoch}/epoch) | {self.threads} threads/process"
        )

    def _info(self, msg: str) -> None:
        if self.rank == 0:
            self.log.info(msg)

    # ---- setup: engine, resume, tracking
    def setup(self) -> None:
        """Build the engine (in the stage split a checkpoint fixes), resume, start tracking."""
        cfg = self.cfg
        tag, saved = self._choose_resume()
        # another layout: the checkpoint per parameter (rank 0 converts it), re-sliced for this one
        self._universal = saved is not None and universal.layout_changed(
            saved["layout"], self.layout.as_dict()
        )
        if self._universal:
            resume_check.rank0_decides(lambda: str(universal.convert(self.root, tag)), self.rank)
        # the same split as the checkpoint, so each stage's optimizer state fits its layers
        recorded_costs = saved["config"].get("layer_costs") if saved is not None else None
        self.engine = self._build_engine(recorded_costs, warm=saved is None)
        self.resolved["layer_costs"] = self.engine.layer_costs
        self.resolved["partition"] = self.engine.partition
        if self.layout.stages > 1:
            stages = [list(range(a, b)) for a, b in itertools.pairwise(self.engine.partition)]
            where = f", as recorded in {tag}" if recorded_costs else ""
            self._info(f"stages hold layers {stages} (--partition-method {cfg.partition_method}{where})")
        self.n_params = self._count_parameters()
        self._carried = carry_state.attach(self.engine.module) if cfg.carry_state else None
        if self.rank == 0:
            self.root.mkdir(parents=True, exist_ok=True)
            ckpt.prune(self.root, keep_last=10**9)  # drop saves a crash interrupted; complete ones stay
        dist.barrier()
        if saved is not None:
            self._resume(tag, saved)
        if self._universal:  # loaded on every rank: the per-parameter copy has done its work
            dist.barrier()
            if self.rank == 0:
                shutil.rmtree(universal.universal_dir(self.root, tag).parent, ignore_errors=True)
        if cfg.time_budget:
            self.budget = self._time_budget()
        self.tracker = self.metrics = None
        if self.rank == 0:
            atomic_write(self.run_dir / "config.json", json.dumps(self.resolved, indent=1, default=str))
            last_logged = truncate_metrics(self.run_dir, self.state.step)
            self._start_tracking(self.state.step if last_logged > self.state.step else None)

    def _choose_resume(self) -> tuple[str | None, dict | None]:
        """Lock --out, let rank 0 pick the tag, and check it before any of its weights are read."""
        identity = self._identity()
        tag = resume_check.rank0_decides(self._lock_and_pick, self.rank)
        set_log_dir(self.run_dir / "logs")  # --out accepted: error tracebacks go into the run from now on
        if tag is None:
            return None, None
        verify_tag_files(self.root / tag, self.run_dir)  # every rank: nothing outside, nothing to execute
        saved = ckpt.read_app_state(self.root / tag)
        resume_check.check_compatible(saved, identity, tag, self.run_dir, self.cfg.allow_data_change)
        ckpt.check_resumable(
            saved,
            tag,
            self.layout.as_dict(),
            self.data.schedule("train").fingerprint(),
            self.run_dir,
            self.cfg.allow_data_change,
        )
        return tag, saved

    def _lock_and_pick(self) -> str | None:
        """Rank 0: hold --out's lock for the run's life, then pick the (verified) tag to resume from."""
        self._lock = acquire_run_lock(self.run_dir)
        return resume_check.pick_resume_tag(self.root, self.cfg.resume)

    def _identity(self) -> dict:
        """What a checkpoint records so a resume can tell another model, tokenizer or data set."""
        prepared = self.data.prepared
        tok = prepared.tokenizer_path
        return {
            "model_config": self.model_cfg.to_dict(),
            "tokenizer_sha256": resume_check.file_sha256(tok),
            "data_fingerprint": resume_check.data_fingerprint(prepared.path / "meta.json"),
        }

    def _build_engine(self, recorded_costs: list[float] | None, warm: bool) -> Engine:
        lengths = self.data.store("train").lengths
        timing_len = max(8, int(np.median(lengths)))
        timing_batch = self.cfg.tokens_per_micro_batch // timing_len or self.layout.micro_batch
        lr_lambda = None  # --time-budget: the clock sets the lr before every step (Engine.set_lr_scale)
        if not self.cfg.time_budget:
            lr_lambda = functools.partial(
                lr_multiplier,
                warmup=self.cfg.warmup_steps,
                total=self.total_steps,
                decay=self.cfg.lr_decay,
                min_ratio=self.cfg.min_lr_ratio,
            )
        ds_config = engine_config(self.ds_json, self.layout)
        if self._universal:
            ds_config["checkpoint"] = {**ds_config.get("checkpoint", {}), "load_universal": True}
        return Engine(
            self.model_cfg,
            self.layout,
            ds_config,
            seed=self.cfg.seed,
            partition_method=self.cfg.partition_method,
            lr_lambda=lr_lambda,
            layer_costs=recorded_costs,
            timing_shape=(max(1, timing_batch), timing_len),
            init_weights=self._warm_start() if warm else None,
        )

    def _warm_start(self) -> Callable[[torch.nn.Module], None] | None:
        """--init-from on a fresh run: the weights every rank loads into its part before DeepSpeed starts."""
        if self.init_source is None:
            return None
        self._info(f"weights from {self.init_source.describe()}; fresh optimizer, schedule and step count")
        return load_into(self.init_source.state_dict())

    def _count_parameters(self) -> int:
        # Stages hold disjoint layers and replicas identical ones; ZeRO-3 keeps the true size in ds_numel.
        local = sum(getattr(p, "ds_numel", p.numel()) for p in self.engine.module.parameters())
        counted = torch.tensor(float(local), device=self.engine.device)
        dist.all_reduce(counted)
        return int(counted.item()) // self.layout.data_parallel

    def _resume(self, tag: str, saved: dict) -> None:
        where = universal.universal_dir(self.root, tag).parent if self._universal else self.root
        with weights_only_loads():  # DeepSpeed asks torch.load for weights_only=False: refused here
            self.engine.ds.load_checkpoint(str(where), tag=tag)
        if (self.root / tag / f"rng_rank{self.rank}.json").exists():  # a rank the writing layout had
            ckpt.set_rng_state(ckpt.read_rank_state(self.root / tag, self.rank))
        if self._carried is not None and (
            self._universal
            or not carry_state.load(self._carried, self.root / tag, self.rank, self.engine.device)
        ):
            self._info(
                f"--carry-state: no carried state in {tag} for this layout; every stream restarts from zero"
            )
        self.state = TrainState(
            step=saved["step"],
            skipped_total=saved["skipped_total"],
            tokens=saved.get("tokens", 0),  # absent in checkpoints written before it was recorded
            wandb_id=saved.get("wandb_id"),
            last_saved=saved["step"],
            train_seconds=float(saved.get("train_seconds", 0.0)),  # absent in checkpoints before the budget
            decay_from=saved.get("decay_from"),
        )
        self._info(
            f"resumed from {self.root / tag} at step {self.state.step} "
            f"({self.state.train_seconds:.0f} s of training before)"
            + (
                f"; written as {universal.describe(saved['layout'])}, re-sliced for this one"
                if self._universal
                else ""
            )
            + ("; --init-from ignored (it starts a run, this one resumes)" if self.cfg.init_from else "")
        )

    def _time_budget(self) -> TimeBudget:
        cfg = self.cfg
        tokens = {s: int(np.sum(self.data.store(s).lengths)) for s in ("validation", "test")}
        val_batches = self.data.schedule("validation").steps_per_epoch
        capped = min(1.0, cfg.eval_max_batches / max(1, val_batches)) if cfg.eval_max_batches else 1.0
        budget = TimeBudget(
            cfg.time_budget * 60.0,
            decay_from=self.state.decay_from,
            final_eval_tokens=tokens["validation"] + (tokens["test"] if cfg.test_eval else 0),
            periodic_eval_tokens=int(capped * tokens["validation"]),
            params=self.n_params,
            warmup=cfg.warmup_steps,
            decay=cfg.lr_decay,
            min_ratio=cfg.min_lr_ratio,
            eval_every=cfg.eval_every,
            save_every=cfg.save_every,
        )
        left = budget.budget_s - self.state.train_seconds
        self._info(
            f"time budget {cfg.time_budget:g} min ({left:.0f} s left): the lr decays over the training time, "
            f"which ends in time for the final evaluation and save (not step-reproducible)"
        )
        return budget

    def _elapsed(self) -> float:
        """Training seconds so far: earlier runs' (from the checkpoint) plus this run's loop."""
        return self._spent_before + time.monotonic() - self._loop_start

    def _budget_allows_a_step(self) -> bool:
        """Rank 0 decides (lr, stop) on its clock; every rank applies the same decision."""
        decision = torch.zeros(2, dtype=torch.float64, device=self.engine.device)
        if self.rank == 0:
            mult, stop = self.budget.decide(self.state.step, self._elapsed())
            decision[0], decision[1] = mult, float(stop)
            want = self.budget.estimated_reserve()
            if want > self.budget.reserve() and not self._reserve_warned:
                self._reserve_warned = True
                self.log.warning(
                    f"time budget: the final evaluation and save are estimated at {want:.0f} s, more than "
                    f"half the budget; keeping {self.budget.reserve():.0f} s (the run may end late). A smaller "
                    "validation split (data_prep --val-fraction) or --test-eval false shortens them"
                )
        dist.broadcast(decision, src=0)
        self.engine.set_lr_scale(float(decision[0]))
        if decision[1]:
            self.stopped_by = "time"
            if self.rank == 0:
                self.log.info(
                    f"time budget: stopping after step {self.state.step} at {self._elapsed():.0f} s of "
                    f"{self.budget.budget_s:.0f} s, keeping {self.budget.reserve():.0f} s for the final "
                    "evaluation and save"
                )
        return not decision[1]

    def _more_steps(self) -> bool:
        if self.total_steps is not None and self.state.step >= self.total_steps:
            return False
        return self.budget is None or self._budget_allows_a_step()

    def _start_tracking(self, rewind_to: int | None) -> None:
        cfg = self.cfg
        self.tracker = Tracker(
            self.run_dir,
            project=cfg.wandb_project,
            mode=resolve_wandb_mode(cfg.wandb_mode),
            name=cfg.wandb_run_name or self.run_dir.name,
            config=self.resolved,
            resume_id=self.state.wandb_id or recorded_run_id(self.run_dir),  # a crash before any save too
            rewind_to=rewind_to,
            system_metrics=cfg.wandb_system_metrics,
        )
        self.state.wandb_id = self.tracker.run_id
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(self.layout.precision, torch.float32)
        peak, peak_line = mfu_peak(dtype, self.engine.device)
        if self.rank == 0:
            self.log.info(peak_line)
        self.metrics = StepLogger(
            self.tracker,
            self.log,
            flops_per_token=flops_per_token(self.model_cfg),
            peak_flops=peak,
            world=self.world,
            total_steps=self.total_steps,
            steps_per_epoch=self.steps_per_epoch,
            log_every=cfg.log_every,
            progress=cfg.progress,
            initial_step=self.state.step,
        )

    # ---- the loop
    def fit(self) -> int:
        """Train to `total_steps`; returns the process exit status."""
        cfg, st = self.cfg, self.state
        if cfg.sanity_eval_batches:
            self.validate("validation", "sanity", cfg.sanity_eval_batches)
        arm_collective_timeout(cfg.dist_timeout_s)  # start-up done: --dist-timeout-s bounds every wait now
        self._loop_start, self._spent_before = time.monotonic(), st.train_seconds  # the budget's clock
        schedule = self.data.schedule("train")
        plan, plan_epoch = None, -1
        while self._more_steps():
            epoch, k = divmod(st.step, self.steps_per_epoch)
            if epoch != plan_epoch:
                plan, plan_epoch = schedule.epoch(epoch), epoch
            self.train_step(plan[k])
            if st.consecutive_skips >= cfg.max_consecutive_skips:  # every rank agrees: the decision is global
                return self._stop_non_finite()
            if cfg.eval_every and st.step % cfg.eval_every == 0 and st.step != self.total_steps:
                self.validate("validation", "val", cfg.eval_max_batches, periodic=True)
            if cfg.save_every and st.step % cfg.save_every == 0:
                self.save()
            faults.hang_after(st.step)
            faults.user_error_after(st.step)
            faults.await_signal_after(st.step, self.preemption.received)
            if (signame := self.preemption.agreed(self.engine.device)) is not None:  # every rank, every step
                return self._stop_preempted(signame)
        return self.finish()

    def train_step(self, global_mbs: list) -> None:
        """One optimizer step over the global batch `global_mbs` (this rank feeds its share)."""
        st = self.state
        t_start = time.perf_counter()
        tokens = sum(mb.tokens for mb in global_mbs)
        schedule, store = self.data.schedule("train"), self.data.store("train")
        mine = schedule.for_rank(global_mbs, self.engine.dp_rank)
        if self._carried is not None:
            carry_state.begin_step(self._carried, mine, self.engine.device)
        batches = None
        if self.engine.needs_data:
            batches = [collate(store, mb, self.data.bos, self.data.pad) for mb in mine]
        lr = self.engine.lr()  # the rate this step uses (the scheduler advances inside the step)
        t0 = time.perf_counter()
        loss = self.engine.train_step(batches, tokens, nan=faults.nan_at(st.step + 1))
        dt = time.perf_counter() - t0
        if self.budget is not None:
            self.budget.note_step(time.perf_counter() - t_start, tokens)
        st.step += 1
        st.tokens += tokens
        applied = self.engine.step_applied() and math.isfinite(loss)
        st.consecutive_skips = 0 if applied else st.consecutive_skips + 1
        st.skipped_total += 0 if applied else 1
        if self.rank != 0:
            return
        if not applied:
            self.log.warning(
                f"step {st.step}: non-finite loss/gradient (loss {loss}); update skipped on every rank"
            )
        self.metrics.record(
            StepStats(
                step=st.step,
                loss=loss,
                lr=lr,
                grad_norm=self.engine.grad_norm(),
                tokens=tokens,
                tokens_seen=st.tokens,
                padded=sum(mb.padded for mb in global_mbs),
                num_bytes=sum(mb.num_bytes for mb in global_mbs),
                seconds=dt,
                skipped_total=st.skipped_total,
            )
        )

    def validate(self, split: str, prefix: str, max_batches: int = 0, periodic: bool = False) -> dict:
        """Exact loss over `split` (at most `max_batches` global batches when > 0); logged under `prefix`."""
        t0 = time.perf_counter()
        store, schedule = self.data.store(split), self.data.schedule(split)
        # a full validation also yields the loss over the periodic ones' batches: checkpoints compare on it
        head_n = self.cfg.eval_max_batches if not max_batches else 0
        res, head = evaluate(self.engine, schedule, store, self.data.bos, self.data.pad, max_batches, head_n)
        out = res.as_dict(prefix)
        step, seconds = self.state.step, time.perf_counter() - t0
        if prefix == "val":  # what a save at this step records (best_tag picks the lowest)
            self._validation_at = (step, {"loss": head.loss, "max_batches": self.cfg.eval_max_batches})
        if self.budget is not None:
            self.budget.note_eval(seconds, res.tokens, periodic)
        if self.rank == 0:
            self.log.info(
                f"{prefix} @ step {step}: loss {res.loss:.4f} nats/token | ppl {res.perplexity:.2f} | "
                f"{res.bits_per_byte:.4f} bits/byte | {res.tokens} tokens in {seconds:.1f}s"
            )
            self.tracker.log_metrics(out, step)
        if not math.isfinite(res.loss):
            raise RuntimeError(f"{prefix} loss is not finite ({res.loss}) at step {step}")
        if prefix == "val" and not (periodic and samples_at_end(self.cfg.samples_at)):
            self._sample()
            self._plot()
        return out

    def _sample(self) -> None:
        """Every rank: the weights gathered to rank 0, which samples texts and logs them (never fatal)."""
        if not self.cfg.samples:
            return
        state = gather_full_state(self.engine)  # a collective: every rank, every layout
        if self.rank != 0:
            return
        cfg, t0 = self.cfg, time.perf_counter()
        try:
            if self._sample_tokenizer is None:
                self._sample_tokenizer = load_tokenizer(
                    self.data.tokenizer, self.data.prepared.tokenizer_path
                )
            rows = sample_texts(
                state,
                self.model_cfg,
                self._sample_tokenizer,
                self.sample_prompts,
                num_samples=cfg.samples,
                max_new_tokens=cfg.sample_tokens,
                seed=cfg.seed,
            )
            self.tracker.log_samples(rows, self.state.step)
        except Exception as e:  # samples are a view of the run, not part of it
            self.log.warning(f"samples @ step {self.state.step} failed ({e.__class__.__name__}: {e})")
            return
        self.log.info(
            f"samples @ step {self.state.step}: {len(rows)} in {time.perf_counter() - t0:.1f}s "
            f"({self.run_dir / 'samples.jsonl'}); first: {(rows[0]['prompt'] + rows[0]['text'])[:100]!r}"
        )

    def _plot(self) -> None:
        """Rank 0: redraw <out>/plots/*.png from metrics.jsonl (a drawing failure costs only the pictures)."""
        if self.rank != 0 or not self.cfg.plots:
            return
        try:
            plot_run(self.run_dir)
        except Exception as e:
            self.log.warning(f"plots not written ({e.__class__.__name__}: {e})")

    def save(self) -> None:
        """A complete checkpoint of this step on every rank, committed by rank 0 once all have written."""
        st = self.state
        tag = ckpt.tag_for(st.step)
        t0 = time.perf_counter()
        if self.rank == 0:
            st.train_seconds = self._elapsed()  # what a resume continues from
            st.decay_from = self.budget.decay_from if self.budget is not None else None

        def write() -> None:
            if self.rank == 0:
                ckpt.invalidate(self.root, tag)  # a rewritten tag is incomplete until its new manifest
            deepspeed_save(self.engine.ds, self.root, tag)
            ckpt.write_rank_state(self.root / tag, self.rank)
            faults.enospc_in_save(st.step, self.root / tag)
            if self._carried is not None:
                carry_state.save(self._carried, self.root / tag, self.rank)
            faults.crash_in_save(st.step)

        def commit() -> None:
            if self.rank != 0:
                return
            app_state = {
                "step": st.step,
                "skipped_total": st.skipped_total,
                "tokens": st.tokens,
                "sampler": self.data.schedule("train").fingerprint(),
                "wandb_id": st.wandb_id,
                "train_seconds": st.train_seconds,
                "decay_from": st.decay_from,
                "config": self.resolved,
                "model_config": self.model_cfg.to_dict(),
                "tokenizer": self.data.tokenizer,
                "layout": self.layout.as_dict(),
                **self._identity(),
            }
            at, validation = self._validation_at
            if at == st.step:
                app_state["validation"] = validation
            ckpt.commit(self.root, tag, app_state, self.world, self.data.prepared.tokenizer_path)
            removed = ckpt.prune(self.root, self.cfg.keep_last)
            self.log.info(
                f"saved {self.root / tag}" + (f" (removed {', '.join(removed)})" if removed else "")
            )

        # every rank learns of a failed write (disk full) on any rank: one line, the partial save removed
        run_on_all_ranks(write, self.root, tag, self.engine.device)
        run_on_all_ranks(commit, self.root, tag, self.engine.device)
        st.last_saved = st.step
        if self.budget is not None:
            self.budget.note_save(time.perf_counter() - t0)
        if self.rank == 0:
            self._log_model(tag)

    def _log_model(self, tag: str) -> None:
        """Rank 0: the checkpoint just saved, exported, as a W&B model artifact (--wandb-artifacts)."""
        mode = self.cfg.wandb_artifacts
        last = self.stopped_by == "time" or (
            self.total_steps is not None and self.state.step >= self.total_steps
        )
        if mode == "none" or (mode == "final" and not last) or self.tracker.run is None:
            return
        best = ckpt.best_tag(self.root) == tag  # the lowest validation loss so far: W&B moves "best" here
        aliases = [
            f"step-{self.state.step}",
            "latest",
            *(["final"] if last else []),
            *(["best"] if best else []),
        ]
        if log_model_artifact(self.tracker, self.run_dir, self.root / tag, aliases):
            self.log.info(f"W&B model artifact model-{self.tracker.run_id} ({', '.join(aliases)}) from {tag}")

    # ---- the end
    def finish(self) -> int:
        """Final validation, a save of the last step, the test split when asked, the summary."""
        st = self.state
        if self.metrics is not None:
            self.metrics.close()
        final = self.validate("validation", "val")
        if st.last_saved != st.step:
            self.save()
        if self.cfg.test_eval and len(self.data.store("test")):
            final |= self.validate("test", "test")
        if self.rank == 0:
            summary = {
                **final,
                "step": st.step,
                "skipped_total": st.skipped_total,
                "params": self.n_params,
                "train_seconds": round(self._elapsed(), 2),
                "stopped_by": self.stopped_by,
                "time_budget_s": self.budget.budget_s if self.budget is not None else None,
                "code": self.resolved["code"],
            }
            best = ckpt.best_tag(self.root)
            if best is not None:
                v = ckpt.read_app_state(self.root / best)["validation"]
                summary["best_checkpoint"] = {"tag": best, "val_loss": v["loss"]}
                n = v.get("max_batches") or 0
                over = f" over the first {n} batch{'es' if n > 1 else ''}, as periodic ones" if n else ""
                self.log.info(
                    f"lowest validation loss: {best} ({v['loss']:.4f} nats/token{over}); evaluate, export or "
                    f"sample it with --checkpoint {self.run_dir / ckpt.BEST}"
                )
            atomic_write(self.run_dir / "final_metrics.json", json.dumps(summary, indent=1))
            self.tracker.summary(summary)
            self.tracker.close()
            self.log.info(
                f"done: {st.step} steps, {self.n_params / 1e6:.2f}M parameters, {summary['train_seconds']:.0f} s "
                f"of training{'' if self.budget is None else f' of a {self.budget.budget_s:.0f} s budget'}; "
                f"run directory {self.run_dir}"
            )
        dist.barrier()
        return 0

    def _stop_preempted(self, signame: str) -> int:
        """A rank got a preemption signal: save this step (every rank), one line, EXIT_PREEMPTED."""
        st = self.state
        if self.metrics is not None:
            self.metrics.close()
        self._info(f"{signame} received: saving step {st.step} before stopping")
        if st.last_saved != st.step:
            self.save()
        if self.rank == 0:
            self.tracker.close()
            self.log.warning(
                f"preempted ({signame}) after step {st.step}: checkpoint {ckpt.tag_for(st.step)} saved; rerun "
                f"the same command to resume (exit {EXIT_PREEMPTED})"
            )
        dist.barrier()
        return EXIT_PREEMPTED

    def _stop_non_finite(self) -> int:
        st = self.state
        if self.rank == 0:
            self.log.error(
                f"stopping: {st.consecutive_skips} consecutive non-finite steps (up to step {st.step}); lower "
                f"the learning rate or check the data. Last good checkpoint: "
                f"{ckpt.find_resume_tag(self.root, None) or 'none'}"
            )
            self._plot()
            self.tracker.close()
        return EXIT_NON_FINITE
