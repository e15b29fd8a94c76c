"""Sample text from any checkpoint or export, one process, CPU or GPU, streaming to stdout.

    python app/generate.py --checkpoint runs/quickstart --prompt "The " --max-new-tokens 200 --top-p 0.9

The prompt is read once ([bos] + prompt tokens, one sequence pass per layer); every new token then costs
one recurrent step carrying the hidden state. Rows stop at EOS or after --max-new-tokens. With one row
the text streams as it is produced; with several (--prompts, --num-samples) each row's completed lines
stream prefixed by "[row]", and every row is printed whole at the end. Same --seed, same text.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: import the repo, not app/
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

import json

from app.checkpoints.loader import open_source
from app.common.cli import parse_config
from app.common.errors import UserError, exit_on_user_error
from app.generation.config import GenerateConfig, pick_device, read_prompts
from app.generation.decoder import Decoder
from app.generation.sampling import SamplingConfig
from app.generation.stream import generate


@exit_on_user_error
def main(argv: list[str] | None = None) -> int:
    cfg = parse_config(GenerateConfig, argv, __doc__)
    try:
        sampling = SamplingConfig(temperature=cfg.temperature, top_k=cfg.top_k, top_p=cfg.top_p)
    except ValueError as e:
        raise UserError(str(e)) from None
    prompts = read_prompts(cfg)
    device = pick_device(cfg.device)
    src = open_source(cfg.checkpoint)
    tokenizer = src.tokenizer()
    decoder = Decoder(src.load_model(device))
    print(f"# {src.describe()} | {device}", file=sys.stderr, flush=True)

    records = generate(
        decoder,
        tokenizer,
        prompts,
        max_new_tokens=cfg.max_new_tokens,
        sampling=sampling,
        seed=cfg.seed,
        num_samples=cfg.num_samples,
        out=sys.stdout,
    )
    if len(records) > 1:
        for rec in records:
            print(
                f"\n===== sample {rec['row']} ({rec['stop']}) =====\n{rec['prompt']}{rec['text']}", flush=True
            )
    if cfg.output:
        try:
            with open(cfg.output, "w", encoding="utf-8") as f:
                f.writelines(json.dumps(rec) + "\n" for rec in records)
        except OSError as e:
            raise UserError(f"--output {cfg.output}: cannot write ({e})") from None
    r0 = records[0]
    n = sum(len(r["tokens"]) for r in records)
    print(
        f"# {n} new tokens in {r0['generate_s']:.2f}s ({r0['tokens_per_s']:.1f} tokens/s); "
        f"prompt read in {r0['prompt_s'] * 1e3:.1f} ms",
        file=sys.stderr,
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
