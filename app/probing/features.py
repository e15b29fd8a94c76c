"""Features of texts from a language model, through the recurrent prefill path (`RecurrentLayer.prefill`).

Each text is read as [BOS, tokens...] (as in training). Texts are sorted by length and batched under a
padded-token budget; in a right-padded batch every row's feature is taken after ITS last real token
(the recurrence is causal, so the pads that follow never reach it), and mean_hidden averages real
positions only. Layers above --layer are never run. Features are cached as float32 .npy files keyed by
the checkpoint's files and the text file's bytes, and read back with allow_pickle=False.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from app.model.lm import LanguageModel

CACHE_VERSION = 1


@dataclass(frozen=True, slots=True)
class Featurized:
    features: np.ndarray  # (N, H) float32
    tokens: int  # tokens read (BOS included)
    seconds: float  # 0 when read from the cache
    cached: bool


def token_ids(tokenizer, texts: list[str]) -> list[np.ndarray]:
    return [np.asarray([tokenizer.bos_id, *ids], dtype=np.int64) for ids in tokenizer.encode_batch(texts)]


def length_batches(lengths: np.ndarray, batch_tokens: int) -> list[np.ndarray]:
    """Indices sorted by length, cut so each batch's padded size (rows x longest) stays within the budget."""
    order = np.argsort(lengths, kind="stable")
    batches, start = [], 0
    for end in range(1, len(order) + 1):
        if end == len(order) or (end + 1 - start) * lengths[order[end]] > batch_tokens:
            batches.append(order[start:end])
            start = end
    return batches


@torch.no_grad()
def batch_features(model: LanguageModel, ids: torch.Tensor, lengths: torch.Tensor, kind: str, layer: int):
    """ids (B, T) right-padded, lengths (B,) -> (B, H) features of recurrent layer `layer`."""
    x = model.embedding(ids)  # (B, T, E)
    for layer_mod in model.recurrent[: layer + 1]:
        x, (h, c) = layer_mod.prefill(x, lengths)  # (B, T, H), state after each row's last real token
    if kind == "final_cell":
        return c
    if kind == "final_hidden":
        return h
    mask = (torch.arange(ids.shape[1], device=ids.device)[None, :] < lengths[:, None]).to(x.dtype)  # (B, T)
    return (x * mask[..., None]).sum(1) / lengths[:, None].to(x.dtype)  # (B, H)


def featurize(
    model: LanguageModel, ids: list[np.ndarray], kind: str, layer: int, batch_tokens: int, pad_id: int
):
    dev = model.embedding.weight.device
    lengths = np.asarray([len(s) for s in ids], dtype=np.int64)
    out = np.zeros((len(ids), model.cfg.hidden_dim), dtype=np.float32)
    t0 = time.perf_counter()
    for rows in length_batches(lengths, batch_tokens):
        T = int(lengths[rows].max())
        batch = np.full((len(rows), T), pad_id, dtype=np.int64)
        for r, i in enumerate(rows):
            batch[r, : lengths[i]] = ids[i]
        f = batch_features(
            model, torch.from_numpy(batch).to(dev), torch.from_numpy(lengths[rows]).to(dev), kind, layer
        )
        out[rows] = f.float().cpu().numpy()
    return Featurized(out, int(lengths.sum()), time.perf_counter() - t0, False)


def checkpoint_digest(src_path: Path) -> str:
    """sha256 over the checkpoint/export folder's files (names and bytes): new weights, new features."""
    h = hashlib.sha256()
    for p in sorted(q for q in src_path.rglob("*") if q.is_file()):
        h.update(str(p.relative_to(src_path)).encode() + b"\0")
        with p.open("rb") as f:
            while chunk := f.read(1 << 22):
                h.update(chunk)
    return h.hexdigest()


def cache_path(
    cache_dir: Path, ckpt_digest: str, file_sha: str, text_field: str, kind: str, layer: int
) -> Path:
    key = f"v{CACHE_VERSION}|{ckpt_digest}|{file_sha}|{text_field}|{kind}|{layer}"
    return cache_dir / f"{hashlib.sha256(key.encode()).hexdigest()[:32]}.npy"


def cached_or_featurize(path: Path, n_rows: int, hidden: int, compute) -> Featurized:
    """Read `path` when it holds an (n_rows, hidden) float32 array; else `compute()` and save atomically."""
    if path.is_file():
        try:
            arr = np.load(path, allow_pickle=False)
            if arr.shape == (n_rows, hidden) and arr.dtype == np.float32:
                return Featurized(arr, 0, 0.0, True)
        except (OSError, ValueError):
            pass  # a torn or foreign file: recompute and overwrite it
    res = compute()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.npy")
    np.save(tmp, res.features, allow_pickle=False)
    tmp.replace(path)
    return res


@torch.no_grad()
def neuron_trace(model: LanguageModel, ids: np.ndarray, kind: str, layer: int, neuron: int) -> np.ndarray:
    """The neuron's value after each token of one text (T,), stepping the probed layer token by token
    (`RecurrentLayer.step`): the cell for final_cell, the hidden state for final_hidden, the layer output
    (whose mean is the feature) for mean_hidden."""
    dev = model.embedding.weight.device
    x = model.embedding(torch.as_tensor(ids, device=dev)[None])  # (1, T, E)
    lengths = torch.tensor([len(ids)], device=dev)
    for layer_mod in model.recurrent[:layer]:
        x, _ = layer_mod.prefill(x, lengths)  # (1, T, H)
    probed = model.recurrent[layer]
    state = probed.init_state(1, dev, x.dtype)
    out = []
    for t in range(x.shape[1]):
        y, state = probed.step(x[:, t], state)  # (1, H)
        v = state[1] if kind == "final_cell" else state[0] if kind == "final_hidden" else y
        out.append(float(v[0, neuron]))
    return np.asarray(out, dtype=np.float32)
