"""The encode workers: a process pool that encodes blocks in input order, the blocks going to the workers
and their results coming back through spool files, so only file names and counts cross the pool's queues
(``pieces``). A worker that dies (the OOM killer's pick) ends the run in one line, not a hang."""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import pickle
from collections import deque
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from app.common import faults, lifetime
from data_prep import pieces
from data_prep.encode import Block, EncodeFn

log = logging.getLogger(__name__)


_WORKER: tuple[EncodeFn, Path] | None = None


def _init_worker(fn: EncodeFn, spool: Path, parent: int) -> None:
    """A worker gets the encoder, and dies with data prep's process (a SIGKILL or the OOM killer's leaves no
    worker waiting on the pool's queue forever, holding the caller's pipes open)."""
    global _WORKER
    _WORKER = (fn, spool)
    if not lifetime.die_with_parent(parent):
        log.warning("worker %d: no parent-death signal here; it may outlive a killed data prep", os.getpid())


def _send(spool: Path, index: int, block: Block) -> str:
    """Put a block where a worker reads it: a spool file (the executor's queue carries only its name)."""
    path = spool / f"block-{index}"
    with open(path, "wb") as f:
        pickle.dump(block, f, protocol=pickle.HIGHEST_PROTOCOL)
    return str(path)


def _work(index: int, path: str) -> pieces.Piece:
    """In a worker: read the block this process's parent wrote to `path`, encode it, and write the result to
    a spool file of its own (only counts go back)."""
    assert _WORKER is not None
    fn, spool = _WORKER
    faults.kill_worker(index)
    with open(path, "rb") as f:
        block = pickle.load(f)  # written by the parent an instant ago, in a folder it made (shards.spool_dir)
    os.unlink(path)
    return pieces.spill(pieces.from_encoded(fn(block)), spool / f"{os.getpid()}-{index}")


def encode_stream(
    fn: EncodeFn, blocks: Iterator[Block | None], num_proc: int, spool: Path
) -> Iterator[tuple[int, pieces.Piece]]:
    """(blocks consumed, Piece) in input order; ``num_proc`` > 1: in a pool with a bounded queue, blocks
    and results passing through files in ``spool`` (the parent reads, dispatches and appends, in order).

    The pool is a ``ProcessPoolExecutor``, not a ``multiprocessing.Pool``. When a worker dies (the OOM
    killer's pick, a segfault) ``Pool`` replaces it and waits for the lost block forever, and its
    ``terminate()`` with tasks in flight is racy and can hang (CPython issues 78178 and 96995; CI once hung
    there when the disk filled). The executor raises ``BrokenProcessPool`` from the next result instead.
    A task carries a block's file name, not the block: a block is larger than a pipe's buffer, and before
    Python 3.11.5 (CPython issue 94777) a worker dying while the queue's feeder thread writes a large task
    hangs the executor's own cleanup. Leaving early (an error here or in the caller, who closes this
    generator) waits for the blocks already handed out, at most two per worker."""
    if num_proc == 1:
        for i, block in enumerate(blocks):
            if block is not None:
                yield i + 1, pieces.from_encoded(fn(block))
        return
    # fork: the workers inherit the imported modules; the tokenizer goes in once through the initializer
    pool = ProcessPoolExecutor(
        num_proc,
        mp_context=mp.get_context("fork"),
        initializer=_init_worker,
        initargs=(fn, spool, os.getpid()),
    )
    try:
        pending: deque = deque()
        for i, block in enumerate(blocks):
            if block is None:
                continue
            pending.append((i + 1, pool.submit(_work, i, _send(spool, i, block))))
            if len(pending) >= 2 * num_proc:  # bounded: the reader never runs ahead of the workers
                n, res = pending.popleft()
                yield n, res.result()
        while pending:
            n, res = pending.popleft()
            yield n, res.result()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
