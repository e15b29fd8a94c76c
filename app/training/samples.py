"""Text sampled from the model at each validation (on CUDA by default at the final one only: --samples-at),
so a run shows what it writes as it learns.

Rank 0 rebuilds the whole model from the gathered weights (`app.parallel.gather`) on the CPU, away from
the accelerator's training memory, and samples with the recurrent decoder of `app/generate.py`. The draws
come from a private generator seeded with the run's seed, the same at every validation (so rows differ
between steps only by what the model learned), and the global RNG streams are restored afterwards.
The products run on one fixed CPU kernel path (`MLSTM_MATMUL=mm` for the call, unless the user forced a
path) instead of the measured fastest: nothing is timed, the kernel table that checkpoints keep for a
bit-exact resume stays exactly training's, and the same weights give the same text in any process (a
resumed run, `app/generate.py`, a test). Training never sees that samples were taken.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import torch

from app.common.errors import UserError
from app.generation.decoder import Decoder
from app.generation.sampling import SamplingConfig
from app.generation.stream import generate
from app.model.config import ModelConfig
from app.model.lm import LanguageModel

SAMPLING = SamplingConfig(temperature=1.0)  # the model's own distribution: what it has learned, unsharpened


def samples_at_end(samples_at: str | None) -> bool:
    """--samples-at, where unset: every validation on CPU, only the final one on CUDA (rank 0 gathers the
    whole model and samples on its CPU while every GPU waits at the next collective)."""
    return samples_at == "end" or (samples_at is None and torch.cuda.is_available())


def read_prompts(path: str | None) -> list[str]:
    """--sample-prompts: one prompt per line, blank lines skipped; default one empty prompt."""
    if path is None:
        return [""]
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"--sample-prompts {path}: cannot read ({e.__class__.__name__}: {e})") from None
    prompts = [ln for ln in lines if ln.strip()]
    if not prompts:
        raise UserError(f"--sample-prompts {path}: no prompts (the file has no non-blank line)")
    return prompts


@contextlib.contextmanager
def fixed_kernels() -> Iterator[None]:
    """CPU products on `torch.mm` for the duration (see the module docstring)."""
    forced = os.environ.get("MLSTM_MATMUL")
    os.environ["MLSTM_MATMUL"] = forced or "mm"
    try:
        yield
    finally:
        if forced is None:
            del os.environ["MLSTM_MATMUL"]


def sample_texts(
    state: dict[str, torch.Tensor],
    model_cfg: ModelConfig,
    tokenizer,
    prompts: list[str],
    *,
    num_samples: int,
    max_new_tokens: int,
    seed: int,
) -> list[dict]:
    """One record per (prompt, sample): prompt, text, tokens, stop reason. Leaves every RNG as it was."""
    with torch.device("meta"):  # no throwaway initialisation, so no draw from the global RNG either
        model = LanguageModel(model_cfg)
    model.load_state_dict(state, strict=True, assign=True)
    with torch.random.fork_rng(devices=[]), fixed_kernels():
        return generate(
            Decoder(model),
            tokenizer,
            prompts,
            max_new_tokens=max_new_tokens,
            sampling=SAMPLING,
            seed=seed,
            num_samples=num_samples,
        )
