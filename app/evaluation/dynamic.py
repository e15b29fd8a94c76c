"""Dynamic evaluation (Krause et al. 2018): adapt the weights to the text while reading it.

Each sequence is read in order, --dyn-segment tokens at a time, the recurrent state carried from one
segment to the next (gradients stop at segment boundaries). A segment is SCORED FIRST with the current
weights, and only then does its gradient move them, so no token is ever predicted by weights that have
seen it. The update is Krause et al.'s RMS-normalised step with decay towards the trained weights θ0:

    θ <- θ - lr * g / (RMS + eps) + decay * r * (θ0 - θ),     r = RMS / Σ_tensors mean(RMS), decay*r <= 1

RMS is the root of the mean squared gradient. Krause et al. measure it once on training data; here it is
the running mean over the segments already scored (an evaluation may have no training data), so the
first steps are sign-like and the normaliser settles as the text is read. The weights change only in
this process's private copy of the model: the checkpoint on disk is never written.

No step size is best on every text (bench/README.md: source code wants large steps, the novel small
ones), so --dyn-lr may name several. One learner then reads the text at each step size, one after another
on one copy of the model, and the score is their Bayesian mixture, computed from the learners' totals
(app/evaluation/mixture.py): within ln K nats of the best step size, chosen as the text is read.

The same loop with no update ("static, state carried") separates what carrying the state across
segments gains from what adapting the weights gains. Nothing is random (eval mode: no dropout), so the
result is a pure function of the checkpoint, the text and the settings.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from app.common.logs import Progress
from app.evaluation.mixture import mixture_nats, posterior
from app.model.lm import LanguageModel

EPS = 1e-8


@dataclass(frozen=True, slots=True)
class DynamicResult:
    carried_nats: float  # static weights, state carried across segments
    lrs: tuple[float, ...]  # the learners' step sizes
    learner_nats: tuple[float, ...]  # each learner's nats on the whole text
    tokens: int
    carried_seconds: float
    dynamic_seconds: float  # all learners

    @property
    def dynamic_nats(self) -> float:
        """The Bayesian mixture's code length over the step sizes (app/evaluation/mixture.py)."""
        return mixture_nats(self.learner_nats)

    def posterior(self) -> tuple[float, ...]:
        """Each step size's mixture weight after the whole text (proportional to exp(-L_k))."""
        return posterior(self.learner_nats)


class DynamicEvaluator:
    """Holds a private copy of the model, its trained weights θ0 and the running mean squared gradient;
    `lrs`: one step size per learner (the learners run one after another from θ0)."""

    def __init__(self, model: LanguageModel, lrs: Sequence[float], decay: float, segment: int) -> None:
        if not lrs:
            raise ValueError("dynamic evaluation needs at least one step size")
        self.model = copy.deepcopy(model).eval()
        self.lrs, self.decay, self.segment = tuple(lrs), decay, segment
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.theta0 = [p.detach().clone() for p in self.params]
        self.mean_sq = [torch.zeros_like(p) for p in self.params]
        self.updates = 0

    def _segment(self, ids: torch.Tensor, state: list) -> tuple[torch.Tensor, list]:
        """ids (1, S + 1): predict ids[:, 1:] from ids[:, :-1] starting from `state` -> (summed nats, state)."""
        m = self.model
        x = m.embedding(ids[:, :-1])  # (1, S, E)
        new = []
        for layer, s in zip(m.recurrent, state):
            x, s = layer.forward_from(x, s)  # (1, S, H)
            new.append(s)
        logits = m.head(x)  # (1, S, V)
        nats = F.cross_entropy(logits.flatten(0, 1).float(), ids[0, 1:], reduction="sum")
        return nats, new

    @torch.no_grad()
    def _update(self, lr: float) -> None:
        """One RMS-normalised step of size `lr` from the gradients in .grad, decaying towards θ0."""
        self.updates += 1
        n = self.updates
        for p, ms in zip(self.params, self.mean_sq):
            g = p.grad if p.grad is not None else torch.zeros_like(p)
            ms.mul_((n - 1) / n).addcmul_(g, g, value=1.0 / n)  # running mean of g^2
        rms = [ms.sqrt() for ms in self.mean_sq]
        total = sum(float(r.mean()) for r in rms) or 1.0
        for p, p0, r in zip(self.params, self.theta0, rms):
            g = p.grad if p.grad is not None else torch.zeros_like(p)
            rate = (self.decay * r / total).clamp_(max=1.0)  # per-element pull towards θ0
            p.add_(rate * (p0 - p) - lr * g / (r + EPS))
            p.grad = None

    def sequence(
        self, ids: list[int] | torch.Tensor, lr: float | None, progress: Progress | None = None
    ) -> float:
        """Summed nats of predicting ids[1:] (ids[0] is BOS), segment by segment with the state carried;
        the weights adapt after each segment with step size `lr` (None: static weights). `progress`
        counts the tokens scored."""
        ids = torch.as_tensor(ids, dtype=torch.long, device=self.model.embedding.weight.device).view(1, -1)
        state = [layer.init_state(1, ids.device) for layer in self.model.recurrent]
        total = 0.0
        for start in range(0, ids.shape[1] - 1, self.segment):
            seg = ids[:, start : start + self.segment + 1]  # (1, S + 1): S targets
            if progress is not None:
                progress.update(seg.shape[1] - 1)
            if lr is None:
                with torch.no_grad():
                    nats, state = self._segment(seg, state)
                total += float(nats)
                continue
            nats, state = self._segment(seg, state)
            total += float(nats.detach())  # scored before the weights see it
            nats.backward()
            self._update(lr)
        return total

    def reset(self) -> None:
        """Back to the trained weights and an empty gradient history."""
        with torch.no_grad():
            for p, p0, ms in zip(self.params, self.theta0, self.mean_sq):
                p.copy_(p0)
                ms.zero_()
        self.updates = 0

    def evaluate(self, sequences: list, progress: Progress | None = None) -> DynamicResult:
        """Every sequence (BOS first) with static weights and state carried, then, for each step size,
        adapting from θ0 in order (the weights keep adapting across sequences: they are one text read in
        order). `progress` counts the tokens scored: the text's, 1 + len(self.lrs) times."""
        self.reset()
        t0 = time.perf_counter()
        carried = sum(self.sequence(s, None, progress) for s in sequences)
        t1 = time.perf_counter()
        learners = []
        for lr in self.lrs:
            learners.append(sum(self.sequence(s, lr, progress) for s in sequences))
            self.reset()
        tokens = sum(len(s) - 1 for s in sequences)
        return DynamicResult(carried, self.lrs, tuple(learners), tokens, t1 - t0, time.perf_counter() - t1)


DYNAMIC_COLUMNS = ("static carried", "dynamic", "dyn gain %")


def dynamic_fields(res: DynamicResult, num_bytes: int) -> dict:
    """Table/JSON fields: bits per byte with the state carried (static weights) and adapting (the mixture
    of the step sizes, and each alone), and speeds (dynamic_tokens_per_s: the text's tokens over the time
    of all K learners, so K step sizes read K times slower than one)."""
    ln2_bytes = math.log(2) * max(1, num_bytes)
    carried, dynamic = res.carried_nats / ln2_bytes, res.dynamic_nats / ln2_bytes
    return {
        "static carried": carried,
        "dynamic": dynamic,
        "dynamic_loss": res.dynamic_nats / max(1, res.tokens),
        "dynamic_by_lr": [
            {"lr": lr, "bits/byte": n / ln2_bytes, "weight": w}
            for lr, n, w in zip(res.lrs, res.learner_nats, res.posterior())
        ],
        "carried_tokens_per_s": res.tokens / max(res.carried_seconds, 1e-9),
        "dynamic_tokens_per_s": res.tokens / max(res.dynamic_seconds, 1e-9),
    }


def dynamic_lines(rows: list[dict]) -> list[str]:
    """One line per table row scored with several step sizes: each alone, and its weight in the mixture."""
    out = []
    for r in rows:
        learners = r.get("dynamic_by_lr") or []
        if len(learners) > 1:
            each = ", ".join(
                f"{d['lr']:g}: {d['bits/byte']:.4f} (weight {d['weight']:.2f})" for d in learners
            )
            out.append(f"  dynamic, {r['name']}: the mixture {r['dynamic']:.4f} of step sizes {each}")
    return out
