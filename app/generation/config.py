"""What `app/generate.py` generates: one typed config, checked at start-up (errors name the flag)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import torch

from app.common.devices import resolve as resolve_device
from app.common.errors import UserError
from app.common.numbers import check_numbers
from app.common.resources import cap, check_fits
from app.generation.decoder import prefill_tokens
from app.generation.sampling import SamplingConfig
from app.model.first_call import first_call_bytes
from app.model.memory import prefill_floats_per_token, step_bytes


@dataclass(kw_only=True, slots=True)
class GenerateConfig:
    checkpoint: str = ""
    """A run directory (its latest complete checkpoint), <run>/best (the checkpoint with the lowest validation
    loss), its checkpoints/ folder, one step_XXXXXXXX folder, or an export folder."""
    prompt: str | None = None
    """Prompt text (default: empty, i.e. sample from the start of a document); `-` reads it from stdin (one
    trailing newline dropped)."""
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
    """Also write every sample as a JSON line (prompt, text, tokens, stop reason) to this file (written
    whole under a temporary name, then renamed; an existing file is replaced only then)."""
    interactive: bool = False
    """A prompt loop on stdin, one line a turn, keeping the recurrent state: each reply continues everything
    so far. An empty line lets the model go on; Ctrl-C stops a reply; Ctrl-D (end of input) ends. --prompt
    gives the first turn."""

    def __post_init__(self) -> None:
        check_numbers(self)
        if not self.checkpoint:
            raise ValueError("--checkpoint is required (a run directory, checkpoint or export folder)")
        if self.prompt is not None and self.prompts is not None:
            raise ValueError("give --prompt or --prompts, not both")
        if self.max_new_tokens < 1:
            raise ValueError(f"--max-new-tokens must be >= 1, got {self.max_new_tokens}")
        if self.num_samples < 1:
            raise ValueError(f"--num-samples must be >= 1, got {self.num_samples}")
        SamplingConfig(temperature=self.temperature, top_k=self.top_k, top_p=self.top_p)
        if self.interactive and (self.prompts is not None or self.num_samples > 1):
            raise ValueError("--interactive continues one text: give neither --prompts nor --num-samples > 1")
        if self.interactive and self.prompt == "-":
            raise ValueError(
                "--interactive reads its turns from stdin: give the first turn as --prompt TEXT, not -"
            )


def pick_device(name: str, say=None) -> torch.device:
    """--device: a GPU asked for and absent is one line saying what torch sees; auto says what it chose."""
    return resolve_device(name, "--device", say)


def read_prompts(cfg: GenerateConfig, stdin: TextIO) -> list[str]:
    if cfg.prompt == "-":
        try:
            text = stdin.read()
            text.encode("utf-8")  # a C locale reads undecodable bytes as surrogates, which no tokenizer takes
        except UnicodeError as e:
            raise UserError(f"--prompt -: stdin is not UTF-8 text ({e.__class__.__name__})") from None
        return [text.removeprefix("\ufeff").removesuffix("\n")]  # a byte-order mark is no prompt's
    if cfg.prompts is None:
        return [cfg.prompt or ""]
    p = Path(cfg.prompts)
    try:
        lines = p.read_text(encoding="utf-8-sig").splitlines()  # a byte-order mark dropped
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"--prompts {p}: cannot read ({e.__class__.__name__}: {e})") from None
    prompts = [ln for ln in lines if ln.strip()]
    if not prompts:
        raise UserError(f"--prompts {p}: no prompts (the file has no non-blank line)")
    return prompts


RECORD_BYTES_PER_TOKEN = 64  # a generated token kept for the records: a Python int in a list, its text
PROMPT_BYTES_PER_TOKEN = 48  # a prompt token: its id in the tokenizer's list (a Python int) and in the batch
SAMPLING_COPIES = 6  # a row's logits: the step's, the float copy sampling edits, sort, softmax, cumsum, probs


def generation_bytes(rows: int, longest: int, max_new_tokens: int, model_cfg, device=None) -> int:
    """Memory (estimated, app.model.memory) to generate `rows` rows of up to `max_new_tokens` tokens after
    prompts of up to `longest` tokens: the prefill of one group of prompts (`prefill_tokens` padded tokens
    at most: the Decoder reads them a group at a time) beside what every row holds through the steps (its
    prompt's ids, each layer's state twice, the logits and sampling's copies of them) and the tokens kept
    for the records."""
    h, v, layers = model_cfg.hidden_dim, model_cfg.vocab_size, model_cfg.num_layers
    group = min(rows * longest, prefill_tokens(model_cfg))
    prefill = group * 4 * prefill_floats_per_token(model_cfg, layers)
    prefill += min(longest, group) * step_bytes(model_cfg, device)
    prefill += first_call_bytes(
        model_cfg, max(1, group // max(1, longest)), device, backward=False
    )  # GPU core
    held = rows * (longest * PROMPT_BYTES_PER_TOKEN + 4 * (4 * h * layers + SAMPLING_COPIES * v))
    return prefill + held + rows * max_new_tokens * RECORD_BYTES_PER_TOKEN


def bound(cfg: GenerateConfig, prompt_lengths: list[int], model_cfg, say, device=None) -> SamplingConfig:
    """What --top-k, --num-samples, --max-new-tokens and the prompts ask of the machine: --top-k above the
    vocabulary is capped in one line (it is off there); a batch whose prompt pass, sampling and kept tokens
    need more memory than the machine has free is refused in one line. -> the sampling settings to use."""
    vocab = model_cfg.vocab_size
    top_k = cap("--top-k", cfg.top_k, [(vocab, f"the vocabulary has {vocab} tokens")], say)
    rows = len(prompt_lengths) * cfg.num_samples
    longest = max(prompt_lengths) + 1  # BOS
    check_fits(
        f"generating {rows:,} row(s) (prompts x --num-samples) of up to {cfg.max_new_tokens:,} new tokens after a "
        f"prompt of up to {longest:,} tokens",
        generation_bytes(rows, longest, cfg.max_new_tokens, model_cfg, device),
        "lower --max-new-tokens or --num-samples, or shorten the prompts",
        device,
    )
    return SamplingConfig(temperature=cfg.temperature, top_k=top_k, top_p=cfg.top_p)
