"""One interface over DeepSpeed's two engines: PipelineEngine for P > 1, the plain engine for P = 1.

Both build from the same layer list (app.parallel.pipeline), so a checkpoint's layers and a run's loss
curve do not depend on the layout. The loss of a step is the mean cross-entropy over every real token of
the global batch: each micro-batch's summed loss is scaled by `grad_accum * dp / global_tokens`, and
DeepSpeed's division by grad_accum and averaging over data-parallel ranks undo the factor exactly.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import deepspeed
import torch
import torch.distributed as dist
from deepspeed.accelerator import get_accelerator
from torch.optim.lr_scheduler import LambdaLR

from app.common import phase_clock
from app.model import gpu_health
from app.model.config import ModelConfig
from app.model.loss import token_loss
from app.parallel.layout import Layout
from app.parallel.optimizer import choose_adam
from app.parallel.partition import pipeline_layer_costs
from app.parallel.pipeline import build_pipeline, build_sequential

Batch = tuple[torch.Tensor, torch.Tensor]  # (inputs, targets), both (B, T) int64


class Engine:
    def __init__(
        self,
        model_cfg: ModelConfig,
        layout: Layout,
        ds_config: dict,
        *,
        seed: int,
        partition_method: str,
        inference: bool = False,
        layer_costs: list[float] | None = None,
        timing_shape: tuple[int, int] | None = None,
        init_weights: Callable[[torch.nn.Module], None] | None = None,
    ) -> None:
        """The optimizer's lr is the DeepSpeed config's peak until `set_lr_scale` sets a step's share of it.
        `inference=True`: no optimizer or scheduler (evaluation only; `train_step` is unavailable).

        P > 1: `layer_costs` (recorded by an earlier run) fix the split; else `partition_method` decides,
        "time" timing each layer on a (batch, seq_len) `timing_shape` (default (micro_batch, 64)).
        `self.layer_costs` and `self.partition` (stage boundaries) record what was used.
        `init_weights(module)` sets the built module's weights (a warm start) before DeepSpeed copies them
        into its optimizer's master weights and partitions.
        """
        self.layout = layout
        self.is_pipe = layout.stages > 1
        self.layer_costs = None
        if self.is_pipe:
            if layer_costs is None:
                device = torch.device(get_accelerator().current_device_name())
                batch, seq_len = timing_shape or (layout.micro_batch, 64)
                layer_costs = pipeline_layer_costs(partition_method, model_cfg, batch, seq_len, device)
            module = build_pipeline(
                model_cfg,
                num_stages=layout.stages,
                loss_fn=token_loss,
                partition_method=partition_method if layer_costs is None else "cost",
                base_seed=seed,
                costs=layer_costs,
            )
            self.layer_costs = layer_costs
            self.partition = [int(p) for p in module.parts]
        else:
            module = build_sequential(model_cfg, base_seed=seed)
            self.partition = [0, model_cfg.num_layers + 2]
        if init_weights is not None:
            init_weights(module)
        if inference:
            self.ds, *_ = deepspeed.initialize(model=module, config=ds_config)
        else:
            offload = (ds_config.get("zero_optimization") or {}).get("offload_optimizer", {}).get("device")
            ds_config, why = choose_adam(
                ds_config, get_accelerator().device_name(), offload in ("cpu", "nvme"), agree=_all_ranks
            )
            if dist.get_rank() == 0:
                logging.getLogger(__name__).info(why)
            self.ds, *_ = deepspeed.initialize(
                model=module,
                model_parameters=[p for p in module.parameters() if p.requires_grad],
                config=ds_config,
                # a constant scheduler: it holds the peak lr (its base_lrs), which a checkpoint keeps and a resume
                # restores; each step's lr is set by `set_lr_scale`
                lr_scheduler=lambda opt: LambdaLR(opt, _peak),
            )
        if self.is_pipe:
            self.dp_rank = self.ds.grid.get_data_parallel_rank()
            self.needs_inputs = self.ds.is_first_stage()
            self.needs_targets = self.ds.is_last_stage()
        else:
            self.dp_rank = dist.get_rank()
            self.needs_inputs = self.needs_targets = True
        self.device = self.ds.device

    def _mark_first_forward(self, module, args, out) -> None:
        """The first forward's end on the phase clock (a GPU waited for, once), then the hook goes."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        phase_clock.mark("first forward")
        self._first_forward.remove()

    @property
    def needs_data(self) -> bool:
        return self.needs_inputs or self.needs_targets

    @property
    def module(self) -> torch.nn.Module:
        return self.ds.module

    def _feed(self, batches: list[Batch] | None, scale: float):
        if batches is None:
            return None
        s = torch.tensor([scale], dtype=torch.float32)
        return iter([(x, (y, s)) for x, y in batches])

    def train_step(self, batches: list[Batch] | None, global_tokens: int, nan: bool = False) -> float:
        """One optimizer step over this rank's micro-batches; returns the global mean loss (nats/token). Once
        the loss is read (the host waits for the step there anyway) the GPU core's health flags are read: a loop
        whose grid barrier gave up left NaN in this step (DeepSpeed's optimizers skip a non-finite update, and
        the trainer counts the step as skipped) and leaves its shape's ranking, in one warning line."""
        if phase_clock.first("data ready"):  # the first step's batches: its forward is the next one
            self._first_forward = self.ds.module.register_forward_hook(self._mark_first_forward)
        loss = self._train_step(batches, global_tokens, nan)
        if gpu_health.active():
            gpu_health.check()
        return loss

    def _train_step(self, batches: list[Batch] | None, global_tokens: int, nan: bool) -> float:
        L = self.layout
        scale = float("nan") if nan else (L.grad_accum * L.data_parallel / max(1, global_tokens))
        if self.is_pipe:
            return float(self.ds.train_batch(self._feed(batches, scale)))
        self.ds.train()
        local = torch.zeros((), dtype=torch.float64, device=self.device)
        s = torch.tensor([scale], dtype=torch.float32, device=self.device)
        for x, y in batches:
            logits = self.ds(x.to(self.device))
            loss = token_loss(logits, (y.to(self.device), s))
            self.ds.backward(loss)
            self.ds.step()
            local += loss.detach().double()
        dist.all_reduce(local)
        return float(local) / (L.grad_accum * L.data_parallel)

    @torch.no_grad()
    def eval_step(self, batches: list[Batch] | None, per_rank: int) -> float:
        """Summed cross-entropy (nats) over the micro-batches of every data-parallel rank. A sum that is not
        finite on a GPU is run once more by every rank together (each first reads its GPU core's flags: a loop
        whose barrier gave up there poisoned the sum, and is dropped; gpu_health.redo)."""
        nats = self._eval_step(batches, per_rank)
        if gpu_health.redo(nats, self.device):
            nats = self._eval_step(batches, per_rank)
        return nats

    def _eval_step(self, batches: list[Batch] | None, per_rank: int) -> float:
        dp = self.layout.data_parallel
        if self.is_pipe:
            # eval_batch averages over micro-batches and ranks; scaling by both turns it back into a sum.
            out = self.ds.eval_batch(self._feed(batches, float(per_rank * dp)), num_micro_batches=per_rank)
            return float(out)
        self.ds.eval()
        local = torch.zeros((), dtype=torch.float64, device=self.device)
        one = torch.ones(1, dtype=torch.float32, device=self.device)
        for x, y in batches:
            local += token_loss(self.ds(x.to(self.device)), (y.to(self.device), one)).double()
        dist.all_reduce(local)
        return float(local)

    def step_applied(self) -> bool:
        return bool(self.ds.was_step_applied())

    def grad_norm(self) -> float | None:
        g = self.ds.get_global_grad_norm()
        return None if g is None else float(g)

    def lr(self) -> float:
        return float(self.ds.get_lr()[0])

    def set_lr_scale(self, multiplier: float) -> None:
        """Set the next step's lr to the peak x `multiplier` in every parameter group (the training run's one
        lr source: app/training/run_length.py)."""
        sched = self.ds.lr_scheduler
        for group, peak in zip(sched.optimizer.param_groups, sched.base_lrs, strict=True):
            group["lr"] = peak * multiplier

    def updates_applied(self) -> int:
        """Optimizer updates applied so far: steps taken less those skipped for a non-finite gradient. A
        checkpoint keeps both counters (DeepSpeed's own), so a resume continues the count."""
        return int(self.ds.global_steps - self.ds.skipped_steps)


def _peak(step: int) -> float:
    return 1.0


def _all_ranks(ok: bool) -> bool:
    """Whether `ok` holds on every rank (an optimizer choice all ranks must share)."""
    flag = torch.tensor([int(ok)], device=get_accelerator().current_device_name())
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return bool(flag.item())
