"""Benchmark of data prep on the embedded default corpus; prints one JSON line last.

    python bench/data_prep.py [--default-max-mb 40] [--num-proc 2] [--vocab-size 8000]

mb_per_s            whole prep (read, check, split, train tokenizer, encode, bucket, write)
encode_mb_per_s     the encode-bucket-write stage alone (tokenizer already trained)
raw_encode_mb_per_s a plain single-process ``SentencePieceProcessor.encode`` loop over the same
                    documents with the same model, measured in the same run
encode_vs_raw       encode_mb_per_s / raw_encode_mb_per_s (target >= 1.2 with 2 processes; wall clock,
                    so only on an otherwise idle machine)
encode_cpu_s        CPU seconds of the encode stage, workers included, beside raw_encode_cpu_s
padding_efficiency  bucketed vs ``padding_efficiency_unbucketed`` (target >= 0.97)
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
import time
from pathlib import Path

# This file is named like the package; running it puts bench/ first on sys.path, which would make
# ``import data_prep`` import this script. Drop that entry before importing the package.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [str(_HERE.parent)] + [p for p in sys.path if Path(p or ".").resolve() != _HERE]


def main() -> None:
    from data_prep import documents, sources
    from data_prep.cli import _setup_logging
    from data_prep.config import PrepConfig, default_num_proc
    from data_prep.pipeline import run

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--default-max-mb", type=float, default=40.0)
    p.add_argument("--num-proc", type=int, default=default_num_proc())
    p.add_argument("--vocab-size", type=int, default=8000)
    p.add_argument("--max-seq-len", type=int, default=256)
    args = p.parse_args()
    _setup_logging(quiet=True)
    import sentencepiece as spm

    with tempfile.TemporaryDirectory(prefix="bench-data-prep-") as tmp:
        cfg = PrepConfig(
            out=Path(tmp) / "out",
            default_max_mb=args.default_max_mb,
            num_proc=args.num_proc,
            vocab_size=args.vocab_size,
            max_seq_len=args.max_seq_len,
            quiet=True,
        )
        meta = run(cfg, " ".join(sys.argv))
        total_bytes = sum(s["bytes"] for s in meta["splits"].values())
        timings = meta["_timings"]

        # the same documents, through the same reading/checking code, for the raw baseline
        logging.getLogger("data_prep").setLevel(logging.ERROR)  # its warnings were shown by the run
        srcs = sources.resolve(cfg)
        texts = [doc[0] for doc in documents.check(srcs.records(), cfg.seed) if not doc[1]]
        sp = spm.SentencePieceProcessor(model_file=str(cfg.out / "tokenizer.model"))
        t0, c0 = time.perf_counter(), time.process_time()
        for text in texts:
            sp.encode(text)
        raw_s, raw_cpu_s = time.perf_counter() - t0, time.process_time() - c0
        raw_bytes = sum(len(t.encode("utf-8")) for t in texts)
        assert raw_bytes == total_bytes, (raw_bytes, total_bytes)

    result = {
        "corpus_mb": round(total_bytes / 1e6, 3),
        "docs": meta["documents"]["kept"],
        "num_proc": args.num_proc,
        "cpus": os.cpu_count(),
        "vocab_size": meta["tokenizer"]["vocab_size"],
        "total_s": round(timings["total_s"], 2),
        "encode_write_s": round(timings["encode_write_s"], 2),
        "raw_encode_s": round(raw_s, 2),
        # CPU seconds (all processes): what the work costs, which load on a shared machine does not
        # hide; wall-clock ratios only mean something when nothing else runs (a process tree gets about
        # one share of the CPUs under autogroup scheduling, however many processes it has)
        "encode_cpu_s": round(timings["encode_cpu_s"], 2),
        "raw_encode_cpu_s": round(raw_cpu_s, 2),
        "load_avg_1min": round(os.getloadavg()[0], 2),
        "mb_per_s": round(total_bytes / 1e6 / timings["total_s"], 3),
        "encode_mb_per_s": round(total_bytes / 1e6 / timings["encode_write_s"], 3),
        "raw_encode_mb_per_s": round(raw_bytes / 1e6 / raw_s, 3),
        "padding_efficiency": meta["padding_efficiency"],
        "padding_efficiency_unbucketed": meta["padding_efficiency_unbucketed"],
    }
    result["encode_vs_raw"] = round(result["encode_mb_per_s"] / result["raw_encode_mb_per_s"], 3)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
