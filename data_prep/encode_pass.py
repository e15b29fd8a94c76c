"""Pass 2 of a data-prep run: the records read again in blocks of about --block-mb (those of finished shard
groups skipped), encoded in the workers (``pool``, as many as ``bounds.workers`` allows) and appended, in
input order, to shard groups (``shards``); the parent only reads, hands blocks out and appends: the serial
part, kept small. The bytes encoded are checked against the scan's."""

from __future__ import annotations

import functools
import logging
import resource
import shutil
import time
from collections.abc import Iterator
from typing import Any

from app.common.logs import Progress
from data_prep import pieces, readers, shards, sources
from data_prep.bounds import workers
from data_prep.config import PrepConfig
from data_prep.encode import Block, EncodeFn, LossyTokenizerError
from data_prep.errors import UserError
from data_prep.format import SPLITS
from data_prep.pool import encode_stream
from data_prep.tokenizer import Tokenizer

log = logging.getLogger(__name__)
_say = functools.partial(log.info, "%s")  # a progress line as it is (its text is not a format)


def _blocks(cfg: PrepConfig, srcs: sources.Sources, skip: int) -> Iterator[Block | None]:
    """Records in blocks of about --block-mb characters (the first ``skip`` blocks as None: already written).
    Records the reader already rejected are dropped here; workers parse JSON Lines rows and apply the
    remaining rules."""
    limit = int(cfg.block_mb * 1e6)
    texts: list[str | None] = []
    eos: list[bool] = []
    rows: list[bool] = []
    size = index = 0
    for text, reason, _, _, end in srcs.records(parse_json=False):
        row = reason == readers.UNPARSED
        if (reason and not row) or text is None:
            continue
        if index >= skip:
            texts.append(text)
            eos.append(end)
            rows.append(row)
        size += len(text) + 1
        if size >= limit:
            yield Block(texts, eos, rows) if index >= skip else None
            texts, eos, rows, size, index = [], [], [], 0, index + 1
    if size:
        yield Block(texts, eos, rows) if index >= skip else None


def _cpu_s() -> float:
    """CPU seconds of this process and its finished children (the pool's workers, once joined)."""
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + kids.ru_utime + kids.ru_stime


def second_pass(
    cfg: PrepConfig,
    srcs: sources.Sources,
    manifest: dict[str, Any],
    scan: dict[str, Any],
    tok: Tokenizer,
    memory: int | None,
) -> tuple[float, float, float]:
    """Pass 2: encode the blocks after the finished shard groups in the workers (as many as the CPUs, the
    blocks and `memory` allow: `bounds.workers`) and append them, in input order, to shard groups; check the bytes
    encoded against the scan's -> (wall seconds, CPU seconds of the whole process tree, CPU seconds of this
    process)."""
    assert cfg.out is not None
    out = cfg.out
    skip_blocks = shards.keep_finished(out, manifest)
    fn = EncodeFn(
        tok,
        cfg.max_seq_len,
        seed=cfg.seed,
        text_field=cfg.text_field,
        fractions=(cfg.val_fraction, cfg.test_fraction),
        moves={u: code for u, code in scan["moves"]},
        segments=scan["split_mode"] == "segments",
    )
    writer = shards.GroupWriter(out, manifest, int(cfg.shard_mb * 1e6), cfg.max_seq_len)
    t_encode, cpu_encode, cpu_main = time.perf_counter(), _cpu_s(), time.process_time()
    consumed = skip_blocks
    done_bytes = 0
    spool = shards.spool_dir(out)
    num_proc, blocks = workers(cfg, _blocks(cfg, srcs, skip_blocks), memory, tok)
    stream = encode_stream(fn, blocks, num_proc, spool)
    progress = Progress(None, "pass 2 of 2, encode", "block", _say, bar=not cfg.quiet)
    try:
        for consumed, piece in stream:
            progress.update()
            writer.add(piece, consumed)
            pieces.release(piece)
            done_bytes += sum(piece.bytes)
            if consumed % 16 == 0:
                log.info(
                    "encoded %d blocks (%.0f MB) in %.1f s",
                    consumed,
                    done_bytes / 1e6,
                    time.perf_counter() - t_encode,
                )
    except LossyTokenizerError as exc:
        raise UserError(f"{cfg.tokenizer_model or cfg.tokenizer}: {exc}") from exc
    finally:
        progress.close()
        stream.close()  # the workers stop before their spool goes
        shutil.rmtree(spool, ignore_errors=True)
    writer.close(consumed, force=True)
    encoded = sum(g["stats"][name]["bytes"] for g in manifest["groups"] for name in SPLITS)
    if encoded != scan["bytes"]:  # the text differs between the passes (or from the resumed run's scan)
        raise UserError(
            f"the input changed while data_prep was reading it: the scan counted {scan['bytes']} bytes of "
            f"text, the encode pass {encoded}; pass --overwrite to start again"
        )
    encode_s, encode_cpu_s = time.perf_counter() - t_encode, _cpu_s() - cpu_encode
    main_cpu_s = time.process_time() - cpu_main
    log.info(
        "encoded in %.1f s (CPU %.1f s, %.1f s of it in the main process)", encode_s, encode_cpu_s, main_cpu_s
    )
    return encode_s, encode_cpu_s, main_cpu_s
