"""meta.json of a finished data-prep run: the splits' counts, the length buckets and their padding
efficiency, the length histogram, the documents kept and skipped, the settings and the source."""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np

from data_prep import buckets
from data_prep.format import FORMAT_VERSION, SPLITS

EFFICIENCY_SAMPLE = 2_000_000  # train lengths drawn from the histogram to estimate padding efficiency


def meta_of(cfg, srcs, scan, manifest, tok, empty_by_hash, command) -> dict[str, Any]:
    """meta.json's content, from the finished shard groups of `manifest`, the `scan` (pass 1), the tokenizer
    `tok`, the held-out splits that were `empty_by_hash`, and the `command` that ran."""
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
