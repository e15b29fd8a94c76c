"""One huge document with no line break: cut into parts at the same places for any --num-proc, in
memory that does not grow with the document (bench/README.md "Data prep memory" has the 300 MB figures)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from data_prep.format import load_prepared

PEAK_RSS = (
    "import resource, subprocess, sys; subprocess.run(sys.argv[1:], check=True); "
    "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)"
)  # KiB: the largest resident set among the prep and its workers


def _one_line(path: Path, mb: float) -> int:
    """Words and spaces (a two-byte character among them), no newline; returns the size in bytes."""
    rng = np.random.default_rng(0)
    letters = np.array(list("etaoinshrdlucmfwypvbgk"))
    words = ["".join(rng.choice(letters, n)) for n in rng.integers(2, 10, 3000)] + ["caf\u00e9"]
    text = " ".join(rng.choice(words, int(mb * 1e6 / 6)))
    path.write_text(text, encoding="utf-8")
    return len(text.encode())


def _prep(src: Path, out: Path, num_proc: int, *tokenizer: str) -> int:
    """Peak RSS (KiB) of `python -m data_prep` on `src`."""
    cmd = [sys.executable, "-m", "data_prep", "--input", str(src), "--out", str(out), *tokenizer]
    p = subprocess.run(
        [sys.executable, "-c", PEAK_RSS, *cmd, "--num-proc", str(num_proc), "--quiet"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    return int(p.stdout.split()[-1])


def _digests(out: Path) -> list[str]:
    manifest = json.loads((out / "manifest.json").read_text())
    return [f["xxh3_128"] for g in manifest["groups"] for f in g["files"].values()]


# `long`: three preps of 5-16 MB one-line texts, their peak memory measured (bench/README.md's "Data prep memory"
# measures it at 300 MB); what only it runs is SentencePiece on a one-line document, cut the same way for any
# --num-proc, in memory that does not grow with it
@pytest.mark.long
def test_a_huge_line_is_cut_the_same_way_in_bounded_memory(tmp_path):
    """SentencePiece trains on a one-line document (its trainer dropped every line over 2048 characters, so
    it failed with `!sentences_.empty()`) and encodes it in parts cut the same way for any --num-proc."""
    small, big = tmp_path / "small.txt", tmp_path / "big.txt"
    size = _one_line(big, 16) - _one_line(small, 5)  # both over the 4 MB the tokenizer trains on
    spm = ["--tokenizer", "sentencepiece"]  # the vocabulary sized by the corpus, as by default
    base = _prep(small, tmp_path / "small", 2, *spm)
    peak = _prep(big, tmp_path / "big2", 2, *spm)
    _prep(big, tmp_path / "big1", 1, *spm)
    assert _digests(tmp_path / "big1") == _digests(tmp_path / "big2")  # cut the same way for any --num-proc
    meta = load_prepared(tmp_path / "big2").meta
    assert sum(s["bytes"] for s in meta["splits"].values()) == big.stat().st_size  # every byte, no char split
    assert meta["documents"]["kept"] > 1  # it was cut into parts
    # 11 MB more text costs less extra memory than the text itself (held whole, with its int32 ids, it
    # would be 5x that)
    assert (peak - base) * 1024 < size, (base, peak, size)
