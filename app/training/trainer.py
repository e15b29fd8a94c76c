"""The training run: configure -> setup -> fit (the loop) -> finish (final evaluation, save, summary).

`fit` reads like the algorithm: ask the run's length for the step's lr (or stop), take the step's global
batch, one optimizer step, log, maybe validate, maybe save (the length says when). Everything it uses is
built once before it (`setup`, its steps in startup.py) from one frozen config (`plan_run`, the resolve
step); data is opened in one place (`RunData`); where the run stands (`TrainState`) is the only thing the
loop changes, and it is what a checkpoint records. The hooks' work lives beside them: held-out scoring
(app/evaluation/), samples (samples.py), the checkpoint (saving.py), its W&B artifact (artifacts.py), the
summary (summary.py).
"""

from __future__ import annotations

import itertools
import json
import math
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist

from app.batching.buckets import collate
from app.checkpoints import resume as resume_check
from app.checkpoints import training as ckpt
from app.checkpoints import universal
from app.checkpoints.run_lock import acquire_run_lock
from app.checkpoints.warm_start import resumed_model_fields
from app.common import faults, phase_clock
from app.common.errors import set_log_dir
from app.common.files import atomic_write
from app.common.logs import setup_logging
from app.common.version import code_version
from app.evaluation.held_out import evaluate
from app.parallel.gather import gather_full_state
from app.parallel.layout import DeepSpeedJson
from app.parallel.precision import check_precision
from app.parallel.runtime import (
    arm_collective_timeout,
    deterministic_default,
    init_distributed,
    seed_everything,
    set_threads,
)
from app.training import bounds, carry_state, startup
from app.training.artifacts import log_saved_checkpoint
from app.training.config import TrainConfig
from app.training.metrics import StepStats, untrained_note
from app.training.plan import open_inputs, plan_run
from app.training.plots import plot_run
from app.training.preemption import EXIT_PREEMPTED, Preemption
from app.training.samples import RunSamples, samples_at_end
from app.training.saving import save_checkpoint
from app.training.state import TrainState
from app.training.summary import finish_run
from app.training.tracking import truncate_metrics

EXIT_NON_FINITE = 3  # the exit status when too many consecutive steps were skipped


class Trainer:
    def __init__(self, cfg: TrainConfig, ds: DeepSpeedJson, model_overrides: dict) -> None:
        """Configure: configs, data and layout checked (cheap, so `--dry-run` stops right after)."""
        self.log = setup_logging(cfg.verbose)
        # before any process group: bad data or a bad model config fails in a second
        self.data, self.model_cfg = open_inputs(cfg, model_overrides, self._info_rank0)
        self.init_source = None  # --init-from, checked before any process group: one line if it does not fit
        if cfg.init_from and resumed_model_fields(cfg.out, cfg.resume) is None:  # a resume never reads it
            self.init_source = startup.init_source_of(cfg.init_from, self.model_cfg, self.data)
        self.samples = RunSamples(cfg, self.model_cfg, self.data, self.log)  # reads --sample-prompts
        warn = self.log.warning if int(os.environ.get("RANK", "0")) == 0 else None  # the caps' lines
        init_distributed(bounds.cap_timeout(cfg.dist_timeout_s, None))  # plan_run records it, in one line
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.threads = set_threads()
        self.plan = plan = plan_run(cfg, ds, self.data, self.model_cfg, self.world, warn, self._info_rank0)
        self.cfg = cfg = plan.cfg  # frozen: lr, batch, precision, caps and step counts as in force
        self.layout, self.length = plan.layout, plan.length
        plan.check_fits(self.samples.prompts)  # before any weight, state or batch of the model exists
        if self.rank == 0:
            device_type = "cuda" if torch.cuda.is_available() else "cpu"
            check_precision(self.layout.precision, device_type, plan.ds_source, self.log)
        seed_everything(cfg.seed, deterministic_default(cfg.deterministic))
        self.steps_per_epoch = plan.steps_per_epoch
        self.run_dir, self.root = Path(cfg.out), Path(cfg.out) / "checkpoints"
        self.resolved = plan.resolved(self.threads)
        self.resolved["code"] = code_version()  # config.json, checkpoints, W&B: the code that ran
        self.state = TrainState()
        self.preemption = Preemption()
        self.preemption.install()  # after init_distributed: the launcher watch keeps the default handlers
        self._validation_at: tuple[int, dict | None] = (-1, None)  # (step, its validation loss record)
        self._info(plan.describe(self.threads))

    def _info(self, msg: str) -> None:
        if self.rank == 0:
            self.log.info(msg)

    def _info_rank0(self, msg: str) -> None:
        """Before the process group exists: rank 0 as the launcher numbers it."""
        if int(os.environ.get("RANK", "0")) == 0:
            self.log.info(msg)

    # ---- setup: engine, resume, tracking (the steps: startup.py)
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
        warm = (
            startup.warm_start(self.init_source, self.plan, self._info) if saved is None else None
        )  # --init-from
        self.engine = startup.build_engine(
            self.plan, recorded_costs=recorded_costs, load_universal=self._universal, init_weights=warm
        )
        self.resolved |= {"layer_costs": self.engine.layer_costs, "partition": self.engine.partition}
        if self.layout.stages > 1:
            stages = [list(range(a, b)) for a, b in itertools.pairwise(self.engine.partition)]
            where = f", as recorded in {tag}" if recorded_costs else ""
            self._info(f"stages hold layers {stages} (--partition-method {cfg.partition_method}{where})")
        self.n_params = startup.count_parameters(self.engine, self.layout.data_parallel)
        self._carried = carry_state.attach(self.engine.module) if cfg.carry_state else None
        if self.rank == 0:
            self.root.mkdir(parents=True, exist_ok=True)
            ckpt.prune(self.root, keep_last=10**9)  # drop saves a crash interrupted; complete ones stay
        dist.barrier()
        if saved is not None:
            self.state = startup.resume_from(
                self.engine,
                self.root,
                tag,
                saved,
                rank=self.rank,
                re_sliced=self._universal,
                carried=self._carried,
                init_from=cfg.init_from,
                info=self._info,
            )
        self.length.start(cfg, self.data, self.n_params, self.state, self.engine.device, self.rank, self.log)
        peak = startup.measure_peak(self.plan, self.engine)  # every rank: timed together, summed
        self.tracker = self.metrics = None
        if self.rank == 0:
            atomic_write(self.run_dir / "config.json", json.dumps(self.resolved, indent=1, default=str))
            last_logged = truncate_metrics(self.run_dir, self.state.step)
            rewind_to = self.state.step if last_logged > self.state.step else None
            self.tracker, self.metrics = startup.start_tracking(
                self.plan, self.resolved, self.state, peak, rewind_to, self.log
            )

    def _choose_resume(self) -> tuple[str | None, dict | None]:
        """Lock --out, let rank 0 pick the tag, and check it before any of its weights are read."""
        identity = startup.run_identity(self.data, self.model_cfg)
        tag = resume_check.rank0_decides(self._lock_and_pick, self.rank)
        set_log_dir(self.run_dir / "logs")  # --out accepted: error tracebacks go into the run from now on
        if tag is None:
            return None, None
        return tag, startup.check_resume_tag(tag, self.cfg, self.layout, self.data, identity)

    def _lock_and_pick(self) -> str | None:
        """Rank 0: hold --out's lock for the run's life, then pick the (verified) tag to resume from."""
        self._lock = acquire_run_lock(self.run_dir)
        return resume_check.pick_resume_tag(self.root, self.cfg.resume)

    # ---- the loop
    def fit(self) -> int:
        """Train until the run's length says stop; returns the process exit status."""
        cfg, st, length = self.cfg, self.state, self.length
        if cfg.sanity_eval_batches:
            self.validate("validation", "sanity", cfg.sanity_eval_batches)
        arm_collective_timeout(cfg.dist_timeout_s)  # start-up done: --dist-timeout-s bounds every wait now
        self._loop_start, self._spent_before = time.monotonic(), st.train_seconds  # the budget's clock
        schedule = self.data.schedule("train")
        plan, plan_epoch = None, -1
        while True:
            ask = length.next_step(st.step, self.engine.updates_applied(), self._elapsed())  # every rank
            if ask.stop:
                break
            self.engine.set_lr_scale(ask.lr_scale)  # the step's lr: the run's length is its one source
            epoch, k = divmod(st.step, self.steps_per_epoch)
            if epoch != plan_epoch:
                plan, plan_epoch = schedule.epoch(epoch), epoch
            self.train_step(plan[k])
            phase_clock.CLOCK.first_step(self._info)  # once: where the time to the first step went
            if st.consecutive_skips >= cfg.max_consecutive_skips:  # every rank agrees: the decision is global
                return self._stop_non_finite()
            if length.validates_after(st.step):
                self.validate("validation", "val", cfg.eval_max_batches, periodic=True)
            if length.saves_after(st.step):
                self.save()
            faults.hang_after(st.step)
            faults.user_error_after(st.step)
            faults.await_signal_after(st.step, self.preemption.received)
            if (signame := self.preemption.agreed(self.engine.device)) is not None:  # every rank, every step
                return self._stop_preempted(signame)
        return self.finish()

    def _elapsed(self) -> float:
        """Training seconds so far: earlier runs' (from the checkpoint) plus this run's loop."""
        return self._spent_before + time.monotonic() - self._loop_start

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
        self.length.note_step(time.perf_counter() - t_start, tokens)
        st.step += 1
        st.tokens += tokens
        st.bytes += (num_bytes := sum(mb.num_bytes for mb in global_mbs))
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
                bytes_seen=st.bytes,
                elapsed_s=self._elapsed(),
                padded=sum(mb.padded for mb in global_mbs),
                num_bytes=num_bytes,
                seconds=dt,
                skipped_total=st.skipped_total,
            )
        )

    # ---- the hooks: validation (with samples and plots), save
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
        self.length.note_eval(seconds, res.tokens, periodic)
        if self.rank == 0:
            self.log.info(
                f"{prefix} @ step {step}: loss {res.loss:.4f} nats/token | ppl {res.perplexity:.2f} | "
                f"{res.bits_per_byte:.4f} bits/byte | {res.tokens} tokens in {seconds:.1f}s"
                + (untrained_note(self.data.tokenizer) if prefix == "sanity" else "")
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
        if self.rank == 0:
            self.samples.take(state, self.state.step, self.tracker)

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
        t0 = time.perf_counter()
        if self.rank == 0:
            st.train_seconds = self._elapsed()  # what a resume continues from
            self.length.record(st)  # a budget's: where the decay started, the schedule decided
        tag = save_checkpoint(
            self.plan,
            self.engine,
            st,
            self.resolved,
            self._validation_at,
            rank=self.rank,
            carried=self._carried,
            log=self.log,
        )
        st.last_saved = st.step
        self.length.note_save(time.perf_counter() - t0)
        if self.rank == 0:
            last, mode = self.length.ends_at(st.step), self.cfg.wandb_artifacts
            log_saved_checkpoint(
                self.tracker, self.run_dir, self.root, tag, step=st.step, mode=mode, last=last, log=self.log
            )

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
            finish_run(
                self.tracker,
                final,
                st,
                params=self.n_params,
                train_seconds=self._elapsed(),
                stopped_by=self.length.stopped_by,
                budget_s=self.length.budget_s,
                code=self.resolved["code"],
                run_dir=self.run_dir,
                log=self.log,
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
