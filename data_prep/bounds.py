"""What a data-prep run may ask of the machine (app.common.resources' rule): a worker's memory for one
--block-mb block, estimated from the tokens its tokenizer makes (bench/memory.py measures it); a block no
worker can hold refused in one line; --tokenizer-train-mb and --num-proc capped, in one line each, at what
the free memory, the CPUs and the input allow."""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterator

from app.common.resources import available_memory, cap, cpu_limit, fmt_bytes
from data_prep.config import PrepConfig, default_num_proc
from data_prep.encode import Block
from data_prep.errors import UserError
from data_prep.tokenizer import Tokenizer

log = logging.getLogger(__name__)
# Memory a worker's block takes (bench/memory.py measures it: 5.3 bytes a byte of text and 19 a token): the
# text read back, parsed, checked and hashed, per byte; the token ids and their copies (int32), byte counts
# (int64), split codes and the Arrow tables, per token. A tokenizer sample is held twice by the scan and
# many times over by SentencePiece's trainer (an estimate that stops absurd values).
BLOCK_TEXT_MEMORY = 6
BLOCK_TOKEN_MEMORY = 24
SPM_FEWEST_TOKENS_PER_BYTE = 0.1  # before a SentencePiece model exists: no model makes fewer of text
TOKENS_SAMPLE_BYTES = 1 << 20  # of the first block, encoded to count the tokenizer's tokens per byte
SAMPLE_MEMORY = 22
END = object()  # an iterator's end


def block_memory(block_mb: float, tokens_per_byte: float) -> float:
    """Bytes a worker needs to encode one --block-mb block into `tokens_per_byte` tokens a byte."""
    return block_mb * 1e6 * (BLOCK_TEXT_MEMORY + BLOCK_TOKEN_MEMORY * tokens_per_byte)


def tokens_per_byte(tok: Tokenizer, block: Block | None) -> float:
    """The tokenizer's tokens per byte of text: 1 for bytes; for SentencePiece, counted on the first MiB of
    `block`'s texts (a JSON row's raw line counts as its text, a little more than the field it holds)."""
    if tok.meta().get("type") == "byte" or block is None:
        return 1.0
    texts, size = [], 0
    for text in block.texts:
        if text:
            texts.append(text[: TOKENS_SAMPLE_BYTES - size])
            size += len(texts[-1].encode())
        if size >= TOKENS_SAMPLE_BYTES:
            break
    return sum(len(ids) for ids in tok.encode_arrays(texts)) / max(1, size) if texts else 1.0


def memory_bounds(cfg: PrepConfig) -> tuple[int | None, int]:
    """(the free memory, bytes of tokenizer sample it holds), checked before the scan: a --block-mb block
    one worker cannot hold even at the fewest tokens its tokenizer can make (a token a byte for bytes; for
    SentencePiece, whose tokens are counted at the encode pass, SPM_FEWEST_TOKENS_PER_BYTE) is refused in
    one line; --tokenizer-train-mb above what memory holds (the scan keeps two samples, SentencePiece's
    trainer many times one) is capped in one line."""
    free = available_memory()
    budget = int(cfg.tokenizer_train_mb * 1e6)
    if free is None:
        return None, budget
    _refuse_block(cfg, free, 1.0 if cfg.tokenizer == "byte" else SPM_FEWEST_TOKENS_PER_BYTE)
    if cfg.tokenizer == "sentencepiece" and cfg.tokenizer_model is None:
        fit = int(free // SAMPLE_MEMORY / 1e6)
        why = f"SentencePiece training needs about {SAMPLE_MEMORY}x its sample, and {fmt_bytes(free)} is available"
        budget = int(cap("--tokenizer-train-mb", cfg.tokenizer_train_mb, [(fit, why)], log.warning) * 1e6)
    return free, budget


def _refuse_block(cfg: PrepConfig, free: int, per_byte: float) -> float:
    """A worker's memory for one block (`block_memory`); one line when it is more than `free`."""
    block = block_memory(cfg.block_mb, per_byte)
    if block > free:
        raise UserError(
            f"--block-mb {cfg.block_mb:g}: a block and its tokens need about {fmt_bytes(block)} of memory and "
            f"{fmt_bytes(free)} is available; lower --block-mb"
        )
    return block


def workers(
    cfg: PrepConfig, blocks: Iterator[Block | None], free: int | None, tok: Tokenizer
) -> tuple[int, Iterator[Block | None]]:
    """The encode workers the machine and the input can use: --num-proc capped at the CPUs this process may
    run on (its affinity mask and its cgroups' CPU quota), at the blocks left to encode and at the blocks the
    free memory holds (`block_memory`, with the tokens `tok` makes of the first block; one line refusing a
    block no worker can hold), said in one line (a warning when --num-proc was given); and `blocks` again,
    with the (at most that many) blocks read ahead to count them."""
    limits = [cpu_limit()]
    first = next(blocks, END)
    blocks = itertools.chain([] if first is END else [first], blocks)
    if free is not None:
        per = _refuse_block(cfg, free, tokens_per_byte(tok, None if first is END else first))
        held = int(free // per)
        why = f"the free memory holds {held} block(s) of --block-mb {cfg.block_mb:g} and their tokens"
        limits.append((max(1, held), why))
    want = min(cfg.num_proc, *(n for n, _ in limits))
    ahead: list[Block | None] = []
    left = 0
    for block in blocks:
        ahead.append(block)
        left += block is not None
        if left >= want:
            break
    if left < want:
        limits.append(
            (max(1, left), f"the input makes {left} block(s) of --block-mb {cfg.block_mb:g} to encode")
        )
    say = log.warning if cfg.num_proc != default_num_proc() else log.info
    return cap("--num-proc", cfg.num_proc, limits, say if left else None), itertools.chain(ahead, blocks)
