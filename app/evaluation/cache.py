"""A neural cache over a text read as one stream (Grave et al. 2017, "Improving Neural Language Models with
a Continuous Cache"): no weight changes, no gradients.

Each sequence is read as in app/evaluation/stream.py (the state carried, `chunk` positions at a time).
The cache holds the last `window` pairs (h_i, y_i): the top layer's output at position i and the token that
followed it. Token t is predicted by

    p(w) = (1 - λ) p_model(w | h_t) + λ Σ_{i in cache, y_i = w} softmax_i(θ h_t · h_i)

so a name or phrase read a few lines earlier, from a state like the current one, is predicted again
cheaply: the copying an LSTM of this size does not learn (bench/README.md: on a play's held-out tail, the
speaker lines cost three times their rate on validation). Only positions before t are in the cache, so no
token is predicted from itself or anything after it; a token with an empty cache (the first of a
sequence) is the model's alone.

λ and θ are not tuned on the text: every (λ, θ) of the grid is scored, and the figure is their Bayesian
mixture (app/evaluation/mixture.py), within ln K nats of the best setting for the text, chosen as it is read.
The cache and the state start empty for each sequence (each document of a split, each --text file).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from app.common.logs import Progress
from app.evaluation.mixture import mixture_nats, posterior
from app.generation.decoder import Decoder


@dataclass(frozen=True, slots=True)
class CacheResult:
    settings: tuple[tuple[float, float], ...]  # (λ, θ) per grid point
    setting_nats: tuple[float, ...]  # each setting's nats on the whole text
    tokens: int
    seconds: float

    @property
    def cache_nats(self) -> float:
        return mixture_nats(self.setting_nats)


def token_nats(
    query: torch.Tensor,
    logp: torch.Tensor,
    targets: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    window: int,
    settings: list[tuple[float, float]],
) -> torch.Tensor:
    """Nats of each target under each setting -> (n, G), float64.

    query (n, H): the chunk's top-layer outputs; logp (n,): the model's log-probability of each target;
    targets (n,); keys (m + n, H) and values (m + n,): the cache before the chunk (m pairs) followed by the
    chunk's own pairs. Query i sits at key m + i and may use keys j with m + i - window <= j < m + i."""
    n, m = query.shape[0], keys.shape[0] - query.shape[0]
    sim = query.double() @ keys.double().T  # (n, m + n)
    pos = torch.arange(m, m + n, device=query.device)[:, None]
    j = torch.arange(m + n, device=query.device)[None, :]
    allowed = (j < pos) & (j >= pos - window)  # (n, m + n)
    same = values[None, :] == targets[:, None]  # key j's next token is target i
    has = allowed.any(-1)
    logp = logp.double()
    out = torch.empty(n, len(settings), dtype=torch.float64, device=query.device)
    log_cache: dict[float, torch.Tensor] = {}
    for g, (lam, theta) in enumerate(settings):
        if theta not in log_cache:
            w = torch.softmax((theta * sim).masked_fill(~allowed, -math.inf), -1).nan_to_num(0.0)
            log_cache[theta] = torch.where(same, w, 0.0).sum(-1).log()  # (n,); -inf: not in the cache
        if lam == 0.0:
            out[:, g] = -logp
            continue
        mixed = torch.logaddexp(math.log1p(-lam) + logp, math.log(lam) + log_cache[theta])  # in log space
        out[:, g] = -torch.where(has, mixed, logp)  # an empty cache (a sequence's first token): the model
    return out


QUERY_BLOCK = 256  # queries scored at once: memory (QUERY_BLOCK x (window + QUERY_BLOCK)) is bounded


@torch.no_grad()
def cache_nats(
    decoder: Decoder,
    sequences: list[np.ndarray],
    bos_id: int,
    chunk: int,
    window: int,
    settings: list[tuple[float, float]],
    progress: Progress | None = None,
) -> CacheResult:
    """Each sequence's tokens (targets) predicted from [BOS] and everything before them, with the model's
    state carried and the cache of the last `window` (output, next token) pairs. `progress` counts the
    tokens scored."""
    t0 = time.perf_counter()
    totals = torch.zeros(len(settings), dtype=torch.float64)
    tokens = 0
    for seq in sequences:
        targets = torch.as_tensor(np.asarray(seq, dtype=np.int64), device=decoder.device)
        inputs = torch.cat([targets.new_tensor([bos_id]), targets[:-1]]).view(1, -1)
        keys, values, state = None, targets.new_empty(0), None  # the cache: at most `window` pairs
        for a in range(0, len(targets), chunk):
            h, state = decoder.hidden(inputs[:, a : a + chunk], state)  # (1, C, H)
            h, tgt = h[0], targets[a : a + chunk]
            logits = decoder.model.head(h)  # (C, V)
            logp = F.log_softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)), -1)
            logp = logp.gather(1, tgt[:, None])[:, 0]  # (C,)
            m = 0 if keys is None else len(keys)
            keys = h if keys is None else torch.cat([keys, h])  # (m + C, H)
            values = torch.cat([values, tgt])
            for q0 in range(0, len(tgt), QUERY_BLOCK):  # the keys before each block and the block's own
                q1 = min(len(tgt), q0 + QUERY_BLOCK)
                k0 = max(0, m + q0 - window)
                nats = token_nats(
                    h[q0:q1],
                    logp[q0:q1],
                    tgt[q0:q1],
                    keys[k0 : m + q1],
                    values[k0 : m + q1],
                    window,
                    settings,
                )
                totals += nats.sum(0).cpu()
            keys, values = keys[-window:], values[-window:]
            if progress is not None:
                progress.update(len(tgt))
        tokens += len(targets)
    return CacheResult(tuple(settings), tuple(totals.tolist()), tokens, time.perf_counter() - t0)


CACHE_COLUMNS = ("cache", "cache gain %")


def cache_fields(res: CacheResult, num_bytes: int) -> dict:
    """Table/JSON fields: bits per byte with the cache (the mixture over the grid, and each setting)."""
    ln2_bytes = math.log(2) * max(1, num_bytes)
    return {
        "cache": res.cache_nats / ln2_bytes,
        "cache_by_setting": [
            {"lambda": lam, "theta": theta, "bits/byte": n / ln2_bytes, "weight": w}
            for (lam, theta), n, w in zip(res.settings, res.setting_nats, posterior(res.setting_nats))
        ],
        "cache_tokens_per_s": res.tokens / max(res.seconds, 1e-9),
    }


def cache_lines(rows: list[dict]) -> list[str]:
    """One line per table row scored with the cache: the setting that carried the mixture's weight."""
    out = []
    for r in rows:
        grid = r.get("cache_by_setting") or []
        if grid:
            top = max(grid, key=lambda d: d["weight"])
            out.append(
                f"  cache, {r['name']}: the mixture {r['cache']:.4f} of {len(grid)} settings; the heaviest "
                f"lambda {top['lambda']:g}, theta {top['theta']:g}: {top['bits/byte']:.4f} (weight {top['weight']:.2f})"
            )
    return out
