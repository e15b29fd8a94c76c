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
import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path

import torch

from app.batching.run_data import RunData
from app.common.errors import UserError
from app.generation.decoder import Decoder
from app.generation.sampling import SamplingConfig
from app.generation.stream import generate
from app.model.config import ModelConfig
from app.model.lm import LanguageModel
from app.training.config import TrainConfig
from app.training.tracking import Tracker
from data_prep.tokenizer import load_tokenizer

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


class RunSamples:
    """Rank 0's samples at a validation, from the weights gathered to it: drawn, logged to the tracker and
    the log (never fatal)."""

    def __init__(self, cfg: TrainConfig, model_cfg: ModelConfig, data: RunData, log: logging.Logger) -> None:
        """--sample-prompts is read here, when the run is configured: a bad file fails before any step."""
        self.prompts = read_prompts(cfg.sample_prompts) if cfg.samples else []
        self.num_samples, self.max_new_tokens, self.seed = cfg.samples, cfg.sample_tokens, cfg.seed
        self.model_cfg, self.data, self.run_dir, self.log = model_cfg, data, Path(cfg.out), log
        self._tokenizer = None  # loaded at the first samples

    def take(self, state: dict[str, torch.Tensor], step: int, tracker: Tracker) -> None:
        t0 = time.perf_counter()
        try:
            if self._tokenizer is None:
                self._tokenizer = load_tokenizer(self.data.tokenizer, self.data.prepared.tokenizer_path)
            rows = sample_texts(
                state,
                self.model_cfg,
                self._tokenizer,
                self.prompts,
                num_samples=self.num_samples,
                max_new_tokens=self.max_new_tokens,
                seed=self.seed,
            )
            tracker.log_samples(rows, step)
        except Exception as e:  # samples are a view of the run, not part of it
            self.log.warning(f"samples @ step {step} failed ({e.__class__.__name__}: {e})")
            return
        self.log.info(
            f"samples @ step {step}: {len(rows)} in {time.perf_counter() - t0:.1f}s "
            f"({self.run_dir / 'samples.jsonl'}); first: {(rows[0]['prompt'] + rows[0]['text'])[:100]!r}"
        )
