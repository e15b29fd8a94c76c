"""Rank 0's training metrics: one record per step for the tracker, one compact line every N steps."""

from __future__ import annotations

import logging
import math
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass

from app.training.run_schedule import MEASURE_STEPS
from app.training.tracking import Tracker


def untrained_note(tokenizer: dict) -> str:
    """What the first evaluation of a byte model reads, said once (8 bits a byte looks like a bug): an
    untrained model spreads its probability over every id, log2(ids) bits a token, and a token is a byte."""
    if tokenizer.get("type") != "byte":
        return ""
    ids = int(tokenizer.get("vocab_size", 0))
    return (
        f" (an untrained byte model reads about log2({ids}) = {math.log2(ids):.2f} bits/byte, uniform over its "
        f"{ids} ids: the figure learning brings down)"
        if ids > 1
        else ""
    )


def fmt_count(x: float) -> str:
    for unit, div in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= div:
            return f"{x / div:.1f}{unit}"
    return f"{x:.0f}"


@dataclass(frozen=True, slots=True)
class StepStats:
    """What one optimizer step did, over the global batch."""

    step: int
    loss: float
    lr: float
    grad_norm: float | None
    tokens: int
    tokens_seen: int  # every step's tokens so far, this one's included (kept across a resume)
    bytes_seen: int  # the bytes of text they are
    elapsed_s: float  # training seconds so far, on the run's clock (kept across a resume)
    padded: int
    num_bytes: int
    seconds: float
    skipped_total: int


class StepLogger:
    """Tracker record per step, progress bar, and the log line every `log_every` steps (with an MFU)."""

    def __init__(
        self,
        tracker: Tracker,
        log: logging.Logger,
        *,
        flops_per_token: float,
        peak_flops: float,
        total_steps: int | None,
        steps_per_epoch: int,
        log_every: int,
        progress: bool,
        initial_step: int,
        schedule_line: Callable[[float], str | None] | None = None,
    ) -> None:
        """`schedule_line(seconds a step)`: the run's schedule, logged once the first steps are timed (None: a
        budgeted run's, said by its length as it decides it: app/training/run_length.py)."""
        self.tracker, self.log = tracker, log
        self.schedule_line, self.first_steps = schedule_line, []
        self.flops_tok, self.peak_all = flops_per_token, peak_flops  # the whole world's (peak_flops.py)
        self.total, self.spe, self.log_every = total_steps, steps_per_epoch, log_every
        self.window_tokens, self.window_time = 0, 0.0
        self._raised = False  # the peak was raised to a faster step's rate (said once)
        self.bar = None
        # Not on a terminal (a log file, a pipe, pdsh): a bar would be hundreds of carriage-return redraws
        # on one line; the metrics line every `log_every` steps is the log there.
        if progress and sys.stderr.isatty():
            from tqdm import tqdm

            self.bar = tqdm(
                total=total_steps, initial=initial_step, unit="step", dynamic_ncols=True, file=sys.stderr
            )

    def record(self, s: StepStats) -> None:
        self.window_tokens += s.tokens
        self.window_time += s.seconds
        gnorm = s.grad_norm if s.grad_norm is not None and math.isfinite(s.grad_norm) else float("nan")
        metrics = {
            "train/loss": s.loss,
            "train/bpb": s.loss * s.tokens / math.log(2) / max(1, s.num_bytes),
            "train/lr": s.lr,
            "train/grad_norm": gnorm,
            "train/tokens_per_s": s.tokens / s.seconds,
            "train/padding_efficiency": s.tokens / max(1, s.padded),
            "train/skipped_steps": s.skipped_total,
            "train/mfu": self._mfu(self.flops_tok * s.tokens / s.seconds),
            "train/tflops": self.flops_tok * s.tokens / s.seconds / 1e12,  # achieved, beside the MFU
            "train/epoch": s.step / self.spe,
            "train/tokens": s.tokens_seen,
            "train/bytes": s.bytes_seen,
            "train/elapsed_s": s.elapsed_s,
        }
        self.tracker.log_metrics(metrics, s.step)
        if self.schedule_line is not None:
            self.first_steps.append(s.seconds)
            if len(self.first_steps) == MEASURE_STEPS:
                if (line := self.schedule_line(statistics.median(self.first_steps))) is not None:
                    self.log.info(line)
                self.schedule_line = None
        if self.bar is not None:
            self.bar.update(1)
            self.bar.set_postfix(loss=f"{s.loss:.3f}", tok_s=fmt_count(s.tokens / s.seconds))
        if s.step % self.log_every == 0 or s.step == self.total:
            tps = self.window_tokens / max(self.window_time, 1e-9)
            # no total: a --time-budget run, which the clock stops
            of = "" if self.total is None else f"/{self.total}"
            line = (
                f"step {s.step}{of} | loss {s.loss:.4f} | bpb {metrics['train/bpb']:.3f} | "
                f"lr {s.lr:.2e} | gnorm {gnorm:.3f} | tok/s {fmt_count(tps)} | "
                f"pad {metrics['train/padding_efficiency']:.3f} | mfu {self._mfu(self.flops_tok * tps):.1%} "
                f"({self.flops_tok * tps / 1e12:.3g} TFLOP/s) | skipped {s.skipped_total}"
            )
            self.log.info(line)  # through the bar when one is on screen (app.common.logs)
            self.window_tokens, self.window_time = 0, 0.0

    def _mfu(self, flops_per_s: float) -> float:
        """MFU of a rate, never above 1: a step faster than the machine's peak (one measured while the core
        was busy elsewhere, or a CPU that turbos under our load) makes that rate the peak, said once."""
        if flops_per_s > self.peak_all:
            if not self._raised:
                self.log.info(
                    f"MFU: a step ran at {flops_per_s / 1e12:.3f} TFLOP/s, above the machine's peak "
                    f"({self.peak_all / 1e12:.3f}): MFU is now against the fastest rate seen"
                )
                self._raised = True
            self.peak_all = flops_per_s
        return flops_per_s / self.peak_all

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
