"""Features of texts from a language model, through the recurrent prefill path (`RecurrentLayer.prefill`).

Each text is read as [BOS, tokens...] (as in training), after the model's `feature_preprocess` (an
import's: `prepare_texts`). Texts are sorted by length and batched under a
padded-token budget; in a right-padded batch every row's feature is taken after ITS last real token
(the recurrence is causal, so the pads that follow never reach it); mean_hidden and max_hidden pool the
layer's output over real positions only. One pass gives every kind; with several layers (--layer all,
or a list) each kind is their features side by side. Layers above the highest asked for are never run. Features are cached as float32 .npy files keyed by
the checkpoint's files and the text file's bytes, and read back with allow_pickle=False.
"""

from __future__ import annotations

import hashlib
import html
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from app.common.logs import progress_bar
from app.model import gpu_health
from app.model.lm import LanguageModel

CACHE_VERSION = 2
FEATURES = ("final_cell", "final_hidden", "mean_hidden", "max_hidden")  # app.probing.config.FEATURES


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


def prepare_texts(texts: list[str], preprocess: str = "none") -> list[str]:
    """The texts as the model's features read them (`feature_preprocess` of its export config): "openai" is
    OpenAI's `preprocess` (utils.py of generating-reviews-discovering-sentiment: HTML entities unescaped,
    newlines as spaces, stripped) padded " " + text + " ": after BOS, which an import reads as "\n", that is
    their "\n " + text + " "; "none" leaves them as they are."""
    if preprocess == "none":
        return texts
    if preprocess != "openai":
        raise ValueError(f"unknown feature preprocessing {preprocess!r}")
    return [" " + html.unescape(t).replace("\n", " ").strip() + " " for t in texts]


def token_ids(tokenizer, texts: list[str], preprocess: str = "none") -> list[np.ndarray]:
    """[BOS, tokens...] of each text, after `prepare_texts`."""
    encoded = tokenizer.encode_batch(prepare_texts(texts, preprocess))
    return [np.asarray([tokenizer.bos_id, *ids], dtype=np.int64) for ids in encoded]


def length_batches(
    lengths: np.ndarray, batch_tokens: int, max_rows: int | None = None, sort_key: np.ndarray | None = None
) -> list[np.ndarray]:
    """Indices sorted by length (or by `sort_key`, e.g. jittered lengths), cut so each batch's padded size
    (rows x longest) stays within the budget and it holds at most `max_rows` rows."""
    order = np.argsort(lengths if sort_key is None else sort_key, kind="stable")
    batches, start, longest = [], 0, 0
    for end in range(1, len(order) + 1):
        longest = max(longest, int(lengths[order[end - 1]]))
        if end == len(order):
            batches.append(order[start:end])
            break
        grown = max(longest, int(lengths[order[end]]))
        if (end + 1 - start) * grown > batch_tokens or (max_rows is not None and end - start >= max_rows):
            batches.append(order[start:end])
            start, longest = end, 0
    return batches


@torch.no_grad()
def batch_feature_sets(
    model: LanguageModel, ids: torch.Tensor, lengths: torch.Tensor, layers: list[int]
) -> dict[str, torch.Tensor]:
    """ids (B, T) right-padded, lengths (B,) -> {kind: (B, H * len(layers))}, every kind of FEATURES from
    one pass, the listed recurrent layers' features side by side (in the order given); read again where a
    failed GPU loop poisoned it (app/model/gpu_health.py)."""
    return gpu_health.checked(_feature_sets, model, ids, lengths, layers)


def _feature_sets(model: LanguageModel, ids: torch.Tensor, lengths: torch.Tensor, layers: list[int]) -> dict:
    real = torch.arange(ids.shape[1], device=ids.device)[None, :] < lengths[:, None]  # (B, T)
    x = model.embedding(ids)  # (B, T, E)
    per_layer: dict[int, dict[str, torch.Tensor]] = {}
    for i, layer_mod in enumerate(model.recurrent[: max(layers) + 1]):
        x, (h, c) = layer_mod.prefill(x, lengths)  # (B, T, H), state after each row's last real token
        if i in layers:
            mask = real[..., None].to(x.dtype)  # (B, T, 1)
            per_layer[i] = {
                "final_cell": c,
                "final_hidden": h,
                "mean_hidden": (x * mask).sum(1) / lengths[:, None].to(x.dtype),  # (B, H)
                "max_hidden": x.masked_fill(~real[..., None], float("-inf")).amax(1),  # (B, H)
            }
    return {k: torch.cat([per_layer[i][k] for i in layers], dim=1) for k in FEATURES}


@torch.no_grad()
def chunked_feature_sets(model: LanguageModel, ids: torch.Tensor, layers: list[int], chunk: int) -> dict:
    """ids (1, T) of one text longer than `chunk` -> `batch_feature_sets`' {kind: (1, H * len(layers))},
    read `chunk` tokens at a time with every layer's state carried from one piece to the next: the memory of
    a piece, not of the whole text (a text of millions of tokens featurizes in the memory of --batch-tokens),
    the same features (the recurrence is the same; only the order of the mean's and max's sums differs)."""
    top = max(layers) + 1
    states: list = [None] * top
    sums: dict[int, torch.Tensor] = {}
    maxes: dict[int, torch.Tensor] = {}
    for a in range(0, ids.shape[1], chunk):
        x = model.embedding(ids[:, a : a + chunk])  # (1, C, E)
        n = torch.tensor([x.shape[1]], device=ids.device)
        for i, layer_mod in enumerate(model.recurrent[:top]):
            x, states[i] = layer_mod.prefill(x, n, state=states[i])  # (1, C, H), the state after the piece
            if i in layers:
                s, m = x.sum(1), x.amax(1)  # (1, H)
                sums[i] = s if i not in sums else sums[i] + s
                maxes[i] = m if i not in maxes else torch.maximum(maxes[i], m)
    per_layer = {
        i: {
            "final_cell": states[i][1],
            "final_hidden": states[i][0],
            "mean_hidden": sums[i] / ids.shape[1],
            "max_hidden": maxes[i],
        }
        for i in layers
    }
    return {k: torch.cat([per_layer[i][k].to(sums[i].dtype) for i in layers], dim=1) for k in FEATURES}


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
                x = torch.from_numpy(batch).to(dev)  # (read again where a failed GPU loop poisoned it)
                got = gpu_health.checked(chunked_feature_sets, model, x, layers, batch_tokens)
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
    all (one pass gives every kind) and save each atomically."""
    got = {k: _load(p, (n_rows, width)) for k, p in paths.items()}
    if all(a is not None for a in got.values()):
        return FeatureSets(got, 0, 0.0, True)
    res = compute()
    for k, path in paths.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp.npy")
        np.save(tmp, res.features[k], allow_pickle=False)
        tmp.replace(path)
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
