"""Train a lossless SentencePiece model on a deterministic sample of the training split.

The trainer sees lines (SentencePiece drops "sentences" over ``max_sentence_length`` bytes, and
whole documents are far longer; a longer line is cut into pieces before a space); newlines themselves are then covered by byte fallback. Its C++
logging goes to file descriptor 2, so the descriptor is redirected to a temporary file during
training and only shown when training fails.
"""

from __future__ import annotations

import io
import logging
import os
import re
import sys
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

from data_prep.errors import UserError

log = logging.getLogger(__name__)

MAX_LINE_BYTES = 8192
SPECIAL_IDS = {"pad_id": 0, "unk_id": 1, "bos_id": 2, "eos_id": 3}


class VocabSizeError(UserError):
    """This text cannot train a vocabulary of the asked size; `feasible` is the nearest size it can."""

    def __init__(self, message: str, feasible: int) -> None:
        super().__init__(message)
        self.feasible = feasible


@contextmanager
def _captured_stderr() -> Iterator[io.StringIO]:
    """Send fd 2 (where C++ libraries log) to a temp file; yield a buffer filled with it afterwards."""
    captured = io.StringIO()
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield captured
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            captured.write(tmp.read().decode("utf-8", errors="replace"))


def _lines(docs: Iterable[str]) -> Iterator[str]:
    """Each document's lines; a line too long for the trainer (a one-line document of any size) comes
    as pieces cut before a space (or anywhere, when there is none) rather than not at all."""
    limit = MAX_LINE_BYTES // 4  # characters: any script's line then fits max_sentence_length
    for doc in docs:
        for line in doc.split("\n"):
            while len(line) > limit:
                cut = line.rfind(" ", limit // 2, limit)
                cut = cut if cut > 0 else limit
                if line[:cut].strip():
                    yield line[:cut]
                line = line[cut:]
            if line.strip():
                yield line


def train_sentencepiece(docs: Iterable[str], *, vocab_size: int, model_type: str, num_threads: int) -> bytes:
    """Return the serialized model; raises UserError with a fix when the corpus cannot support it."""
    import sentencepiece as spm

    model = io.BytesIO()
    with _captured_stderr() as logbuf:
        try:
            spm.SentencePieceTrainer.train(
                sentence_iterator=_lines(docs),
                model_writer=model,
                vocab_size=vocab_size,
                model_type=model_type,
                byte_fallback=True,
                normalization_rule_name="identity",
                remove_extra_whitespaces=False,
                add_dummy_prefix=False,
                allow_whitespace_only_pieces=True,
                split_digits=True,
                # the whitespace symbol, even from a text with no space (a CSV log): else a space in later
                # text falls back to the symbol's UTF-8 bytes and decodes as "▁", not " "
                required_chars="\u2581",
                character_coverage=0.9995,
                max_sentence_length=MAX_LINE_BYTES,
                input_sentence_size=0,  # the caller already bounded the sample; use all of it, in order
                shuffle_input_sentence=False,
                num_threads=num_threads,
                minloglevel=1,
                **SPECIAL_IDS,
            )
            error = None
        except RuntimeError as exc:
            error = str(exc)
    if error is not None:
        too_high = re.search(
            r"Vocabulary size (?:is )?too high \((\d+)\)\. Please set it to a value <= (\d+)", error
        )
        if too_high:
            raise VocabSizeError(
                f"--vocab-size {too_high.group(1)} is too large for this training text: SentencePiece can make "
                f"at most {too_high.group(2)} pieces; pass --vocab-size {too_high.group(2)} or less, "
                "more text, or --tokenizer byte",
                int(too_high.group(2)),
            )
        too_low = re.search(r"smaller than required_chars\. (\d+) vs (\d+)", error)
        if too_low:
            raise VocabSizeError(
                f"--vocab-size {too_low.group(1)} is too small: the 4 specials, 256 byte pieces and the "
                f"corpus's characters need {too_low.group(2)}; pass --vocab-size {too_low.group(2)} or more",
                int(too_low.group(2)),
            )
        tail = " | ".join(logbuf.getvalue().strip().splitlines()[-3:])
        raise UserError(f"SentencePiece training failed: {error.strip()} ({tail})")
    log.debug("sentencepiece trainer log:\n%s", logbuf.getvalue())
    return model.getvalue()
