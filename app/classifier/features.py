"""The features a classifier reads from a language model: each text as [BOS, tokens...] (after the model's
`feature_preprocess`: `prepare_texts`), sorted by length and batched under a padded-token budget.

Two paths, one per method of app.classifier.head:
- the prefill path (`RecurrentLayer.prefill`), a probe's: in a right-padded batch every row's feature is
  taken after ITS last real token (the recurrence is causal, so the pads that follow never reach it);
  mean_hidden and max_hidden pool the layer's output over real positions only. One pass gives every kind;
  with several layers each kind is their features side by side. Layers above the highest asked for are
  never run.
- the fine-tuning path (`pooled`: the layers' `forward`), a fine-tuned head's: the mean of the layers'
  outputs over the real tokens, as fine-tuning trained and scored it.
A text longer than the budget is read in pieces of that many tokens with every layer's state carried from
one piece to the next (`chunked_feature_sets`, `chunked_pooled`): the memory of a piece, never of the whole
text, whatever its length (`read_features` says how far it is after every piece).
"""

from __future__ import annotations

import html
from collections.abc import Callable

import numpy as np
import torch

from app.classifier.spec import FEATURES
from app.model import gpu_health
from app.model.lm import LanguageModel


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
def chunked_feature_sets(
    model: LanguageModel,
    ids: torch.Tensor,
    layers: list[int],
    chunk: int,
    step: Callable[[int], None] = lambda _: None,
) -> dict:
    """ids (1, T) of one text longer than `chunk` -> `batch_feature_sets`' {kind: (1, H * len(layers))},
    read `chunk` tokens at a time with every layer's state carried from one piece to the next: the memory of
    a piece, not of the whole text (a text of millions of tokens featurizes in the memory of --batch-tokens),
    the same features (the recurrence is the same; only the order of the mean's and max's sums differs).
    `step(tokens)` after each piece."""
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
        step(int(n))
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


def pooled(model: LanguageModel, ids: torch.Tensor, lengths: torch.Tensor, layers: list[int]) -> torch.Tensor:
    """ids (B, T) right-padded, lengths (B,) -> (B, H * len(layers)): the listed layers' outputs averaged
    over each row's real tokens, side by side in the order given (differentiable: fine-tuning's path)."""
    real = (torch.arange(ids.shape[1], device=ids.device)[None, :] < lengths[:, None])[..., None]  # (B, T, 1)
    x = model.embedding(ids)  # (B, T, E)
    means = {}
    for i, layer in enumerate(model.recurrent[: max(layers) + 1]):
        x = layer(x)  # (B, T, H)
        if i in layers:
            means[i] = (x * real.to(x.dtype)).sum(1) / lengths[:, None].to(x.dtype)
    return torch.cat([means[i] for i in layers], dim=1)


@torch.no_grad()
def chunked_pooled(
    model: LanguageModel, ids: torch.Tensor, layers: list[int], chunk: int, step: Callable[[int], None]
) -> torch.Tensor:
    """ids (1, T) of one text longer than `chunk` -> `pooled`'s (1, H * len(layers)), read `chunk` tokens at
    a time through the layers' training path from the state the piece before ended with
    (`forward_from`); `step(tokens)` after each piece."""
    top = max(layers) + 1
    states: list = [None] * top
    sums: dict[int, torch.Tensor] = {}
    for a in range(0, ids.shape[1], chunk):
        x = model.embedding(ids[:, a : a + chunk])  # (1, C, E)
        for i, layer_mod in enumerate(model.recurrent[:top]):
            if states[i] is None:
                states[i] = layer_mod.init_state(1, x.device, x.dtype)
            x, states[i] = layer_mod.forward_from(x, states[i])  # (1, C, H)
            if i in layers:
                sums[i] = x.sum(1) if i not in sums else sums[i] + x.sum(1)  # (1, H)
        step(x.shape[1])
    return torch.cat([sums[i] / ids.shape[1] for i in layers], dim=1)


def read_features(
    model: LanguageModel,
    ids: list[np.ndarray],
    head: tuple[str, str, list[int]],
    batch_tokens: int,
    pad_id: int,
    step: Callable[[int], None] = lambda _: None,
) -> np.ndarray:
    """Each text's features (n, H * len(layers)) float32 in `ids`' order, as a classifier of
    `head` = (method, kind, layers) reads them; texts longer than `batch_tokens` in pieces with the state
    carried (the memory of `batch_tokens` tokens, whatever the length). `step(tokens)` after every batch
    and every piece: long work says how far it is."""
    method, kind, layers = head
    dev = model.embedding.weight.device
    lengths = np.asarray([len(s) for s in ids], dtype=np.int64)
    out = np.zeros((len(ids), model.cfg.hidden_dim * len(layers)), dtype=np.float32)
    for rows in length_batches(lengths, batch_tokens):
        batch = np.full((len(rows), int(lengths[rows].max())), pad_id, dtype=np.int64)  # (B, T)
        for r, i in enumerate(rows):
            batch[r, : lengths[i]] = ids[i]
        x = torch.from_numpy(batch).to(dev)
        # a batch (or a long text's pieces) in which a GPU loop failed is read again (app/model/gpu_health.py)
        if batch.shape[1] > batch_tokens:  # one text alone (length_batches): its pieces, the state carried
            if method == "finetune":
                f = gpu_health.checked(chunked_pooled, model, x, layers, batch_tokens, step)
            else:
                f = gpu_health.checked(chunked_feature_sets, model, x, layers, batch_tokens, step)[kind]
        else:
            lens = torch.from_numpy(lengths[rows]).to(dev)
            with torch.no_grad():
                f = gpu_health.checked(pooled, model, x, lens, layers) if method == "finetune" else None
                f = batch_feature_sets(model, x, lens, layers)[kind] if f is None else f
            step(int(lengths[rows].sum()))
        out[rows] = f.float().cpu().numpy()
    return out
