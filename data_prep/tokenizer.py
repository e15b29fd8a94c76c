"""Tokenizers shared by data prep, training, evaluation, generation and export.

Two kinds, both lossless (``decode(encode(text)) == text``) and both with ``pad_id == 0``:

* ``sentencepiece``: a SentencePiece model trained with identity normalization, no dummy prefix,
  no whitespace folding and byte fallback, so code indentation survives and nothing maps to unknown.
  Ids: pad 0, unk 1, bos 2, eos 3, then the pieces.
* ``byte``: the byte-level setting of the original mLSTM work. Ids: pad 0, bos 1, eos 2, and byte
  ``b`` is id ``b + 3`` (vocab 259).

``token_bytes[i]`` is the UTF-8 byte length of token ``i`` (0 for specials). Because every token
decodes to a fixed byte string, the bytes of any token sequence are the sum of its table entries,
which is what makes the stored ``num_bytes`` additive over chunks and bits-per-byte honest.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from data_prep.format import TOKENIZER_FILE, load_prepared

# Any lossless tokenizer must round-trip these: runs of spaces, tabs, CRs, leading space, rare
# characters (byte fallback), NFKC-sensitive ligatures and full-width digits.
_PROBE = "  lead\n\tx  = 1\r\n\n   y\u00a0\ufb01 \uff11\U0001d518 caf\u00e9 \u4e2d\u6587  "


class Tokenizer(ABC):
    """Common interface: ids are ints in ``[0, vocab_size)``; specials decode to nothing."""

    vocab_size: int
    pad_id: int
    bos_id: int
    eos_id: int
    unk_id: int | None
    token_bytes: np.ndarray  # (vocab_size,) int64

    @abstractmethod
    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]: ...

    @abstractmethod
    def decode(self, ids: Sequence[int]) -> str: ...

    @abstractmethod
    def meta(self) -> dict[str, Any]:
        """The ``meta["tokenizer"]`` dict that ``load_tokenizer`` reads back."""

    def encode(self, text: str) -> list[int]:
        return self.encode_batch([text])[0]

    def encode_arrays(self, texts: Sequence[str]) -> list[np.ndarray]:
        """Like ``encode_batch`` but int32 arrays (the data-prep fast path)."""
        return [np.asarray(ids, dtype=np.int32) for ids in self.encode_batch(texts)]

    def check_lossless(self, source: str) -> None:
        """Raise ValueError (naming ``source``) unless the probe text round-trips with additive byte counts."""
        ids = self.encode(_PROBE)
        if self.decode(ids) != _PROBE:
            raise ValueError(
                f"{source}: tokenizer is not lossless (it normalizes text or folds whitespace); "
                "train it with normalization_rule_name=identity, add_dummy_prefix=false, "
                "remove_extra_whitespaces=false, byte_fallback=true, or let data_prep train one"
            )
        if int(self.token_bytes[ids].sum()) != len(_PROBE.encode("utf-8")):
            raise ValueError(f"{source}: token byte lengths do not add up to the text's UTF-8 length")


class ByteTokenizer(Tokenizer):
    """UTF-8 bytes as tokens: id = byte + 3."""

    OFFSET = 3

    def __init__(self) -> None:
        self.pad_id, self.bos_id, self.eos_id, self.unk_id = 0, 1, 2, None
        self.vocab_size = 256 + self.OFFSET
        self.token_bytes = np.ones(self.vocab_size, dtype=np.int64)
        self.token_bytes[: self.OFFSET] = 0

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [a.tolist() for a in self.encode_arrays(texts)]

    def encode_arrays(self, texts: Sequence[str]) -> list[np.ndarray]:
        return [
            np.frombuffer(t.encode("utf-8"), dtype=np.uint8).astype(np.int32) + self.OFFSET for t in texts
        ]

    def decode(self, ids: Sequence[int]) -> str:
        arr = np.asarray(ids, dtype=np.int64)
        arr = arr[arr >= self.OFFSET] - self.OFFSET
        return arr.astype(np.uint8).tobytes().decode("utf-8", errors="replace")

    def meta(self) -> dict[str, Any]:
        return {
            "type": "byte",
            "vocab_size": self.vocab_size,
            "pad_id": self.pad_id,
            "bos_id": self.bos_id,
            "eos_id": self.eos_id,
            "unk_id": None,
            "byte_offset": self.OFFSET,
            "model_file": None,
        }


class SentencePieceTokenizer(Tokenizer):
    """A SentencePiece model held as bytes, so it pickles cheaply into ``Dataset.map`` workers."""

    def __init__(self, model_proto: bytes, num_threads: int = 1) -> None:
        self.model_proto = model_proto
        self.num_threads = num_threads
        self._load()

    def _load(self) -> None:
        import sentencepiece as spm

        sp = spm.SentencePieceProcessor(model_proto=self.model_proto)
        self._sp = sp
        self.vocab_size = sp.get_piece_size()
        self.pad_id, self.bos_id, self.eos_id = sp.pad_id(), sp.bos_id(), sp.eos_id()
        self.unk_id = sp.unk_id()
        table = np.zeros(self.vocab_size, dtype=np.int64)
        for i in range(self.vocab_size):
            if sp.is_control(i) or sp.is_unknown(i):
                continue  # decode() drops controls; unknown never appears with byte fallback
            table[i] = 1 if sp.is_byte(i) else len(sp.id_to_piece(i).replace("\u2581", " ").encode("utf-8"))
        self.token_bytes = table

    def __getstate__(self) -> dict[str, Any]:
        return {"model_proto": self.model_proto, "num_threads": self.num_threads}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.model_proto, self.num_threads = state["model_proto"], state["num_threads"]
        self._load()

    @classmethod
    def from_file(cls, path: str | Path) -> SentencePieceTokenizer:
        return cls(Path(path).read_bytes())

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return self._sp.encode(list(texts), num_threads=self.num_threads)

    def encode_arrays(self, texts: Sequence[str]) -> list[np.ndarray]:
        try:  # sentencepiece >= 0.2.1 hands back int32 buffers without building Python ints
            return self._sp.encode(list(texts), num_threads=self.num_threads, return_type="numpy")
        except (TypeError, ValueError):
            return super().encode_arrays(texts)

    def decode(self, ids: Sequence[int]) -> str:
        keep = [int(i) for i in ids if i not in (self.pad_id, self.bos_id, self.eos_id)]
        return self._sp.decode(keep)

    def check_ids(self, source: str) -> None:
        """The trainer relies on pad 0 and real bos/eos pieces; refuse models without them."""
        if self.pad_id != 0 or self.bos_id < 0 or self.eos_id < 0:
            raise ValueError(
                f"{source}: needs pad_id=0 and bos/eos pieces (has pad={self.pad_id}, bos={self.bos_id}, "
                f"eos={self.eos_id}); train it with pad_id=0 unk_id=1 bos_id=2 eos_id=3, or let data_prep train one"
            )

    def meta(self) -> dict[str, Any]:
        return {
            "type": "sentencepiece",
            "vocab_size": self.vocab_size,
            "pad_id": self.pad_id,
            "bos_id": self.bos_id,
            "eos_id": self.eos_id,
            "unk_id": self.unk_id,
            "model_file": TOKENIZER_FILE,
        }


def load_tokenizer(meta_tokenizer: dict[str, Any], model_path: str | Path | None) -> Tokenizer:
    """Rebuild the tokenizer described by ``meta["tokenizer"]`` (``model_path``: its SentencePiece file)."""
    kind = meta_tokenizer.get("type")
    if kind == "byte":
        tok: Tokenizer = ByteTokenizer()
    elif kind == "sentencepiece":
        if model_path is None or not Path(model_path).is_file():
            raise FileNotFoundError(f"SentencePiece model file not found: {model_path}")
        tok = SentencePieceTokenizer.from_file(model_path)
    else:
        raise ValueError(f"unknown tokenizer type {kind!r} in meta; expected 'sentencepiece' or 'byte'")
    for key in ("vocab_size", "pad_id", "bos_id", "eos_id"):
        if key in meta_tokenizer and meta_tokenizer[key] != getattr(tok, key):
            raise ValueError(
                f"tokenizer {key} mismatch: meta says {meta_tokenizer[key]}, model has {getattr(tok, key)}"
            )
    return tok


def load_tokenizer_from_dir(prepared_dir: str | Path) -> Tokenizer:
    """The tokenizer of a data_prep output directory."""
    data = load_prepared(prepared_dir)
    return load_tokenizer(data.meta["tokenizer"], data.tokenizer_path)
