"""One data-prep run, streamed in two passes over the input, with memory bounded whatever the corpus size.

1. *Scan*: read every record, apply the skip rules, hash each document (its split), count, and keep a
   bounded seeded sample for SentencePiece (the train documents with the smallest split hash, up to
   ``--tokenizer-train-mb``, so the sample spreads over the whole corpus). Nothing else is kept.
2. *Encode*: read again, group records into blocks of about ``--block-mb``, encode the blocks in
   ``--num-proc`` worker processes (at most two blocks per worker in flight; blocks go to the workers
   and results come back through spool files, so only file names and counts cross the pool's queues,
   ``pieces``), and append the results, in input order, to Arrow shard groups that are closed, hashed
   and recorded as they fill (``shards``). The parent only reads, hands blocks out and appends: the
   serial part, kept small. A worker that dies (the OOM killer's pick) ends the run in one line, not a hang.

Blocks are cut by size alone and results are appended in input order, so the output bytes are the
same for any ``--num-proc``. Peak memory is a few blocks per process plus the tokenizer sample and
one length histogram. A rerun of a killed run resumes after the last finished shard group.
"""

from __future__ import annotations

import errno
import hashlib
import heapq
import itertools
import json
import logging
import multiprocessing as mp
import os
import pickle
import resource
import shutil
import time
from collections import Counter, deque
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any

import numpy as np

from app.common import faults, lifetime
from app.common.files import atomic_write
from app.common.logs import Progress, heartbeat
from app.common.resources import available_memory, cap, cpu_limit, fmt_bytes
from data_prep import buckets, documents, pieces, readers, shards, sources, splits
from data_prep.config import PrepConfig, default_num_proc
from data_prep.encode import Block, EncodeFn, LossyTokenizerError
from data_prep.errors import UserError
from data_prep.format import FORMAT_VERSION, MANIFEST_FILE, META_FILE, SPLITS, TOKENIZER_FILE
from data_prep.spm_train import VocabSizeError, train_sentencepiece
from data_prep.tokenizer import ByteTokenizer, SentencePieceTokenizer, Tokenizer
from data_prep.vocab import AUTO, auto_vocab_size

log = logging.getLogger(__name__)
MAX_EXAMPLES_SHOWN = 3
EFFICIENCY_SAMPLE = 2_000_000
# SentencePiece's trainer gives a different model for a different thread count, so the count is fixed
# (not --num-proc): the output must not depend on how many workers encode it.
SPM_TRAIN_THREADS = 4  # train lengths drawn from the histogram to estimate padding efficiency
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


def _reuse_tokenizer(cfg: PrepConfig) -> SentencePieceTokenizer:
    try:
        tok = SentencePieceTokenizer.from_file(cfg.tokenizer_model)
    except Exception as exc:
        raise UserError(f"{cfg.tokenizer_model}: not a SentencePiece model ({exc})") from exc
    try:
        tok.check_ids(str(cfg.tokenizer_model))
        tok.check_lossless(str(cfg.tokenizer_model))
    except ValueError as exc:
        raise UserError(str(exc)) from exc
    return tok


def _run_key(cfg: PrepConfig, srcs: sources.Sources, inputs: list[dict]) -> dict[str, Any]:
    """Everything the output depends on; a resumed run must match it exactly (not --num-proc/--quiet/--out)."""
    model = hashlib.sha256(cfg.tokenizer_model.read_bytes()).hexdigest() if cfg.tokenizer_model else None
    return {
        "input": srcs.key(inputs),
        "settings": {
            k: getattr(cfg, k)
            for k in (
                "doc_split", "text_field", "format", "default_max_mb", "tokenizer", "vocab_size", "model_type",
                "tokenizer_train_mb", "max_seq_len", "val_fraction", "test_fraction", "seed", "block_mb", "shard_mb",
            )
        }
        | {"tokenizer_model_sha256": model, "format_version": FORMAT_VERSION},
    }  # fmt: skip


def _say(line: str) -> None:
    log.info("%s", line)


class _Cuts:
    """Documents longer than readers.PART_CHARS that came as several parts (each a document from then on:
    split, tokenized and counted alone), so the summary can say why a file became N documents."""

    def __init__(self) -> None:
        self.documents = self.parts = 0
        self._open = False  # the last record was a part that did not end its document

    def note(self, ends_document: bool) -> None:
        if not self._open and not ends_document:
            self.documents += 1
        if self._open or not ends_document:
            self.parts += 1
        self._open = not ends_document

    def as_dict(self) -> dict[str, int]:
        return {"documents": self.documents, "parts": self.parts, "part_chars": readers.PART_CHARS}


def _scan(
    cfg: PrepConfig, srcs: sources.Sources, sample_budget: int, progress: Progress
) -> tuple[dict[str, Any], tuple[_Sample, _Sample]]:
    """Pass 1: counts, skip examples, split sizes by hash, the source fingerprint and the tokenizer sample."""
    skipped: Counter = Counter({r: 0 for r in documents.SKIP_REASONS})
    where: dict[str, list[str]] = {r: [] for r in documents.SKIP_REASONS}
    split_docs = np.zeros(3, np.int64)
    with_fffd: Counter = Counter()
    fingerprint = hashlib.blake2b(digest_size=16)
    budget = sample_budget
    # (-u, order, text) of the documents with the smallest u: among train ones, and (for a corpus that
    # ends up cut into segments, whose one book may have hashed to validation) among all
    train_sample, any_sample = _Sample(budget), _Sample(budget)
    records = kept = total_bytes = 0
    lowest: dict[float, list[int]] = {}  # the two smallest u of train documents: [copies, bytes]
    want_sample = cfg.tokenizer == "sentencepiece" and cfg.tokenizer_model is None
    t0, cuts = time.perf_counter(), _Cuts()
    for text, reason, doc_id, u, nbytes, eos, file, line in documents.check(srcs.records(), cfg.seed):
        records += 1
        progress.update()
        cuts.note(eos)
        if reason:
            skipped[reason] += 1
            if len(where[reason]) < MAX_EXAMPLES_SHOWN:
                where[reason].append(f"{srcs.names[file]}:{line}" if line > 0 else srcs.names[file])
            continue
        kept += 1
        total_bytes += nbytes
        fingerprint.update(doc_id.to_bytes(8, "little"))
        code = splits.code_of(u, cfg.val_fraction, cfg.test_fraction)
        split_docs[code] += 1
        if code == 0 and (len(lowest) < 2 or u <= max(lowest)):
            entry = lowest.setdefault(u, [0, 0])
            entry[0], entry[1] = entry[0] + 1, entry[1] + nbytes
            if len(lowest) > 2:
                del lowest[max(lowest)]
        if "\ufffd" in text:
            with_fffd[file] += 1
        if want_sample:
            any_sample.offer(u, records, text, nbytes)
            if code == 0:
                train_sample.offer(u, records, text, nbytes)
        if records % 200_000 == 0:
            log.info(
                "scanned %d records, %.0f MB, %.1f s", records, total_bytes / 1e6, time.perf_counter() - t0
            )
    fingerprint.update(repr(sorted(skipped.items())).encode())
    for reason in documents.SKIP_REASONS:
        if skipped[reason]:
            more = skipped[reason] - len(where[reason])
            log.warning(
                "skipped %d record(s) (%s): %s%s",
                skipped[reason],
                reason,
                ", ".join(where[reason]),
                f" and {more} more" if more > 0 else "",
            )
    samples = (train_sample, any_sample)
    scan = {
        "records": records,
        "kept": kept,
        "bytes": total_bytes,
        "skipped": dict(skipped),
        "where": where,
        "repaired": int(sum(n for f, n in with_fffd.items() if f in srcs.bad_utf8)),
        "cut_short": sorted(srcs.broken.values()),  # compressed inputs truncated or corrupt ("file:line")
        "split_docs": split_docs.tolist(),
        "lowest_train": sorted([u, n, b] for u, (n, b) in lowest.items()),
        "fingerprint": fingerprint.hexdigest(),
        "long_documents_cut": cuts.as_dict(),
    }
    log.info(
        "scanned %d records (%.0f MB kept) in %.1f s", records, total_bytes / 1e6, time.perf_counter() - t0
    )
    return scan, samples


class _Sample:
    """The documents with the smallest u, up to ``budget`` bytes (plus the one that crosses it, as before)."""

    def __init__(self, budget: int) -> None:
        self.budget, self.held = budget, 0
        self.heap: list[tuple[float, int, str, int]] = []  # (-u, input order, text, bytes)

    def offer(self, u: float, order: int, text: str, nbytes: int) -> None:
        if self.held < self.budget or u < -self.heap[0][0]:
            heapq.heappush(self.heap, (-u, order, text, nbytes))
            self.held += nbytes
            while self.held - self.heap[0][3] >= self.budget:
                self.held -= heapq.heappop(self.heap)[3]

    def texts(self, drop: set[float] = frozenset()) -> list[str]:
        """In input order (``drop``: the u of documents moved out of train)."""
        return [t for u, _, t, _ in sorted(self.heap, key=lambda x: x[1]) if -u not in drop]


def _rescue(cfg: PrepConfig, scan: dict[str, Any]) -> list[str]:
    """Decide how a held-out split that got no document by hash gets some (sets scan["moves"] and
    scan["split_mode"]; returns the names of the splits that were empty by hash).

    A corpus with enough documents moves the train document nearest the held-out range (all its
    copies), as long as it is no bigger than twice the split's share of the text; otherwise (one book,
    a handful of files) the corpus is cut into contiguous segments per document instead."""
    empty, moves = [], []
    lowest = list(scan["lowest_train"])
    train_docs = scan["split_docs"][0]
    segments = train_docs == 0  # everything hashed to validation/test: only possible with very few documents
    for name, code, frac in (("validation", 1, cfg.val_fraction), ("test", 2, cfg.test_fraction)):
        if frac <= 0 or scan["split_docs"][code] > 0:
            continue
        empty.append(name)
        if lowest and train_docs - lowest[0][1] >= 2 and lowest[0][2] <= 2 * frac * scan["bytes"]:
            u, n, _ = lowest.pop(0)
            moves.append([u, code])
            train_docs -= n
        else:
            segments = True
    scan["moves"] = [] if segments else moves
    scan["split_mode"] = "segments" if segments else "documents"
    if not segments:
        for u, code in moves:
            n = next(m[1] for m in scan["lowest_train"] if m[0] == u)
            scan["split_docs"][0] -= n
            scan["split_docs"][code] += n
    return empty


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


def _memory_bounds(cfg: PrepConfig) -> tuple[int | None, int]:
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


def _workers(
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


def _encode_stream(
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


def _cpu_s() -> float:
    """CPU seconds of this process and its finished children (the pool's workers, once joined)."""
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + kids.ru_utime + kids.ru_stime


def _train_spm(sample: list[str], cfg: PrepConfig, vocab_size: int) -> bytes:
    """SentencePiece at `vocab_size`; with --vocab-size 0 (the corpus-sized rule) a size this text cannot
    support becomes the nearest one it can."""
    try:
        return train_sentencepiece(
            sample, vocab_size=vocab_size, model_type=cfg.model_type, num_threads=SPM_TRAIN_THREADS
        )
    except VocabSizeError as exc:
        if cfg.vocab_size != AUTO:
            raise
        log.info(
            "vocab %d does not fit this text; SentencePiece can make %d: using that", vocab_size, exc.feasible
        )
        return train_sentencepiece(
            sample, vocab_size=exc.feasible, model_type=cfg.model_type, num_threads=SPM_TRAIN_THREADS
        )


def _tokenizer(
    cfg: PrepConfig, out: Path, manifest: dict, sample: list[str] | None, vocab_size: int
) -> Tokenizer:
    if cfg.tokenizer == "byte":
        return ByteTokenizer()
    path = out / TOKENIZER_FILE
    saved = manifest.get("tokenizer_sha256")
    if saved and path.is_file() and hashlib.sha256(path.read_bytes()).hexdigest() == saved:
        return SentencePieceTokenizer.from_file(path)
    if cfg.tokenizer_model:
        tok = _reuse_tokenizer(cfg)
    else:
        if sample is None:  # resumed after the scan, but the tokenizer was not saved: scan again for it
            raise RuntimeError("tokenizer sample missing")
        mb = sum(len(t.encode()) for t in sample) / 1e6
        log.info(
            "training SentencePiece %s, vocab %d%s, on %d train documents (%.1f MB)",
            cfg.model_type,
            vocab_size,
            " (sized from the corpus)" if cfg.vocab_size == AUTO else "",
            len(sample),
            mb,
        )
        t0 = time.perf_counter()
        with heartbeat("training SentencePiece", _say):
            proto = _train_spm(sample, cfg, vocab_size)
        log.info("tokenizer trained in %.1f s", time.perf_counter() - t0)
        tok = SentencePieceTokenizer(proto)
        tok.check_lossless("trained tokenizer")
    path.write_bytes(tok.model_proto)
    manifest["tokenizer_sha256"] = hashlib.sha256(tok.model_proto).hexdigest()
    shards.save_manifest(out, manifest)
    return tok


def run(cfg: PrepConfig, command: str) -> dict[str, Any]:
    """Prepare ``cfg.out``; returns meta.json's content. Raises UserError for anything the user can fix.

    A user error before any shard group is finished removes an --out this run created, so fixing a
    flag and running again needs no --overwrite."""
    assert cfg.out is not None
    created = not cfg.out.exists()
    try:
        return _run(cfg, command)
    except OSError as exc:  # in this process or a worker's (the pool raises it again here)
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        raise UserError(
            f"{cfg.out}: no space left on device ({exc.strerror}); finished shard groups are kept: "
            "free some space and rerun the same command to resume"
        ) from exc
    except BrokenProcessPool as exc:
        raise UserError(
            f"{cfg.out}: a data prep worker process ended abruptly (killed: by the kernel's OOM killer when "
            "memory runs out, or by a crash); finished shard groups are kept: rerun the same command to resume "
            "(with fewer --num-proc if memory was short)"
        ) from exc
    except UserError:
        manifest = cfg.out / MANIFEST_FILE
        if created and manifest.is_file() and not json.loads(manifest.read_text())["groups"]:
            shutil.rmtree(cfg.out, ignore_errors=True)
        raise


def _run(cfg: PrepConfig, command: str) -> dict[str, Any]:
    assert cfg.out is not None
    t_start = time.perf_counter()
    srcs, inputs, manifest, (memory, sample_budget) = _open(cfg)
    t_scan = time.perf_counter()
    scan, samples = _scan_or_resume(cfg, srcs, manifest, sample_budget)
    scan_s = time.perf_counter() - t_scan
    _check_kept(scan, srcs)
    if "split_mode" not in scan:  # decided once; a resumed run reads it from the manifest
        scan["empty_by_hash"] = _rescue(cfg, scan)
    manifest["scan"] = scan
    shards.save_manifest(cfg.out, manifest, inputs)
    vocab_size = cfg.vocab_size or auto_vocab_size(scan["bytes"])
    tok = _tokenizer(cfg, cfg.out, manifest, _tokenizer_sample(scan, samples), vocab_size)
    del samples
    encode_s, encode_cpu_s, main_cpu_s = _encode(cfg, srcs, manifest, scan, tok, memory)
    meta = _meta(cfg, srcs, scan, manifest, tok, scan["empty_by_hash"], command)
    atomic_write(cfg.out / META_FILE, json.dumps(meta, indent=2) + "\n")  # last, whole: the data is done
    meta["_timings"] = {  # in-memory only (not written): for the benchmark and the summary
        "total_s": time.perf_counter() - t_start,
        "scan_s": scan_s,
        "encode_write_s": encode_s,
        "encode_cpu_s": encode_cpu_s,
        "encode_main_cpu_s": main_cpu_s,
    }
    return meta


def _open(cfg: PrepConfig) -> tuple[sources.Sources, list[dict], dict[str, Any], tuple[int | None, int]]:
    """The inputs resolved and fingerprinted, --out opened: a new run, or the manifest of the run it resumes
    (refused, naming what changed, when the inputs or the settings differ) -> (sources, fingerprints,
    manifest, the memory bounds: free bytes and the tokenizer sample's budget)."""
    assert cfg.out is not None
    if cfg.tokenizer_model:
        _reuse_tokenizer(cfg)  # a bad model fails before any work
    memory, sample_budget = _memory_bounds(cfg)
    srcs = sources.resolve(cfg)
    out = cfg.out
    inputs = srcs.fingerprints()
    manifest = shards.open_out(
        out,
        cfg.overwrite,
        _run_key(cfg, srcs, inputs),
        lambda: sources.describe_change(shards.read_inputs(out), inputs),
    )
    return srcs, inputs, manifest, (memory, sample_budget)


def _scan_or_resume(
    cfg: PrepConfig, srcs: sources.Sources, manifest: dict[str, Any], sample_budget: int
) -> tuple[dict[str, Any], tuple[_Sample, _Sample] | None]:
    """Pass 1, or the scan a resumed run recorded -> (scan, the tokenizer samples: None when resumed). A
    resumed SentencePiece run whose tokenizer was not saved yet scans again for its sample. `sample_budget`:
    the bytes of tokenizer sample memory holds (`_memory_bounds`)."""
    scan = manifest.get("scan")
    if scan is None or (cfg.tokenizer == "sentencepiece" and not manifest.get("tokenizer_sha256")):
        with Progress(None, "pass 1 of 2, scan", "record", _say, bar=not cfg.quiet) as progress:
            return _scan(cfg, srcs, sample_budget, progress)
    log.info(
        "resuming %s: the scan and %d finished shard group(s) are kept", cfg.out, len(manifest["groups"])
    )
    return scan, None


def _check_kept(scan: dict[str, Any], srcs: sources.Sources) -> None:
    """Refuse an input whose every record was skipped, with the count per reason."""
    if scan["kept"] == 0:
        names = srcs.names
        w = names[0] if len(names) == 1 else f"{len(names)} inputs"
        raise UserError(
            f"no documents left in {w}: all {scan['records']} records were skipped ("
            + ", ".join(f"{r} {n}" for r, n in scan["skipped"].items() if n)
            + ")"
        )


def _tokenizer_sample(scan: dict[str, Any], samples: tuple[_Sample, _Sample] | None) -> list[str] | None:
    """The texts SentencePiece trains on (None when resumed): train documents only, unless the corpus is cut
    into segments."""
    if samples is None:
        return None
    if scan["split_mode"] == "documents":
        return samples[0].texts(drop={u for u, _ in scan["moves"]})
    return samples[1].texts()


def _encode(
    cfg: PrepConfig,
    srcs: sources.Sources,
    manifest: dict[str, Any],
    scan: dict[str, Any],
    tok: Tokenizer,
    memory: int | None,
) -> tuple[float, float, float]:
    """Pass 2: encode the blocks after the finished shard groups in the workers (as many as the CPUs, the
    blocks and `memory` allow: `_workers`) and append them, in input order, to shard groups; check the bytes
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
    num_proc, blocks = _workers(cfg, _blocks(cfg, srcs, skip_blocks), memory, tok)
    stream = _encode_stream(fn, blocks, num_proc, spool)
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


def _meta(cfg, srcs, scan, manifest, tok, empty_by_hash, command) -> dict[str, Any]:
    groups = manifest["groups"]
    split_stats = {
        name: {
            k: int(sum(g["stats"][name][k] for g in groups)) for k in ("docs", "examples", "tokens", "bytes")
        }
        for name in SPLITS
    }
    if scan["split_mode"] == "documents":  # a long document's parts count once each, as by the scan
        for name, n in zip(SPLITS, scan["split_docs"]):
            split_stats[name]["docs"] = int(n)
    hist = np.sum([np.asarray(g["hist"], np.int64) for g in groups], axis=0)
    bounds = buckets.from_histogram(hist, cfg.max_buckets, cfg.batch_size)
    if split_stats["validation"]["examples"] or split_stats["test"]["examples"]:
        bounds[-1] = max(bounds[-1], cfg.max_seq_len)  # held-out examples may be longer than any train one
    lengths = buckets.sample_lengths(hist, EFFICIENCY_SAMPLE, cfg.seed)
    eff = buckets.padding_efficiency(lengths, buckets.assign(lengths, bounds), cfg.batch_size, cfg.seed)
    eff_flat = buckets.padding_efficiency(lengths, None, cfg.batch_size, cfg.seed)
    notes = [
        f"{SPLITS[code]} split was empty by hash; moved {n} document(s) from train into it"
        for u, code in scan["moves"]
        for n in [next(m[1] for m in scan["lowest_train"] if m[0] == u)]
    ]
    if scan["split_mode"] == "segments":
        notes.append(
            f"{' and '.join(empty_by_hash)} got no whole document by hash ({scan['kept']} documents): each document "
            f"of 3+ chunks was cut into contiguous train/validation/test segments instead"
        )
    return {
        "format_version": FORMAT_VERSION,
        "tokenizer": tok.meta(),
        "max_seq_len": cfg.max_seq_len,
        "splits": split_stats,
        "split_mode": scan["split_mode"],
        "documents": {
            "records": scan["records"],
            "kept": scan["kept"],
            "skipped": int(sum(scan["skipped"].values())),
            "repaired_invalid_utf8": scan["repaired"],
            "inputs_cut_short": scan.get("cut_short", []),
            "long_documents_cut": scan.get("long_documents_cut"),  # absent in a scan resumed from before
        },
        "skipped": scan["skipped"],
        "split_notes": notes,
        "buckets": [int(b) for b in bounds],
        "bucket_examples": np.bincount(
            buckets.assign(np.arange(len(hist)), bounds), weights=hist, minlength=len(bounds)
        )
        .astype(np.int64)
        .tolist(),
        "padding_batch_size": cfg.batch_size,
        "padding_efficiency": round(eff, 6),
        "padding_efficiency_unbucketed": round(eff_flat, 6),
        "bytes_per_token": round(split_stats["train"]["bytes"] / max(1, split_stats["train"]["tokens"]), 6),
        "length_histogram": _histogram(hist, cfg.max_seq_len),
        "settings": {
            "doc_split": cfg.doc_split if (cfg.inputs or cfg.hub) else "file",
            "text_field": cfg.text_field,
            "seed": cfg.seed,
            "val_fraction": cfg.val_fraction,
            "test_fraction": cfg.test_fraction,
            "vocab_size": cfg.vocab_size,
            "model_type": cfg.model_type,
            "tokenizer_train_mb": cfg.tokenizer_train_mb,
            "reused_tokenizer_model": str(cfg.tokenizer_model) if cfg.tokenizer_model else None,
            "block_mb": cfg.block_mb,
            "shard_mb": cfg.shard_mb,
        },
        "source": {**srcs.source, "fingerprint": scan["fingerprint"]},
        "command": command,
    }


def _histogram(hist: np.ndarray, max_seq_len: int, bins: int = 8) -> dict[str, list[int]]:
    edges = np.unique(np.linspace(0, max_seq_len, bins + 1).round().astype(int))
    cum = np.concatenate([[0], np.cumsum(hist)])
    # lengths in (edges[i], edges[i+1]] (the first bin also holds its lower edge, as np.histogram did)
    counts = [
        int(cum[min(hi, len(hist) - 1) + 1] - cum[lo + (1 if i else 0)])
        for i, (lo, hi) in enumerate(itertools.pairwise(edges))
    ]
    return {"edges": edges.tolist(), "counts": counts}
