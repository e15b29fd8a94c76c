"""--vocab-size 0 (the default): the SentencePiece vocabulary sized from the corpus."""

import itertools
import math
import random

import pytest

from data_prep.config import PrepConfig
from data_prep.run_tokenizer import train_spm
from data_prep.spm_train import VocabSizeError
from data_prep.vocab import MAX_VOCAB, MIN_VOCAB, STEP, K, auto_vocab_size


def test_the_rule_grows_with_the_square_root_of_the_corpus_within_its_bounds():
    sizes = sorted(random.randrange(10**9) for _ in range(200))
    got = [auto_vocab_size(n) for n in sizes]
    assert all(a <= b for a, b in itertools.pairwise(got)), "never smaller for a larger corpus"
    for n, v in zip(sizes, got, strict=True):
        assert v % STEP == 0 and MIN_VOCAB <= v <= MAX_VOCAB
        want = K * math.sqrt(n)
        if MIN_VOCAB + STEP <= want <= MAX_VOCAB - STEP:
            assert abs(v - want) <= STEP / 2, (n, v, want)
    assert auto_vocab_size(0) == auto_vocab_size(1000) == MIN_VOCAB  # a tiny text: byte pieces + a few
    assert auto_vocab_size(10**12) == MAX_VOCAB
    # the two corpora bench/quality.py measured (bench/README.md): botchan's and the embedded corpus's bytes
    assert auto_vocab_size(256_000) < auto_vocab_size(4_000_000)


def test_auto_size_this_text_cannot_support_becomes_the_size_it_can(tmp_path):
    """A real SentencePiece run: the rule's minimum is more than a short text can make. With the default
    (0) the tokenizer is trained at the size SentencePiece offers; an explicit size stays an error."""
    text = ["the quick brown fox jumps over the lazy dog.\nfoo bar baz qux\n" * 3]
    auto = PrepConfig(out=tmp_path / "a")
    proto = train_spm(text, auto, auto_vocab_size(len(text[0])))
    from data_prep.tokenizer import SentencePieceTokenizer

    tok = SentencePieceTokenizer(proto)
    assert 261 <= tok.vocab_size < MIN_VOCAB
    with pytest.raises(VocabSizeError, match="--vocab-size 512 is too large") as err:
        train_spm(text, PrepConfig(out=tmp_path / "b", vocab_size=512), 512)
    assert err.value.feasible == tok.vocab_size


def test_a_text_with_no_space_trains_a_lossless_tokenizer(tmp_path):
    """A CSV log has no space character at all: the tokenizer trained on it must still carry a space (and
    so everything) through encode/decode. It failed data_prep's lossless check with a traceback before."""
    from data_prep.cli import main as prep_main
    from data_prep.tokenizer import load_tokenizer_from_dir

    rng = random.Random(0)
    rows = [
        f"2025-10-19T08:{m:02d}:{s:02d}Z,web-{rng.randrange(4)},GET,/api/items/{rng.randrange(999)},200"
        for m in range(60)
        for s in range(0, 60, 3)
    ]
    (tmp_path / "log.txt").write_text("\n".join(rows) + "\n")
    assert " " not in (tmp_path / "log.txt").read_text()
    out = tmp_path / "out"
    assert prep_main(["--input", str(tmp_path / "log.txt"), "--out", str(out), "--quiet"]) == 0
    tok = load_tokenizer_from_dir(out)
    text = "two  spaces, a tab\tand caf\u00e9 \u4e2d\u6587 "
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert int(tok.token_bytes[ids].sum()) == len(text.encode())
