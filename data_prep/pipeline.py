"""One data-prep run, streamed in two passes over the input, with memory bounded whatever the corpus size.

1. *Scan* (``scan``): read every record, apply the skip rules, hash each document (its split), count, and
   keep a bounded seeded sample for SentencePiece (the train documents with the smallest split hash, up to
   ``--tokenizer-train-mb``, so the sample spreads over the whole corpus). Nothing else is kept.
2. The tokenizer (``run_tokenizer``): bytes, the one a resumed run saved, a reused model, or SentencePiece
   trained on the scan's sample.
3. *Encode* (``encode_pass``): read again, group records into blocks of about ``--block-mb``, encode the
   blocks in ``--num-proc`` worker processes (``pool``; as many as the CPUs, the blocks and the free memory
   allow: ``bounds``), and append the results, in input order, to Arrow shard groups that are closed,
   hashed and recorded as they fill (``shards``).
4. meta.json (``meta``): the splits' counts, the buckets and the settings.

Blocks are cut by size alone and results are appended in input order, so the output bytes are the
same for any ``--num-proc``. Peak memory is a few blocks per process plus the tokenizer sample and
one length histogram. A rerun of a killed run resumes after the last finished shard group.
"""

from __future__ import annotations

import errno
import functools
import hashlib
import json
import logging
import shutil
import time
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from app.common.files import atomic_write
from app.common.logs import Progress
from data_prep import shards, sources
from data_prep.bounds import memory_bounds
from data_prep.config import PrepConfig
from data_prep.encode_pass import second_pass
from data_prep.errors import UserError
from data_prep.format import FORMAT_VERSION, MANIFEST_FILE, META_FILE
from data_prep.meta import meta_of
from data_prep.run_tokenizer import reuse_tokenizer, tokenizer_for_run
from data_prep.scan import Sample, check_kept, first_pass, rescue, tokenizer_sample
from data_prep.vocab import auto_vocab_size

log = logging.getLogger(__name__)
_say = functools.partial(log.info, "%s")  # a progress line as it is (its text is not a format)


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
    check_kept(scan, srcs)
    if "split_mode" not in scan:  # decided once; a resumed run reads it from the manifest
        scan["empty_by_hash"] = rescue(cfg, scan)
    manifest["scan"] = scan
    shards.save_manifest(cfg.out, manifest, inputs)
    vocab_size = cfg.vocab_size or auto_vocab_size(scan["bytes"])
    tok = tokenizer_for_run(cfg, cfg.out, manifest, tokenizer_sample(scan, samples), vocab_size)
    del samples
    encode_s, encode_cpu_s, main_cpu_s = second_pass(cfg, srcs, manifest, scan, tok, memory)
    meta = meta_of(cfg, srcs, scan, manifest, tok, scan["empty_by_hash"], command)
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
        reuse_tokenizer(cfg)  # a bad model fails before any work
    memory, sample_budget = memory_bounds(cfg)
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


def _scan_or_resume(
    cfg: PrepConfig, srcs: sources.Sources, manifest: dict[str, Any], sample_budget: int
) -> tuple[dict[str, Any], tuple[Sample, Sample] | None]:
    """Pass 1, or the scan a resumed run recorded -> (scan, the tokenizer samples: None when resumed). A
    resumed SentencePiece run whose tokenizer was not saved yet scans again for its sample. `sample_budget`:
    the bytes of tokenizer sample memory holds (`bounds.memory_bounds`)."""
    scan = manifest.get("scan")
    if scan is None or (cfg.tokenizer == "sentencepiece" and not manifest.get("tokenizer_sha256")):
        with Progress(None, "pass 1 of 2, scan", "record", _say, bar=not cfg.quiet) as progress:
            return first_pass(cfg, srcs, sample_budget, progress)
    log.info(
        "resuming %s: the scan and %d finished shard group(s) are kept", cfg.out, len(manifest["groups"])
    )
    return scan, None
