"""Generation speed of the recurrent decoder (app.generation.decoder.Decoder), mid-size mLSTM, random weights.

    .venv/bin/python bench/generate.py [--hidden 1024] [--repeats 5]

Reports (medians of repeats, measured side by side in one process):
- prompt ingest of 256 tokens: the sequence path (`prefill`, one call) vs feeding it token by token (`step`);
- tokens/s of 256 new tokens (sampling included) after a 512-token prompt;
- per-new-token time after a 128- vs a 2048-token prompt and their ratio: the state has a fixed size, so
  it must stay ~1 (target <= 1.1), unlike attention whose per-token cost grows with the context.
The JSON line printed last holds every number.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import argparse
import json
import statistics
import time

import torch

from app.generation.decoder import Decoder
from app.generation.sampling import SamplingConfig, sample_next
from app.model.config import ModelConfig
from app.model.lm import InferenceModel


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--embed", type=int, default=256)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--repeats", type=int, default=3)
    return ap.parse_args()


def main() -> None:
    args = parse_args()
    torch.manual_seed(0)
    cfg = ModelConfig(
        vocab_size=args.vocab, embed_dim=args.embed, hidden_dim=args.hidden, num_layers=args.layers
    )
    dec = Decoder(InferenceModel(cfg))
    sampling, gen = SamplingConfig(temperature=1.0), torch.Generator().manual_seed(0)

    def prompt(n: int) -> torch.Tensor:
        return torch.randint(4, args.vocab, (1, n))

    def stepwise(ids: torch.Tensor):
        state = [(torch.zeros(1, args.hidden), torch.zeros(1, args.hidden)) for _ in range(args.layers)]
        for t in range(ids.shape[1]):
            logits, state = dec.step(ids[:, t], state)
        return logits, state

    def decode(state, logits, n: int) -> None:
        for _ in range(n):
            nxt = sample_next(logits, sampling, gen)
            logits, state = dec.step(nxt, state)

    dec.prefill(prompt(64), torch.tensor([64]))  # warm-up (kernel selection)
    p512 = prompt(512)
    t0 = time.perf_counter()
    logits512, state512 = dec.prefill(p512, torch.tensor([512]))
    prefill512 = time.perf_counter() - t0
    p256, n256 = p512[:, :256], torch.tensor([256])
    ref_logits, _ = stepwise(p256)
    max_diff = float((ref_logits - dec.prefill(p256, n256)[0]).abs().max())
    short, long_ = (
        dec.prefill(prompt(128), torch.tensor([128])),
        dec.prefill(prompt(2048), torch.tensor([2048])),
    )

    measurements = {  # timed side by side in every repeat
        "sequence": lambda: dec.prefill(p256, n256),
        "stepwise": lambda: stepwise(p256),
        "new_256": lambda: decode(state512, logits512, 256),
    }
    times: dict[str, list[float]] = {name: [] for name in [*measurements, "128", "2048"]}
    n_side = 32
    for rep in range(args.repeats):
        for name, fn in measurements.items():
            times[name].append(timed(fn))
        for _ in range(2):  # per-token cost after 128 vs 2048 prompt tokens, alternating which goes first
            order = [("128", short), ("2048", long_)]
            for key, (lg, st) in order if (rep + _) % 2 == 0 else order[::-1]:
                times[key].append(timed(lambda lg=lg, st=st: decode(st, lg, n_side)) / n_side)

    report(args, times, max_diff, prefill512)


def report(args, times: dict[str, list[float]], max_diff: float, prefill512: float) -> None:
    """The medians over the repeats, three summary lines, and the JSON line last."""
    med = statistics.median
    seq_s, step_s, gen_s = times["sequence"], times["stepwise"], times["new_256"]
    t128, t2048 = med(times["128"]), med(times["2048"])
    res = {
        "bench": "generate",
        "model": {"hidden": args.hidden, "embed": args.embed, "layers": args.layers, "vocab": args.vocab},
        "threads": torch.get_num_threads(),
        "repeats": args.repeats,
        "prompt_256_sequence_ms": med(seq_s) * 1e3,
        "prompt_256_stepwise_ms": med(step_s) * 1e3,
        "prompt_ingest_speedup": med(step_s) / med(seq_s),
        "prefill_vs_stepwise_max_abs_logit_diff": max_diff,
        "prompt_512_prefill_ms": prefill512 * 1e3,
        "new_256_tokens_per_s": 256 / med(gen_s),
        "ms_per_new_token_prompt_128": t128 * 1e3,
        "ms_per_new_token_prompt_2048": t2048 * 1e3,
        "per_token_ratio_2048_vs_128": t2048 / t128,
        "target_ratio_max": 1.1,
    }
    print(
        f"prompt 256: sequence path {res['prompt_256_sequence_ms']:.0f} ms vs token by token "
        f"{res['prompt_256_stepwise_ms']:.0f} ms ({res['prompt_ingest_speedup']:.1f}x)\n"
        f"256 new tokens after 512: {res['new_256_tokens_per_s']:.0f} tokens/s\n"
        f"per new token: {t128 * 1e3:.2f} ms after 128 prompt tokens, {t2048 * 1e3:.2f} ms after 2048 "
        f"(ratio {res['per_token_ratio_2048_vs_128']:.3f})",
        flush=True,
    )
    print(json.dumps(res), flush=True)


if __name__ == "__main__":
    main()
