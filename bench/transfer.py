"""Featurize throughput (app/probing, the prefill path) vs a plain forward over the same texts.

    python bench/transfer.py --checkpoint runs/quickstart --texts data/transfer_tasks/doctype_test.csv

All contenders see the same length-sorted, padded batches; "forward" is `LanguageModel.forward` (every
layer and the head, what an evaluation pass costs), "featurize" stops after the probed layer and skips
the head (every feature kind from the one pass); "featurize_python_loop" is the same with the prefill
on the Python time loop (what featurizing ran on before the fused core served zero-state prefills). Rounds are interleaved so machine noise hits both alike; the median round is reported. Prints
a JSON line last.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np
import torch

from app.checkpoints.loader import open_source
from app.classifier.features import length_batches, token_ids
from app.probing.features import batch_features
from app.probing.labelled import read_labelled


def batches(ids: list[np.ndarray], budget: int, pad: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    lengths = np.asarray([len(s) for s in ids])
    out = []
    for rows in length_batches(lengths, budget):
        b = np.full((len(rows), int(lengths[rows].max())), pad, dtype=np.int64)
        for r, i in enumerate(rows):
            b[r, : lengths[i]] = ids[i]
        out.append((torch.from_numpy(b), torch.from_numpy(lengths[rows])))
    return out


@torch.no_grad()
def timed(fn, data) -> float:
    t = time.perf_counter()
    for ids, lengths in data:
        fn(ids, lengths)
    return time.perf_counter() - t


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--texts", required=True, help="a labelled CSV/JSONL/Parquet file (its text column)")
    p.add_argument("--features", default="final_cell")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--batch-tokens", type=int, default=16384)
    args = p.parse_args()
    src = open_source(args.checkpoint)
    tok, model = src.tokenizer(), src.load_model()
    data = read_labelled("texts", args.texts, "text", "label")
    ids = token_ids(tok, data.texts)
    work = batches(ids, args.batch_tokens, tok.pad_id)
    last = model.cfg.num_layers - 1

    def python_prefill(i, n):  # the prefill on the Python loop, as before the fused core served it
        cores = [layer.core for layer in model.recurrent]
        for layer in model.recurrent:
            layer.core = "python"
        try:
            return batch_features(model, i, n, args.features, last)
        finally:
            for layer, core in zip(model.recurrent, cores):
                layer.core = core

    contenders = {
        "featurize": lambda i, n: batch_features(model, i, n, args.features, last),
        "featurize_python_loop": python_prefill,
        "forward": lambda i, n: model(i),
    }
    secs: dict[str, list[float]] = {k: [] for k in contenders}
    for _ in range(args.rounds):
        for name, fn in contenders.items():
            secs[name].append(timed(fn, work))
    tokens = int(sum(len(s) for s in ids))
    out = {
        "checkpoint": src.describe(),
        "texts": len(ids),
        "tokens": tokens,
        "threads": torch.get_num_threads(),
    }
    for name, s in secs.items():
        med = statistics.median(s)
        out[name] = {"texts_per_s": len(ids) / med, "tokens_per_s": tokens / med, "seconds": s}
    out["featurize_over_forward"] = out["featurize"]["tokens_per_s"] / out["forward"]["tokens_per_s"]
    out["fused_over_python_loop"] = (
        out["featurize"]["tokens_per_s"] / out["featurize_python_loop"]["tokens_per_s"]
    )
    print(json.dumps(out))


if __name__ == "__main__":
    main()
