"""Generation to a stream: prefill the prompts once, then one recurrent step per new token, text
emitted as soon as it can no longer change."""

from __future__ import annotations

import time
from typing import TextIO

import torch

from app.generation.decoder import prefill_tokens
from app.generation.sampling import SamplingConfig, sample_next


class Streamer:
    """Incremental detokenisation per row: emits only text that can no longer change."""

    def __init__(self, tokenizer, rows: int, out: TextIO) -> None:
        self.tok, self.out = tokenizer, out
        self.ids: list[list[int]] = [[] for _ in range(rows)]
        self.shown = [0] * rows  # characters of the decoded text already emitted
        self.pending = [""] * rows  # multi-row mode: the current incomplete line

    def text(self, r: int) -> str:
        return self.tok.decode(self.ids[r])

    def push(self, r: int, token: int) -> None:
        self.ids[r].append(token)
        text = self.text(r)
        stable = len(text.rstrip("\ufffd"))  # a trailing U+FFFD may be half of a UTF-8 character
        self._emit(r, text[self.shown[r] : stable])
        self.shown[r] = max(self.shown[r], stable)

    def finish(self, r: int) -> None:
        self._emit(r, self.text(r)[self.shown[r] :])
        self.shown[r] = len(self.text(r))
        if len(self.ids) > 1 and self.pending[r]:
            self.out.write(f"[{r}] {self.pending[r]}\n")
            self.pending[r] = ""
        self.out.flush()

    def _emit(self, r: int, s: str) -> None:
        if not s:
            return
        if len(self.ids) == 1:
            self.out.write(s)
            self.out.flush()
            return
        *lines, self.pending[r] = (self.pending[r] + s).split("\n")
        for line in lines:
            self.out.write(f"[{r}] {line}\n")
        if lines:
            self.out.flush()


@torch.no_grad()
def generate(
    decoder,
    tokenizer,
    prompts: list[str],
    *,
    max_new_tokens: int,
    sampling: SamplingConfig,
    seed: int,
    num_samples: int = 1,
    out: TextIO | None = None,
) -> list[dict]:
    """Sample every prompt `num_samples` times as one batch; returns one record per row."""
    rows = [p for p in prompts for _ in range(num_samples)]
    encoded = [[tokenizer.bos_id, *ids] for ids in tokenizer.encode_batch(rows)]
    B, T = len(rows), max(len(e) for e in encoded)
    ids = torch.full((B, T), tokenizer.pad_id, dtype=torch.long)
    for r, e in enumerate(encoded):
        ids[r, : len(e)] = torch.tensor(e)
    lengths = torch.tensor([len(e) for e in encoded])
    gen = torch.Generator().manual_seed(seed)
    stream = Streamer(tokenizer, B, out) if out is not None else None
    if stream is not None and B == 1:
        out.write(rows[0])
        out.flush()

    t0 = time.perf_counter()
    # (B, V) after each row's last prompt token; prompts read a group at a time (the memory of one group)
    logits, state = decoder.prefill_in_groups(ids, lengths, prefill_tokens(decoder.cfg))
    t_prompt = time.perf_counter() - t0
    banned = sorted({tokenizer.pad_id, tokenizer.bos_id})
    new: list[list[int]] = [[] for _ in range(B)]
    stop = ["length"] * B
    done = torch.zeros(B, dtype=torch.bool)
    t0 = time.perf_counter()
    for _ in range(max_new_tokens):
        nxt = sample_next(logits, sampling, gen, banned).cpu()  # (B,)
        for r in range(B):
            if done[r]:
                continue
            tok = int(nxt[r])
            if tok == tokenizer.eos_id:
                done[r], stop[r] = True, "eos"
                if stream is not None:
                    stream.finish(r)
                continue
            new[r].append(tok)
            if stream is not None:
                stream.push(r, tok)
        if bool(done.all()):
            break
        logits, state = decoder.step(nxt, state)
    t_new = time.perf_counter() - t0
    if stream is not None:
        for r in range(B):
            if not done[r]:
                stream.finish(r)
        if B == 1:
            out.write("\n")
            out.flush()
    n_new = sum(len(x) for x in new)
    return [
        {
            "row": r,
            "prompt": rows[r],
            "text": tokenizer.decode(new[r]),
            "tokens": new[r],
            "stop": stop[r],
            "prompt_tokens": int(lengths[r]) - 1,
            "prompt_s": t_prompt,
            "generate_s": t_new,
            "tokens_per_s": n_new / max(t_new, 1e-9),
        }
        for r in range(B)
    ]
