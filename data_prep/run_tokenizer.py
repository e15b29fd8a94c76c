"""A data-prep run's tokenizer: bytes; the SentencePiece model a resumed run saved; a model reused with
--tokenizer-model (checked: its ids, and lossless on text); or SentencePiece trained on the scan's sample
(with --vocab-size 0, at the nearest size the text supports). Saved in --out and recorded in the manifest."""

from __future__ import annotations

import functools
import hashlib
import logging
import time
from pathlib import Path

from app.common.logs import heartbeat
from data_prep import shards
from data_prep.config import PrepConfig
from data_prep.errors import UserError
from data_prep.format import TOKENIZER_FILE
from data_prep.spm_train import VocabSizeError, train_sentencepiece
from data_prep.tokenizer import ByteTokenizer, SentencePieceTokenizer, Tokenizer
from data_prep.vocab import AUTO

log = logging.getLogger(__name__)
# SentencePiece's trainer gives a different model for a different thread count, so the count is fixed
# (not --num-proc): the output must not depend on how many workers encode it.
SPM_TRAIN_THREADS = 4
_say = functools.partial(log.info, "%s")  # a progress line as it is (its text is not a format)


def reuse_tokenizer(cfg: PrepConfig) -> SentencePieceTokenizer:
    try:
        tok = SentencePieceTokenizer.from_file(cfg.tokenizer_model)
    except Exception as exc:
        raise UserError(f"{cfg.tokenizer_model}: not a SentencePiece model ({exc})") from exc
    try:
        tok.check_ids(str(cfg.tokenizer_model))
        tok.check_lossless(str(cfg.tokenizer_model))
    except ValueError as exc:
        raise UserError(str(exc)) from exc
    return tok


def train_spm(sample: list[str], cfg: PrepConfig, vocab_size: int) -> bytes:
    """SentencePiece at `vocab_size`; with --vocab-size 0 (the corpus-sized rule) a size this text cannot
    support becomes the nearest one it can."""
    try:
        return train_sentencepiece(
            sample, vocab_size=vocab_size, model_type=cfg.model_type, num_threads=SPM_TRAIN_THREADS
        )
    except VocabSizeError as exc:
        if cfg.vocab_size != AUTO:
            raise
        log.info(
            "vocab %d does not fit this text; SentencePiece can make %d: using that", vocab_size, exc.feasible
        )
        return train_sentencepiece(
            sample, vocab_size=exc.feasible, model_type=cfg.model_type, num_threads=SPM_TRAIN_THREADS
        )


def tokenizer_for_run(
    cfg: PrepConfig, out: Path, manifest: dict, sample: list[str] | None, vocab_size: int
) -> Tokenizer:
    if cfg.tokenizer == "byte":
        return ByteTokenizer()
    path = out / TOKENIZER_FILE
    saved = manifest.get("tokenizer_sha256")
    if saved and path.is_file() and hashlib.sha256(path.read_bytes()).hexdigest() == saved:
        return SentencePieceTokenizer.from_file(path)
    if cfg.tokenizer_model:
        tok = reuse_tokenizer(cfg)
    else:
        if sample is None:  # resumed after the scan, but the tokenizer was not saved: scan again for it
            raise RuntimeError("tokenizer sample missing")
        mb = sum(len(t.encode()) for t in sample) / 1e6
        log.info(
            "training SentencePiece %s, vocab %d%s, on %d train documents (%.1f MB)",
            cfg.model_type,
            vocab_size,
            " (sized from the corpus)" if cfg.vocab_size == AUTO else "",
            len(sample),
            mb,
        )
        t0 = time.perf_counter()
        with heartbeat("training SentencePiece", _say):
            proto = train_spm(sample, cfg, vocab_size)
        log.info("tokenizer trained in %.1f s", time.perf_counter() - t0)
        tok = SentencePieceTokenizer(proto)
        tok.check_lossless("trained tokenizer")
    path.write_bytes(tok.model_proto)
    manifest["tokenizer_sha256"] = hashlib.sha256(tok.model_proto).hexdigest()
    shards.save_manifest(out, manifest)
    return tok
