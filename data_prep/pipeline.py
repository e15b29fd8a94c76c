"""One data-prep run: read -> check -> split -> tokenizer -> encode -> bucket -> write.

All intermediate ``datasets`` files live in a per-run temporary cache directory that is deleted at
the end, so no cache from an earlier run can make the output stale, and every step is deterministic
(hash-based splits, a hash-ordered tokenizer sample, seeded efficiency estimates), so the same
command on the same inputs writes byte-identical files.
"""

from __future__ import annotations

import hashlib
import json
import logging
import tempfile
import time
from collections import Counter
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from data_prep import buckets, documents, sources, splits
from data_prep.config import PrepConfig
from data_prep.encode import LossyTokenizerError, encode_documents
from data_prep.errors import UserError
from data_prep.format import FORMAT_VERSION, SPLITS
from data_prep.spm_train import train_sentencepiece
from data_prep.tokenizer import ByteTokenizer, SentencePieceTokenizer, Tokenizer
from data_prep.writer import check_out_dir, write_output

log = logging.getLogger(__name__)
MAX_EXAMPLES_SHOWN = 3
ENCODE_PROCESSES_ABOVE_BYTES = 256 * 10**6


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


def _report_skips(table: pa.Table, names: list[str]) -> Counter:
    reasons = table.column("reason")
    counts = Counter({r: 0 for r in documents.SKIP_REASONS})
    for item in pc.value_counts(reasons).to_pylist():
        if item["values"]:
            counts[item["values"]] += item["counts"]
    for reason in documents.SKIP_REASONS:
        if not counts[reason]:
            continue
        idx = np.flatnonzero(pc.equal(reasons, reason).to_numpy(zero_copy_only=False))[:MAX_EXAMPLES_SHOWN]
        where = [
            f"{names[f]}:{line}" if line > 0 else names[f]
            for f, line in zip(
                table.column("file").take(idx).to_pylist(), table.column("line").take(idx).to_pylist()
            )
        ]
        more = f" and {counts[reason] - len(where)} more" if counts[reason] > len(where) else ""
        log.warning("skipped %d record(s) (%s): %s%s", counts[reason], reason, ", ".join(where), more)
    return counts


def _train_tokenizer(
    cfg: PrepConfig, docs, codes: np.ndarray, u: np.ndarray, nbytes: np.ndarray
) -> Tokenizer:
    train = np.flatnonzero(codes == splits.SPLIT_CODES["train"])
    train = train[np.argsort(u[train], kind="stable")]  # a seeded, file-order-independent permutation
    take = int(np.searchsorted(np.cumsum(nbytes[train]), cfg.tokenizer_train_mb * 1e6, side="right")) + 1
    sample = np.sort(train[:take])
    texts = docs.select(sample)["text"]
    mb = sum(len(t) for t in texts) / 1e6
    log.info(
        "training SentencePiece %s, vocab %d, on %d train documents (%.1f MB)",
        cfg.model_type,
        cfg.vocab_size,
        len(texts),
        mb,
    )
    t0 = time.perf_counter()
    proto = train_sentencepiece(
        texts, vocab_size=cfg.vocab_size, model_type=cfg.model_type, num_threads=cfg.num_proc
    )
    log.info("tokenizer trained in %.1f s", time.perf_counter() - t0)
    tok = SentencePieceTokenizer(proto)
    tok.check_lossless("trained tokenizer")
    return tok


def run(cfg: PrepConfig, command: str) -> dict[str, Any]:
    """Prepare ``cfg.out``; returns meta.json's content. Raises UserError for anything the user can fix."""
    import datasets

    assert cfg.out is not None
    check_out_dir(cfg.out, cfg.overwrite)
    reused = _reuse_tokenizer(cfg) if cfg.tokenizer_model else None
    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="data_prep-cache-") as cache_dir:
        records = sources.load_records(cfg, cache_dir)
        checked = documents.clean(
            records.dataset, seed=cfg.seed, bad_utf8=set(records.bad_utf8), num_proc=cfg.num_proc
        )
        table = checked.data.table
        skipped = _report_skips(table, records.names)
        kept = np.flatnonzero(pc.equal(table.column("reason"), "").to_numpy(zero_copy_only=False))
        if len(kept) == 0:
            total = sum(skipped.values())
            where = records.names[0] if len(records.names) == 1 else f"{len(records.names)} inputs"
            raise UserError(
                f"no documents left in {where}: all {total} records were skipped ("
                + ", ".join(f"{r} {n}" for r, n in skipped.items() if n)
                + ")"
            )
        repaired = int(pc.sum(table.column("repaired").take(pa.array(kept))).as_py() or 0)
        docs = checked.select(kept).flatten_indices(new_fingerprint=f"kept-{checked._fingerprint}")
        u = docs.data.table.column("u").to_numpy()
        nbytes = docs.data.table.column("num_bytes").to_numpy()
        doc_ids = docs.data.table.column("doc_id").to_numpy()
        codes, split_notes = splits.assign(u, cfg.val_fraction, cfg.test_fraction)
        if not (codes == 0).any():
            raise UserError(
                f"no documents left for training: all {len(codes)} went to validation/test; lower --val-fraction/--test-fraction"
            )
        docs = docs.select_columns(["text", "doc_id", "num_bytes"]).add_column("split", codes)

        if cfg.tokenizer == "byte":
            tok: Tokenizer = ByteTokenizer()
        else:
            tok = reused or _train_tokenizer(cfg, docs, codes, u, nbytes)
        # SentencePiece's batch encode runs on its own threads without the GIL. Below a few hundred MB,
        # starting and feeding worker processes costs more than it saves (bench/data_prep.py, 32 MB,
        # 2 cores: 2 processes x 1 thread 0.96x a single-thread encode loop, 1 process x 2 threads
        # 1.35x), so small corpora use one map process with num_proc threads; large ones use processes.
        encode_procs = cfg.num_proc if int(nbytes.sum()) > ENCODE_PROCESSES_ABOVE_BYTES else 1
        if isinstance(tok, SentencePieceTokenizer):
            tok.num_threads = max(1, cfg.num_proc // encode_procs)
        t_encode = time.perf_counter()
        try:
            examples = encode_documents(docs, tok, max_seq_len=cfg.max_seq_len, num_proc=encode_procs)
        except LossyTokenizerError as exc:
            raise UserError(f"{cfg.tokenizer_model or cfg.tokenizer}: {exc}") from exc
        log.info("encoded %d documents in %.1f s", len(docs), time.perf_counter() - t_encode)
        ex = examples.data.table
        lengths = ex.column("length").to_numpy()
        ex_split = ex.column("split").to_numpy()
        train_mask = ex_split == 0
        bounds = buckets.choose_boundaries(lengths[train_mask], cfg.max_buckets, cfg.batch_size)
        bounds[-1] = max(bounds[-1], int(lengths.max()))
        bucket = buckets.assign(lengths, bounds)
        ex = ex.append_column("bucket", pa.array(bucket))
        eff = buckets.padding_efficiency(lengths[train_mask], bucket[train_mask], cfg.batch_size, cfg.seed)
        eff_flat = buckets.padding_efficiency(lengths[train_mask], None, cfg.batch_size, cfg.seed)

        log.info("bucketed in %.1f s", time.perf_counter() - t_encode)
        split_tables = {}
        split_stats = {}
        ex_bytes = ex.column("num_bytes").to_numpy()
        for name in SPLITS:
            code = splits.SPLIT_CODES[name]
            idx = np.flatnonzero(ex_split == code)
            split_tables[name] = ex.take(pa.array(idx))
            split_stats[name] = {
                "docs": int((codes == code).sum()),
                "examples": len(idx),
                "tokens": int(lengths[idx].sum()),
                "bytes": int(ex_bytes[idx].sum()),
            }
        train_lengths = lengths[train_mask]
        fingerprint = hashlib.blake2b(
            doc_ids.tobytes() + repr(sorted(skipped.items())).encode(), digest_size=16
        ).hexdigest()
        meta: dict[str, Any] = {
            "format_version": FORMAT_VERSION,
            "tokenizer": tok.meta(),
            "max_seq_len": cfg.max_seq_len,
            "splits": split_stats,
            "documents": {
                "records": len(table),
                "kept": len(kept),
                "skipped": int(sum(skipped.values())),
                "repaired_invalid_utf8": repaired,
            },
            "skipped": dict(skipped),
            "split_notes": split_notes,
            "buckets": [int(b) for b in bounds],
            "bucket_examples": np.bincount(bucket[train_mask], minlength=len(bounds)).tolist(),
            "padding_batch_size": cfg.batch_size,
            "padding_efficiency": round(eff, 6),
            "padding_efficiency_unbucketed": round(eff_flat, 6),
            "bytes_per_token": round(
                split_stats["train"]["bytes"] / max(1, split_stats["train"]["tokens"]), 6
            ),
            "length_histogram": _histogram(train_lengths, cfg.max_seq_len),
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
            },
            "source": {**records.source, "fingerprint": fingerprint},
            "command": command,
        }
        model_proto = tok.model_proto if isinstance(tok, SentencePieceTokenizer) else None
        content = json.dumps({k: v for k, v in meta.items() if k != "command"}, sort_keys=True)
        write_output(cfg.out, split_tables, model_proto, meta, content)  # state.json ids: content, not paths
        timings = {"total_s": time.perf_counter() - t_start, "encode_write_s": time.perf_counter() - t_encode}
    del datasets
    meta["_timings"] = timings  # in-memory only (not written): for the benchmark and the summary
    return meta


def _histogram(lengths: np.ndarray, max_seq_len: int, bins: int = 8) -> dict[str, list[int]]:
    edges = np.unique(np.linspace(0, max_seq_len, bins + 1).round().astype(int))
    counts, _ = np.histogram(lengths, bins=edges)
    return {"edges": edges.tolist(), "counts": counts.tolist()}
