"""Transfer's features of its labelled splits: every kind at once through the prefill path
(app.classifier.features, the arithmetic a kept classifier reads them with), with a progress bar, cached
as float32 .npy files keyed by the checkpoint's files and the text file's bytes and read back with
allow_pickle=False; and one neuron's trace over a text (the heatmap's values).
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from app.classifier.features import batch_feature_sets, chunked_feature_sets, length_batches
from app.classifier.spec import FEATURES
from app.common import outputs
from app.common.logs import progress_bar
from app.model.lm import LanguageModel

CACHE_VERSION = 2


@dataclass(frozen=True, slots=True)
class Featurized:
    features: np.ndarray  # (N, H) float32
    tokens: int  # tokens read (BOS included)
    seconds: float  # 0 when read from the cache
    cached: bool


@dataclass(frozen=True, slots=True)
class FeatureSets:
    features: dict[str, np.ndarray]  # kind -> (N, H * layers) float32
    tokens: int
    seconds: float
    cached: bool


def batch_features(model: LanguageModel, ids: torch.Tensor, lengths: torch.Tensor, kind: str, layer: int):
    """ids (B, T) right-padded, lengths (B,) -> (B, H) features `kind` of recurrent layer `layer`."""
    return batch_feature_sets(model, ids, lengths, [layer])[kind]


def featurize_sets(
    model: LanguageModel,
    ids: list[np.ndarray],
    layers: list[int],
    batch_tokens: int,
    pad_id: int,
    name: str = "texts",
) -> FeatureSets:
    """Every kind of feature of every text, read once in length-sorted batches under `batch_tokens` (a
    progress bar on a terminal, counting the texts of `name`); a text longer than `batch_tokens` is read in
    pieces of that many tokens with the state carried (`chunked_feature_sets`)."""
    dev = model.embedding.weight.device
    lengths = np.asarray([len(s) for s in ids], dtype=np.int64)
    width = model.cfg.hidden_dim * len(layers)
    out = {k: np.zeros((len(ids), width), dtype=np.float32) for k in FEATURES}
    t0 = time.perf_counter()
    with progress_bar(len(ids), f"featurize {name}", "text") as bar:
        for rows in length_batches(lengths, batch_tokens):
            T = int(lengths[rows].max())
            batch = np.full((len(rows), T), pad_id, dtype=np.int64)
            for r, i in enumerate(rows):
                batch[r, : lengths[i]] = ids[i]
            lens = torch.from_numpy(lengths[rows]).to(dev)
            if batch.shape[1] > batch_tokens:  # one text alone: its pieces, the state carried
                got = chunked_feature_sets(model, torch.from_numpy(batch).to(dev), layers, batch_tokens)
            else:
                got = batch_feature_sets(model, torch.from_numpy(batch).to(dev), lens, layers)
            for k, f in got.items():
                out[k][rows] = f.float().cpu().numpy()
            bar.update(len(rows))
    return FeatureSets(out, int(lengths.sum()), time.perf_counter() - t0, False)


def featurize(
    model: LanguageModel, ids: list[np.ndarray], kind: str, layer: int, batch_tokens: int, pad_id: int
) -> Featurized:
    res = featurize_sets(model, ids, [layer], batch_tokens, pad_id)
    return Featurized(res.features[kind], res.tokens, res.seconds, False)


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
    cache_dir: Path, ckpt_digest: str, file_sha: str, text_field: str, kind: str, layers: list[int]
) -> Path:
    key = f"v{CACHE_VERSION}|{ckpt_digest}|{file_sha}|{text_field}|{kind}|{','.join(map(str, layers))}"
    return cache_dir / f"{hashlib.sha256(key.encode()).hexdigest()[:32]}.npy"


def _load(path: Path, shape: tuple[int, int]) -> np.ndarray | None:
    if path.is_file():
        try:
            arr = np.load(path, allow_pickle=False)
            if arr.shape == shape and arr.dtype == np.float32:
                return arr
        except (OSError, ValueError):
            pass  # a torn or foreign file: recompute and overwrite it
    return None


def cached_or_featurize(paths: dict[str, Path], n_rows: int, width: int, compute) -> FeatureSets:
    """Read every kind's (n_rows, width) float32 array from `paths`; when one is missing, `compute()` them
    all (one pass gives every kind) and save each whole (app/common/outputs.new_file)."""
    got = {k: _load(p, (n_rows, width)) for k, p in paths.items()}
    if all(a is not None for a in got.values()):
        return FeatureSets(got, 0, 0.0, True)
    res = compute()
    for k, path in paths.items():
        with outputs.new_file(path) as tmp:  # whole or not at all: nothing left behind by a full disk
            np.save(tmp, res.features[k], allow_pickle=False)
    return res


@torch.no_grad()
def neuron_trace(model: LanguageModel, ids: np.ndarray, kind: str, layer: int, neuron: int) -> np.ndarray:
    """The neuron's value after each token of one text (T,), stepping the probed layer token by token
    (`RecurrentLayer.step`): the cell for final_cell, the hidden state for final_hidden, the layer output
    (whose mean or max is the feature) for mean_hidden and max_hidden."""
    dev = model.embedding.weight.device
    x = model.embedding(torch.as_tensor(ids, device=dev)[None])  # (1, T, E)
    lengths = torch.tensor([len(ids)], device=dev)
    for layer_mod in model.recurrent[:layer]:
        x, _ = layer_mod.prefill(x, lengths)  # (1, T, H)
    probed = model.recurrent[layer]
    state = probed.init_state(1, dev, x.dtype)
    weights = None if probed.cell == "lstm" else probed.weights()  # weight norm once, not once a step
    out = []
    for t in range(x.shape[1]):
        y, state = probed.step(x[:, t], state, weights)  # (1, H)
        v = state[1] if kind == "final_cell" else state[0] if kind == "final_hidden" else y
        out.append(float(v[0, neuron]))
    return np.asarray(out, dtype=np.float32)
