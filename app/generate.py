"""Sample text from any checkpoint or export, one process, CPU or GPU, streaming to stdout.

    python app/generate.py --checkpoint runs/quickstart --prompt "The " --max-new-tokens 200 --top-p 0.9

The prompt is read once ([bos] + prompt tokens, one sequence pass per layer); every new token then costs
one recurrent step carrying the hidden state. Rows stop at EOS or after --max-new-tokens. With one row
the text streams as it is produced; with several (--prompts, --num-samples) each row's completed lines
stream prefixed by "[row]", and every row is printed whole at the end. Same --seed, same text.

    python app/generate.py --checkpoint runs/quickstart --interactive      # a prompt loop (stdin)
    echo "def main(" | python app/generate.py --checkpoint runs/quickstart --prompt -

--interactive: one line of stdin a turn; the recurrent state is kept, so each reply continues the whole
session (prompt 1, reply 1, prompt 2, ...) at the cost of the new line's tokens only. An empty line lets
the model go on; Ctrl-C stops a reply (not the session); Ctrl-D or the end of piped input ends it.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: import the repo, not app/
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

import contextlib
import itertools
import json

from app.checkpoints.loader import open_source
from app.common import outputs
from app.common.cli import parse_config
from app.common.errors import exit_on_user_error
from app.common.resources import steady_heap
from app.generation.config import GenerateConfig, bound, pick_device, read_prompts
from app.generation.decoder import Decoder
from app.generation.interactive import Session, read_lines, run_session
from app.generation.stream import generate

NOT_WRITTEN = "nothing was written under that name: free some space and run again"


@exit_on_user_error
def main(argv: list[str] | None = None) -> int:
    cfg = parse_config(GenerateConfig, argv, __doc__)
    outputs.check(
        [outputs.file("--output", cfg.output)], [("--checkpoint", cfg.checkpoint), ("--prompts", cfg.prompts)]
    )
    steady_heap()  # memory its estimates bound (app.common.resources)
    prompts = [] if cfg.interactive else read_prompts(cfg, sys.stdin)
    said: list[str] = []  # auto's choice, said once the checkpoint has loaded (a bad one is one line)
    device = pick_device(cfg.device, said.append)  # a GPU asked for and absent: one line, before any work
    src = open_source(cfg.checkpoint)
    tokenizer = src.tokenizer()
    lengths = [len(ids) for ids in tokenizer.encode_batch(prompts or [cfg.prompt or ""])]
    sampling = bound(
        cfg, lengths, src.model_cfg, lambda line: print(f"# {line}", file=sys.stderr, flush=True), device
    )
    decoder = Decoder(src.load_model(device))
    for line in said:
        print(f"# {line}", file=sys.stderr, flush=True)
    print(f"# {src.describe()} | {device}", file=sys.stderr, flush=True)
    if cfg.interactive:
        return interactive(cfg, Session(decoder, tokenizer, sampling, cfg.seed))

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
        with outputs.disk_errors("--output", cfg.output, NOT_WRITTEN), outputs.new_file(cfg.output) as tmp:
            tmp.write_text("".join(json.dumps(rec) + "\n" for rec in records), encoding="utf-8")
    r0 = records[0]
    n = sum(len(r["tokens"]) for r in records)
    print(
        f"# {n} new tokens in {r0['generate_s']:.2f}s ({r0['tokens_per_s']:.1f} tokens/s); "
        f"prompt read in {r0['prompt_s'] * 1e3:.1f} ms",
        file=sys.stderr,
        flush=True,
    )
    return 0


def interactive(cfg: GenerateConfig, session: Session) -> int:
    """The prompt loop; --prompt (if given) is the first turn. Each turn's record is written as it ends, to a
    temporary file that becomes --output when the session ends."""
    turns = read_lines(sys.stdin, sys.stderr)
    if cfg.prompt is not None:
        turns = itertools.chain([cfg.prompt], turns)
    with contextlib.ExitStack() as stack:
        f = None
        if cfg.output:  # the session's records, renamed to --output when it ends (whole or absent)
            stack.enter_context(outputs.disk_errors("--output", cfg.output, NOT_WRITTEN))
            f = stack.enter_context(
                open(stack.enter_context(outputs.new_file(cfg.output)), "w", encoding="utf-8")
            )

        def on_turn(rec: dict) -> None:
            if f is not None:
                f.write(json.dumps(rec) + "\n")
                f.flush()

        records = run_session(
            session, turns, max_new_tokens=cfg.max_new_tokens, out=sys.stdout, on_turn=on_turn
        )
    n, secs = sum(len(r["tokens"]) for r in records), sum(r["generate_s"] for r in records)
    print(
        f"# {len(records)} turns, {n} new tokens in {secs:.2f}s ({n / max(secs, 1e-9):.1f} tokens/s)",
        file=sys.stderr,
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
