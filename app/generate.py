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
import time
from dataclasses import dataclass
from typing import TextIO

import torch

from app.common.cli import parse_config
from app.common.errors import UserError, exit_on_user_error
from app.generation.sampling import SamplingConfig, sample_next


@dataclass(kw_only=True, slots=True)
class GenerateConfig:
    checkpoint: str = ""
    """A run directory, its checkpoints/ folder, one step_XXXXXXXX folder, or an export folder."""
    prompt: str | None = None
    """Prompt text (default: empty, i.e. sample from the start of a document)."""
    prompts: str | None = None
    """File with one prompt per line (blank lines skipped); the prompts are generated as one batch."""
    max_new_tokens: int = 200
    """Stop each row after this many new tokens (or at EOS)."""
    temperature: float = 1.0
    """Softmax temperature; 0 = greedy (argmax)."""
    top_k: int = 0
    """Sample only among the K most likely tokens (0: off)."""
    top_p: float = 1.0
    """Nucleus sampling: the smallest set of tokens holding probability >= P (1: off)."""
    seed: int = 1234
    """Random seed: the same seed gives the same text."""
    num_samples: int = 1
    """Samples per prompt."""
    device: str = "auto"
    """cpu, cuda, cuda:N, or auto (cuda when available)."""
    output: str | None = None
    """Also write every sample as a JSON line (prompt, text, tokens, stop reason) to this file."""

    def __post_init__(self) -> None:
        if not self.checkpoint:
            raise ValueError("--checkpoint is required (a run directory, checkpoint or export folder)")
        if self.prompt is not None and self.prompts is not None:
            raise ValueError("give --prompt or --prompts, not both")
        if self.max_new_tokens < 1:
            raise ValueError(f"--max-new-tokens must be >= 1, got {self.max_new_tokens}")
        if self.num_samples < 1:
            raise ValueError(f"--num-samples must be >= 1, got {self.num_samples}")
        SamplingConfig(temperature=self.temperature, top_k=self.top_k, top_p=self.top_p)


class Streamer:
    """Incremental detokenisation per row: emits only text that can no longer change."""

    def __init__(self, tokenizer, rows: int, out: TextIO) -> None:
        self.tok, self.out = tokenizer, out
        self.ids: list[list[int]] = [[] for _ in range(rows)]
        self.shown = [0] * rows  # characters of the decoded text already emitted
        self.pending = [""] * rows  # multi-row mode: the current incomplete line

    def text(self, r: int) -> str:
        return self.tok.decode(self.ids[r])

    def push(self, r: int, token: int) -> None:
        self.ids[r].append(token)
        text = self.text(r)
        stable = len(text.rstrip("\ufffd"))  # a trailing U+FFFD may be half of a UTF-8 character
        self._emit(r, text[self.shown[r] : stable])
        self.shown[r] = max(self.shown[r], stable)

    def finish(self, r: int) -> None:
        self._emit(r, self.text(r)[self.shown[r] :])
        self.shown[r] = len(self.text(r))
        if len(self.ids) > 1 and self.pending[r]:
            self.out.write(f"[{r}] {self.pending[r]}\n")
            self.pending[r] = ""
        self.out.flush()

    def _emit(self, r: int, s: str) -> None:
        if not s:
            return
        if len(self.ids) == 1:
            self.out.write(s)
            self.out.flush()
            return
        *lines, self.pending[r] = (self.pending[r] + s).split("\n")
        for line in lines:
            self.out.write(f"[{r}] {line}\n")
        if lines:
            self.out.flush()


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(name)
    except RuntimeError:
        raise UserError(f"--device {name!r}: expected cpu, cuda, cuda:N or auto") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise UserError(f"--device {name}: CUDA is not available on this machine")
    return dev


def read_prompts(cfg: GenerateConfig) -> list[str]:
    if cfg.prompts is None:
        return [cfg.prompt or ""]
    p = Path(cfg.prompts)
    try:
        lines = p.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"--prompts {p}: cannot read ({e.__class__.__name__}: {e})") from None
    prompts = [ln for ln in lines if ln.strip()]
    if not prompts:
        raise UserError(f"--prompts {p}: no prompts (the file has no non-blank line)")
    return prompts


@torch.no_grad()
def generate(
    decoder,
    tokenizer,
    prompts: list[str],
    *,
    max_new_tokens: int,
    sampling: SamplingConfig,
    seed: int,
    num_samples: int = 1,
    out: TextIO | None = None,
) -> list[dict]:
    """Sample every prompt `num_samples` times as one batch; returns one record per row."""
    rows = [p for p in prompts for _ in range(num_samples)]
    encoded = [[tokenizer.bos_id, *ids] for ids in tokenizer.encode_batch(rows)]
    B, T = len(rows), max(len(e) for e in encoded)
    ids = torch.full((B, T), tokenizer.pad_id, dtype=torch.long)
    for r, e in enumerate(encoded):
        ids[r, : len(e)] = torch.tensor(e)
    lengths = torch.tensor([len(e) for e in encoded])
    gen = torch.Generator().manual_seed(seed)
    stream = Streamer(tokenizer, B, out) if out is not None else None
    if stream is not None and B == 1:
        out.write(rows[0])
        out.flush()

    t0 = time.perf_counter()
    logits, state = decoder.prefill(ids, lengths)  # (B, V) after each row's last prompt token
    t_prompt = time.perf_counter() - t0
    banned = sorted({tokenizer.pad_id, tokenizer.bos_id})
    new: list[list[int]] = [[] for _ in range(B)]
    stop = ["length"] * B
    done = torch.zeros(B, dtype=torch.bool)
    t0 = time.perf_counter()
    for _ in range(max_new_tokens):
        nxt = sample_next(logits, sampling, gen, banned).cpu()  # (B,)
        for r in range(B):
            if done[r]:
                continue
            tok = int(nxt[r])
            if tok == tokenizer.eos_id:
                done[r], stop[r] = True, "eos"
                if stream is not None:
                    stream.finish(r)
                continue
            new[r].append(tok)
            if stream is not None:
                stream.push(r, tok)
        if bool(done.all()):
            break
        logits, state = decoder.step(nxt, state)
    t_new = time.perf_counter() - t0
    if stream is not None:
        for r in range(B):
            if not done[r]:
                stream.finish(r)
        if B == 1:
            out.write("\n")
            out.flush()
    n_new = sum(len(x) for x in new)
    return [
        {
            "row": r,
            "prompt": rows[r],
            "text": tokenizer.decode(new[r]),
            "tokens": new[r],
            "stop": stop[r],
            "prompt_tokens": int(lengths[r]) - 1,
            "prompt_s": t_prompt,
            "generate_s": t_new,
            "tokens_per_s": n_new / max(t_new, 1e-9),
        }
        for r in range(B)
    ]


@exit_on_user_error
def main(argv: list[str] | None = None) -> int:
    cfg = parse_config(GenerateConfig, argv, __doc__)
    try:
        sampling = SamplingConfig(temperature=cfg.temperature, top_k=cfg.top_k, top_p=cfg.top_p)
    except ValueError as e:
        raise UserError(str(e)) from None
    from app.checkpoints.loader import open_source
    from app.generation.decoder import Decoder

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
