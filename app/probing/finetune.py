"""Fine-tuning beside the probe: the LM's embedding and recurrent layers and a linear head, trained
together on the labelled texts (the classifier fine-tuning of ULMFiT and of NVIDIA's sentiment-discovery).

The head reads the mean of the chosen layers' outputs over each text's real tokens (app.classifier.features.pooled): the layers' `forward`
(the training path, from a zero state) on right-padded batches, where the recurrence is causal, so the
pads that follow a text never reach its real positions. AdamW (weight decay 0.01), the LM at `lr` and
the head at HEAD_LR_SCALE x `lr`, gradients clipped to norm 1. Batches are texts of similar length (sorted
with a seeded jitter, so batches differ between epochs) under a row and a padded-token budget, in a
shuffled order; a text longer than `max_tokens` is read up to there (in every split alike, and counted).
On CUDA the padded length is rounded up to a multiple of CUDA_PAD, so the Triton core's CUDA graphs
(one per batch shape) are reused rather than recorded for every new length. After each epoch the
validation accuracy is measured; the epoch with the best one keeps its weights, and they score the
train and test rows. Epochs stop early once PATIENCE of them in a row have not beaten the best one (more
cannot be picked unless the accuracy climbs back), said in one line; every epoch has a progress bar on a
terminal and a line when it ends. The checkpoint's files are never written: the model is a float32 copy in
memory (app.classifier.folder keeps it when the validation split picks it). Multi-label: a sigmoid head,
binary cross-entropy per label, the thresholds chosen on validation after each epoch (app/probing/scores.py).
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from app.classifier.features import length_batches, pooled
from app.classifier.head import sigmoid
from app.common.logs import heartbeat, progress_bar
from app.model import gpu_health
from app.model.lm import LanguageModel
from app.probing.scores import best_thresholds, f1_per_label

HEAD_LR_SCALE = 3.0
WEIGHT_DECAY = 0.01
CLIP_NORM = 1.0
CUDA_PAD = 64
PATIENCE = 3  # epochs without a better validation accuracy before fine-tuning stops (the best one is kept)


@dataclass(frozen=True, slots=True)
class FineTuneConfig:
    epochs: int
    lr: float
    rows: int  # texts per step at most
    batch_tokens: int  # padded tokens per step at most (a longer text is a batch of its own)
    max_tokens: int  # texts are read up to this many tokens (BOS included); 0: whole
    seed: int
    from_scratch: bool  # a control: the same architecture from a fresh initialisation
    multi_label: bool = False  # a sigmoid head (cross-entropy per label), thresholds chosen on validation


@dataclass(frozen=True, slots=True)
class FineTuned:
    val_accuracy_by_epoch: list[float]
    train_loss_by_epoch: list[float]
    best_epoch: int  # 1-based
    val_accuracy: float  # measured again with the restored best epoch's weights
    train_accuracy: float  # the best epoch's weights
    test_accuracy: float
    test_pred: np.ndarray
    tokens: int  # tokens trained on (BOS included), all epochs
    seconds: float  # the training passes only (not the validation after each epoch)
    truncated: int  # texts (all splits) cut to max_tokens
    # multi-label: the accuracies above are macro F1s, at these thresholds per label (chosen on validation)
    thresholds: np.ndarray | None = None
    classifier: Classifier | None = None  # the best epoch's model (the LM's layers and the head)


Split = tuple[list[np.ndarray], np.ndarray]  # (token ids per text, labels (n,) or a 0/1 matrix (n, K))


class Classifier(nn.Module):
    """The LM's layers up to the highest one read, and a linear head on their pooled outputs."""

    def __init__(self, model: LanguageModel, layers: list[int], n_classes: int) -> None:
        super().__init__()
        self.lm, self.layers = model, layers
        self.head = nn.Linear(model.cfg.hidden_dim * len(layers), n_classes)

    def trained_modules(self) -> list[nn.Module]:
        return [self.lm.embedding, *self.lm.recurrent[: max(self.layers) + 1]]

    def forward(self, ids: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        return self.head(pooled(self.lm, ids, lengths, self.layers))  # (B, classes)


def _pad(seqs: list[np.ndarray], rows: np.ndarray, pad_id: int, dev) -> tuple[torch.Tensor, torch.Tensor]:
    lengths = np.asarray([len(seqs[i]) for i in rows], dtype=np.int64)
    T = int(lengths.max())
    if torch.device(dev).type == "cuda":
        T = -(-T // CUDA_PAD) * CUDA_PAD
    batch = np.full((len(rows), T), pad_id, dtype=np.int64)
    for r, i in enumerate(rows):
        batch[r, : lengths[r]] = seqs[i]
    return torch.from_numpy(batch).to(dev), torch.from_numpy(lengths).to(dev)


def _batches(
    seqs: list[np.ndarray], cfg: FineTuneConfig, rng: np.random.Generator | None
) -> list[np.ndarray]:
    """Length-sorted batches (jittered and shuffled when `rng` is given) under cfg.rows and cfg.batch_tokens."""
    lengths = np.asarray([len(s) for s in seqs], dtype=np.int64)
    jitter = None if rng is None else lengths + rng.uniform(0.0, 4.0, len(lengths))
    batches = length_batches(lengths, cfg.batch_tokens, max_rows=cfg.rows, sort_key=jitter)
    if rng is not None:
        rng.shuffle(batches)
    return batches


def accuracy(clf: Classifier, data: Split, cfg: FineTuneConfig, pad_id: int) -> tuple[float, np.ndarray]:
    """(the share of `data`'s texts predicted right, the predictions)."""
    pred = predict(clf, data[0], cfg, pad_id)
    return float((pred == data[1]).mean()), pred


def score(
    clf: Classifier, data: Split, cfg: FineTuneConfig, pad_id: int, thresholds: np.ndarray | None = None
) -> tuple[float, np.ndarray, np.ndarray | None]:
    """Single-label: (accuracy, predictions, None). Multi-label: (macro F1, 0/1 predictions, thresholds),
    at `thresholds`, or at the best ones for `data` when None (the validation split's)."""
    if not cfg.multi_label:
        return (*accuracy(clf, data, cfg, pad_id), None)
    probs = sigmoid(logits(clf, data[0], cfg, pad_id).astype(np.float64))  # as app.classifier.head.Head does
    if thresholds is None:
        thresholds, _ = best_thresholds(probs, data[1])
    pred = (probs >= thresholds).astype(np.int64)
    return float(f1_per_label(data[1], pred).mean()), pred, thresholds


@torch.no_grad()
def logits(clf: Classifier, seqs: list[np.ndarray], cfg: FineTuneConfig, pad_id: int) -> np.ndarray:
    """The head's outputs (n, classes or labels), float32, in `seqs`' order."""
    clf.eval()
    dev = clf.head.weight.device
    out = np.zeros((len(seqs), clf.head.out_features), dtype=np.float32)
    for rows in _batches(seqs, cfg, None):  # a batch a failed GPU loop poisoned is read again (gpu_health)
        out[rows] = gpu_health.checked(clf, *_pad(seqs, rows, pad_id, dev)).float().cpu().numpy()
    return out


def predict(clf: Classifier, seqs: list[np.ndarray], cfg: FineTuneConfig, pad_id: int) -> np.ndarray:
    return logits(clf, seqs, cfg, pad_id).argmax(1)


def _gradients(clf: Classifier, opt, ids, lengths, target, multi_label: bool) -> torch.Tensor:
    """One batch's loss, its gradients in the parameters (zeroed first)."""
    out = clf(ids, lengths)
    if multi_label:
        loss = F.binary_cross_entropy_with_logits(out, target.to(out.dtype))
    else:
        loss = F.cross_entropy(out, target)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    return loss


def _epoch(
    clf: Classifier, opt, data: Split, cfg: FineTuneConfig, pad_id: int, rng, epoch: int
) -> tuple[float, int, float]:
    """One pass over the training rows -> (mean loss, tokens read, seconds); a bar on a terminal."""
    clf.train()
    seqs, y = data
    dev = clf.head.weight.device
    params = [p for g in opt.param_groups for p in g["params"]]
    total, tokens, rows_done, t0 = 0.0, 0, 0, time.perf_counter()
    bar = progress_bar(len(seqs), f"fine-tune epoch {epoch}/{cfg.epochs}", "text")
    for rows in _batches(seqs, cfg, rng):
        ids, lengths = _pad(seqs, rows, pad_id, dev)
        target = torch.from_numpy(y[rows]).to(dev)
        # the gradients again where a failed GPU loop poisoned them: never a NaN step (app/model/gpu_health.py)
        loss = gpu_health.checked(_gradients, clf, opt, ids, lengths, target, cfg.multi_label)
        torch.nn.utils.clip_grad_norm_(params, CLIP_NORM)
        opt.step()
        total += float(loss.detach()) * len(rows)
        tokens += int(lengths.sum())
        rows_done += len(rows)
        bar.update(len(rows))
        bar.set_postfix(loss=f"{total / rows_done:.4f}", refresh=False)
    bar.close()
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    return total / len(seqs), tokens, time.perf_counter() - t0


def _cut(splits: tuple[Split, Split, Split], max_tokens: int) -> tuple[tuple[Split, Split, Split], int]:
    """Every text read up to `max_tokens` tokens (0: whole) -> (splits, texts cut)."""
    if max_tokens == 0:
        return splits, 0
    cut = sum(len(s) > max_tokens for seqs, _ in splits for s in seqs)
    return tuple(([s[:max_tokens] for s in seqs], y) for seqs, y in splits), cut


def fine_tune(
    model: LanguageModel,
    splits: tuple[Split, Split, Split],
    layers: list[int],
    n_classes: int,
    cfg: FineTuneConfig,
    pad_id: int,
    log: Callable[[str], None] = lambda _: None,
) -> FineTuned:
    """(train, validation, test) splits -> FineTuned; `model` itself is left as it was (a copy is trained)."""
    (train, val, test), truncated = _cut(splits, cfg.max_tokens)
    dev = model.embedding.weight.device
    torch.manual_seed(cfg.seed)
    lm = LanguageModel(model.cfg).to(dev) if cfg.from_scratch else copy.deepcopy(model)
    clf = Classifier(lm.float(), layers, n_classes).to(dev)
    lm_params = [p for m in clf.trained_modules() for p in m.parameters()]
    opt = torch.optim.AdamW(
        [
            {"params": lm_params, "lr": cfg.lr},
            {"params": clf.head.parameters(), "lr": HEAD_LR_SCALE * cfg.lr},
        ],
        weight_decay=WEIGHT_DECAY,
    )
    rng = np.random.default_rng(cfg.seed)
    metric = "macro F1" if cfg.multi_label else "accuracy"
    val_acc, losses, best, best_state, tokens, seconds = [], [], -1.0, None, 0, 0.0
    for epoch in range(1, cfg.epochs + 1):
        loss, n, secs = _epoch(clf, opt, train, cfg, pad_id, rng, epoch)
        losses.append(loss)
        tokens, seconds = tokens + n, seconds + secs
        val_acc.append(score(clf, val, cfg, pad_id)[0])
        log(f"fine-tune epoch {epoch}/{cfg.epochs}: loss {loss:.4f}, validation {metric} {val_acc[-1]:.4f}")
        if val_acc[-1] > best:  # ties: the earlier epoch
            best, best_state = val_acc[-1], copy.deepcopy(clf.state_dict())
        elif epoch - (val_acc.index(best) + 1) >= PATIENCE and epoch < cfg.epochs:
            log(
                f"fine-tune: validation {metric} has not improved for {PATIENCE} epochs (best: epoch "
                f"{val_acc.index(best) + 1}); stopping at epoch {epoch} of {cfg.epochs}"
            )
            break
    clf.load_state_dict(best_state)
    with heartbeat(
        f"fine-tune: the best epoch ({val_acc.index(best) + 1}) scored on test, validation and train", log
    ):
        val_best, _, thresholds = score(clf, val, cfg, pad_id)  # multi-label: the thresholds are chosen here
        test_acc, test_pred, _ = score(clf, test, cfg, pad_id, thresholds)
        train_acc = score(clf, train, cfg, pad_id, thresholds)[0]
    return FineTuned(
        val_accuracy_by_epoch=val_acc,
        train_loss_by_epoch=losses,
        best_epoch=val_acc.index(best) + 1,
        val_accuracy=val_best,
        train_accuracy=train_acc,
        test_accuracy=test_acc,
        test_pred=test_pred,
        tokens=tokens,
        seconds=seconds,
        truncated=truncated,
        thresholds=thresholds,
        classifier=clf,
    )
