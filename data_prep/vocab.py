"""The SentencePiece vocabulary size when `--vocab-size` is left at 0 (the default): sized from the corpus.

    vocab = clamp(64 * round(8 * sqrt(corpus bytes) / 64), 512, 4096)

A vocabulary too large for its corpus overfits: most pieces are seen a handful of times in training, so a
held-out text is scored with rare, badly estimated pieces (8000 pieces on a 1 MB play measured 5.83
nats/token held out against 4.3 in training). Below that, a larger vocabulary is better: each token covers
more bytes, so a step of the recurrent net reads more text. The number of pieces a corpus supports grows
sublinearly with its size, hence the square root; 8 * sqrt puts a 0.23 MB novel at 3840, where it measured
best (bench/README.md). The cap is the CPU default model's: from about 4000 pieces on, the output layer of
the `small` preset costs more than its whole recurrent stack, which the 2-stage pipeline can no longer
balance (measured 774 vs 1509 tokens/s at 8000 vs 4000 pieces), and 4000 pieces measured better than 8000
on the 3.6 MB embedded corpus at equal training time. Larger models and corpora should pass --vocab-size.

The corpus's bytes are the kept documents' UTF-8 bytes counted by data_prep's scan (all splits). A text
that cannot make that many pieces (SentencePiece says how many it can) gets what it can make; one whose
characters need more (e.g. Japanese) gets what SentencePiece asks for.
"""

from __future__ import annotations

import math

AUTO = 0  # --vocab-size 0: this rule
K = 8.0
STEP = 64
MIN_VOCAB = 512  # the 4 specials and 256 byte pieces leave 252 merged pieces
MAX_VOCAB = 4096


def auto_vocab_size(corpus_bytes: int) -> int:
    """The vocabulary size the rule gives a corpus of `corpus_bytes` UTF-8 bytes."""
    raw = K * math.sqrt(max(0, corpus_bytes))
    return int(min(MAX_VOCAB, max(MIN_VOCAB, STEP * round(raw / STEP))))
