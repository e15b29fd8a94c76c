"""A long text scored as ONE stream: the recurrent state carried from each chunk into the next.

Static evaluation of a --text file cuts it into --text-chunk-len pieces, each read from a fresh state
after BOS, so no token is predicted from more context than its piece. Here each sequence is read once as
[BOS, tokens...], `chunk` positions at a time (a bound on memory only: the logits of a chunk), the state
after each chunk being where the next starts, so every token is predicted from the whole text before it:
the figure equals one forward pass over the whole sequence (a test checks it in float64). Sequences are
batched as rows of similar length; a row that ends inside a chunk has pads after it, which carry no
target, and its state afterwards is never used.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from app.batching.buckets import TokenStore, shifted_batch
from app.batching.carry_schedule import chains
from app.common.logs import Progress
from app.generation.decoder import Decoder
from app.model.loss import IGNORE_INDEX


@dataclass(frozen=True, slots=True)
class StreamResult:
    nats: float  # summed cross-entropy over every target token
    tokens: int
    seconds: float


@torch.no_grad()
def stream_nats(
    decoder: Decoder,
    sequences: list[np.ndarray],
    bos_id: int,
    pad_id: int,
    chunk: int,
    rows: int = 8,
    progress: Progress | None = None,
) -> StreamResult:
    """Each sequence's tokens (targets: no BOS, EOS last when it ends a document) predicted from [BOS] and
    everything before them, the state carried across chunks of `chunk` positions; `rows` sequences per
    batch, sorted by length so a batch wastes little on padding."""
    t0 = time.perf_counter()
    order = np.argsort([len(s) for s in sequences], kind="stable")
    nats, tokens = 0.0, 0
    for b in range(0, len(order), rows):
        inputs, targets = shifted_batch([sequences[i] for i in order[b : b + rows]], bos_id, pad_id)  # (B, T)
        state = None
        for a in range(0, inputs.shape[1], chunk):
            logits, state = decoder.read(inputs[:, a : a + chunk], state)  # (B, C, V)
            tgt = targets[:, a : a + chunk].to(logits.device)  # (B, C)
            logits = logits.flatten(0, 1)  # (B * C, V), at least float32
            logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
            nats += float(F.cross_entropy(logits, tgt.flatten(), ignore_index=IGNORE_INDEX, reduction="sum"))
            if progress is not None:  # the tokens scored
                progress.update(int((tgt != IGNORE_INDEX).sum()))
        tokens += int((targets != IGNORE_INDEX).sum())
    return StreamResult(nats, tokens, time.perf_counter() - t0)


def split_documents(store: TokenStore, eos_id: int) -> list[np.ndarray]:
    """A prepared split's documents, each its chunks joined in order (data_prep writes them as consecutive
    examples; `chains` finds them), so that a split can be scored as streams."""
    starts = np.flatnonzero(~chains(store, eos_id)).tolist()
    ends = [*starts[1:], len(store)]
    return [
        np.concatenate([store.ids(i) for i in range(a, b)]).astype(np.int64) for a, b in zip(starts, ends)
    ]


def document_lengths(store: TokenStore, eos_id: int) -> np.ndarray:
    """(D,) tokens of each of a prepared split's documents (`split_documents`' lengths, none joined)."""
    starts = np.flatnonzero(~chains(store, eos_id))
    return np.add.reduceat(store.lengths, starts) if len(starts) else np.zeros(0, np.int64)


STREAM_COLUMNS = ("stream bits/byte",)


def stream_fields(res: StreamResult, num_bytes: int) -> dict:
    """Table/JSON fields of one text scored as a stream (bits over the file's bytes, as the chunked row)."""
    return {
        "stream loss": res.nats / max(1, res.tokens),
        "stream bits/byte": res.nats / math.log(2) / max(1, num_bytes),
        "stream_tokens_per_s": res.tokens / max(res.seconds, 1e-9),
    }
