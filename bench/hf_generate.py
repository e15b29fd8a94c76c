"""Per-new-token cost of an export under transformers' `generate` beside our own recurrent decoder.

    .venv/bin/python bench/hf_generate.py [--hidden 512] [--rounds 5]

A random-weight mLSTM is exported (app/export's files, byte tokenizer) and loaded with
AutoModelForCausalLM (trust_remote_code). Contenders, measured in interleaved rounds in one process
(medians), each as seconds per new greedy token (the time of 1 + N new tokens minus that of 1, over N):
- ours: app.generation's Decoder (prefill, then one `step` per token);
- hf_cache: `model.generate` with its cache = the recurrent state, after a short and a long prompt
  (their ratio stays ~1: a token costs one step whatever came before);
- hf_no_cache: `generate(use_cache=False)`, which re-reads the whole sequence for every token.
Contenders the machine cannot run (no transformers) are "unavailable". The JSON line printed last holds
every number.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import argparse
import json
import statistics
import tempfile
import time

import torch

from app.checkpoints.export_format import write_export
from app.checkpoints.hf_format import hf_config, hf_files
from app.generation.decoder import Decoder
from app.model.config import ModelConfig
from app.model.lm import LanguageModel
from data_prep.tokenizer import ByteTokenizer


def export_random(cfg: ModelConfig, out: Path) -> LanguageModel:
    torch.manual_seed(0)
    model = LanguageModel(cfg).eval()
    tok = ByteTokenizer().meta()
    config = {"model_config": cfg.to_dict(), "tokenizer": tok, **hf_config(cfg, tok)}
    write_export(out, model.state_dict(), config, None, hf_files(tok))
    return model


def ours_time(dec: Decoder, ids: torch.Tensor, n: int) -> float:
    t0 = time.perf_counter()
    logits, state = dec.prefill(ids, torch.tensor([ids.shape[1]]))
    for _ in range(n):
        logits, state = dec.step(logits.argmax(-1), state)
    return time.perf_counter() - t0


def hf_time(model, ids: torch.Tensor, n: int, use_cache: bool) -> float:
    t0 = time.perf_counter()
    model.generate(
        ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n, do_sample=False,
        eos_token_id=None, use_cache=use_cache,
    )  # fmt: skip
    return time.perf_counter() - t0


def per_token(fn, ids: torch.Tensor, n: int) -> float:
    return (fn(ids, 1 + n) - fn(ids, 1)) / n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--embed", type=int, default=128)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--new", type=int, default=64, help="new tokens per timing")
    ap.add_argument("--short", type=int, default=32, help="short prompt length")
    ap.add_argument("--long", type=int, default=1024, help="long prompt length")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(max(1, torch.get_num_threads()))
    cfg = ModelConfig(vocab_size=259, embed_dim=args.embed, hidden_dim=args.hidden, num_layers=args.layers)
    result: dict = {
        "hidden": args.hidden,
        "layers": args.layers,
        "new_tokens": args.new,
        "threads": torch.get_num_threads(),
    }
    with tempfile.TemporaryDirectory() as d:
        ours = Decoder(export_random(cfg, Path(d)))
        try:
            from transformers import AutoModelForCausalLM
            from transformers.utils import logging

            logging.disable_progress_bar()
            hf = AutoModelForCausalLM.from_pretrained(d, trust_remote_code=True, local_files_only=True).eval()
        except ImportError:
            hf = None
        short, long = torch.randint(3, 259, (1, args.short)), torch.randint(3, 259, (1, args.long))
        contenders = {
            "ours_s_per_token": lambda: per_token(lambda i, n: ours_time(ours, i, n), short, args.new)
        }
        if hf is not None:
            contenders |= {
                "hf_cache_s_per_token": lambda: per_token(
                    lambda i, n: hf_time(hf, i, n, True), short, args.new
                ),
                "hf_cache_long_prompt_s_per_token": lambda: per_token(
                    lambda i, n: hf_time(hf, i, n, True), long, args.new
                ),
                "hf_no_cache_s_per_token": lambda: per_token(
                    lambda i, n: hf_time(hf, i, n, False), short, args.new // 4
                ),
            }
        for fn in contenders.values():  # warm-up: kernel choices, first calls
            fn()
        times: dict[str, list[float]] = {k: [] for k in contenders}
        for _ in range(args.rounds):
            for k, fn in contenders.items():
                times[k].append(fn())
    for k, v in times.items():
        result[k] = statistics.median(v)
    if hf is None:
        result |= dict.fromkeys(("hf_cache_s_per_token", "hf_no_cache_s_per_token"), "unavailable")
    else:
        result["hf_over_ours"] = result["hf_cache_s_per_token"] / result["ours_s_per_token"]
        result["hf_long_over_short_prompt"] = (
            result["hf_cache_long_prompt_s_per_token"] / result["hf_cache_s_per_token"]
        )
        result["hf_no_cache_over_cache"] = result["hf_no_cache_s_per_token"] / result["hf_cache_s_per_token"]
    for k, v in result.items():
        print(f"{k:36s} {v:.3e}" if isinstance(v, float) else f"{k:36s} {v}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
