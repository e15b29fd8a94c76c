"""Multi-label transfer: several labels per text (emotions, topics), one-vs-rest.

Labels come from several --label-field columns (each a 0/1, true/false or yes/no indicator: the label is
the column's name) or from one column whose values are lists of labels (JSONL, Parquet). Every label needs
positive and negative rows in --train (one line names the label otherwise).

The probe: one-vs-rest L1 logistic regressions, every label's on the same path of app/probing/l1_path.py
over C_GRID (one pass over the standardised features serves all labels; the objective is separable, so
each label's weights are its own fit's). At each C every label gets the threshold with its best validation
F1 (app.probing.scores.best_thresholds); each label keeps the C with its best such F1, with that threshold
(ties: the smaller C). No refit on train + validation (the single-label probe's last step): a threshold belongs to the
model it was chosen for. The feature kind is picked by validation macro F1.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from app.classifier.head import sigmoid, top_neurons
from app.common.errors import UserError
from app.probing.l1_path import l1_path
from app.probing.probe import C_GRID, _single_neuron, standardise
from app.probing.scores import best_thresholds, multilabel_scores

TRUE = ("1", "true", "yes", "y", "t")
FALSE = ("0", "false", "no", "n", "f", "")


@dataclass(frozen=True, slots=True)
class MultiLabels:
    """The label set of a multi-label task, in --train's order (the --label-field columns, or the
    sorted union of a list column's labels)."""

    names: list[str]
    dropped: tuple[str, ...] = ()  # --drop-rare-labels: left out of the task (and out of every row)

    def encode(self, data, flag: str) -> np.ndarray:
        """A Labelled's rows (their tuples of label names) -> a 0/1 matrix (n, K); a label --train does not
        have is one line."""
        index = {n: i for i, n in enumerate(self.names)}
        Y = np.zeros((len(data.labels), len(self.names)), dtype=np.int64)
        for r, row in enumerate(data.labels):
            for name in row:
                if name in self.dropped:
                    continue
                if name not in index:
                    raise UserError(
                        f"--{flag} {data.path}: row {r + 1}: label {name!r} does not occur in --train "
                        f"(its labels: {', '.join(self.names)})"
                    )
                Y[r, index[name]] = 1
        return Y


def indicator(value: object, field: str, row: int, where: str) -> bool:
    """One cell of a --label-field indicator column: 0/1, a bool, or true/false, yes/no in words."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, float) and value in (0.0, 1.0):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in TRUE + FALSE:
        return value.strip().lower() in TRUE
    raise UserError(f"{where}: row {row}: {field!r} is {value!r}; a label column holds 0/1 or true/false")


def list_labels(value: object, field: str, row: int, where: str) -> tuple[str, ...]:
    """One cell of a list-valued --label-field: a list of label names (strings or integers)."""
    if not isinstance(value, list | tuple):
        raise UserError(f"{where}: row {row}: {field!r} is {value!r}, not a list of labels")
    for v in value:
        if isinstance(v, bool) or not isinstance(v, str | int) or (isinstance(v, str) and not v.strip()):
            raise UserError(f"{where}: row {row}: {field!r} holds {v!r}, not a label name")
    return tuple(sorted({str(v) for v in value}))


def labels_of(
    train_labels: list[tuple[str, ...]], fields: list[str], path, rare_ok: bool = False
) -> MultiLabels:
    """The label set (several fields: their names in order; a list field: the sorted union), each label
    checked to have positive and negative rows in --train (`rare_ok`, --drop-rare-labels: a label of no
    positive row is left for app.probing.splits.check_labels to drop)."""
    names = fields if len(fields) > 1 else sorted({n for row in train_labels for n in row})
    if not names:
        raise UserError(f"--train {path}: no row has a label; a multi-label task needs some")
    counts = {n: sum(n in row for row in train_labels) for n in names}
    for n, c in counts.items():
        if (c == 0 and not rare_ok) or c == len(train_labels):
            which = "no row" if c == 0 else "every row"
            raise UserError(
                f"--train {path}: {which} of --train has the label {n!r}; a one-vs-rest probe needs "
                "rows with and without each label"
            )
    return MultiLabels(list(names))


@dataclass(frozen=True, slots=True)
class MultiProbe:
    C_by_label: dict[str, float]
    thresholds: np.ndarray  # (K,)
    val_f1_by_label: dict[str, float]  # at the chosen C and threshold
    val_macro_f1: float
    val_f1_by_C: dict[str, dict[str, float]]  # label -> {C: best validation F1 at that C}
    converged_by_label: dict[str, bool]  # the chosen C's fit within its iteration bound
    train: dict  # multilabel_scores on the training rows
    test: dict  # ... on the test rows
    nonzero: int  # feature columns with a non-zero weight for some label
    top: list[dict]  # [{"neuron", "weight": {label: w}}], by the largest |weight|
    single: dict  # the top neuron alone on its strongest label: {"neuron", "label", accuracies, "threshold"}
    coef: np.ndarray  # (K, d) float64, on standardised features
    intercept: np.ndarray  # (K,)
    test_pred: np.ndarray  # (n_test, K) 0/1


def _fit_line(name: str, fit, f1: np.ndarray) -> str:
    """One line per C of the joint path: what a user watching the probe sees."""
    state = "converged" if fit.converged else "not converged (iteration bound reached)"
    return (
        f"probe {name}: C {fit.C:g}: validation macro F1 {f1.mean():.4f} (each label at its best threshold), "
        f"{int((fit.coef != 0).any(0).sum())} non-zero weights, {fit.iterations} iterations, {state}, "
        f"{fit.seconds:.1f} s"
    )


def fit_multilabel_probe(
    train: tuple,
    val: tuple,
    test: tuple,
    names: list[str],
    top_k: int,
    seed: int,
    name: str = "features",
    log: Callable[[str], None] = lambda _: None,
) -> tuple[MultiProbe, np.ndarray, np.ndarray]:
    """(X, Y) triples (Y (n, K) 0/1), raw features -> (MultiProbe, feature mean, feature scale); `log` gets
    a line per C of the path (every label at once) and one per label (its C and threshold)."""
    mean, scale = standardise(train[0])
    Xtr, Xva, Xte = ((X - mean) / scale for X in (train[0], val[0], test[0]))
    Ytr, Yva, Yte = train[1], val[1], test[1]
    f1, thr = {}, {}  # C -> (K,) each label's best validation F1, and its threshold

    def report(fit) -> None:
        thr[fit.C], f1[fit.C] = best_thresholds(sigmoid(fit.decision(Xva)), Yva)
        log(_fit_line(name, fit, f1[fit.C]))

    fits = {f.C: f for f in l1_path(Xtr, Ytr, 2, C_GRID, report)}
    C_by, rows, conv = {}, [], {}
    for k, label in enumerate(names):
        C = max(C_GRID, key=lambda c: (f1[c][k], -c))  # ties: the sparser (smaller C) model
        C_by[label], conv[label] = C, fits[C].converged
        rows.append((fits[C].coef[k], fits[C].intercept[k], thr[C][k]))
        log(
            f"probe {name}, label {label}: C {C:g}: validation F1 {f1[C][k]:.4f} at threshold {thr[C][k]:.2f}, "
            f"{int((fits[C].coef[k] != 0).sum())} non-zero weights"
        )
    coef = np.stack([r[0] for r in rows])  # (K, d)
    intercept = np.asarray([r[1] for r in rows])  # (K,)
    thresholds = np.asarray([r[2] for r in rows])  # (K,)

    def predict(X):
        return (sigmoid(X @ coef.T + intercept) >= thresholds).astype(np.int64)

    val_scores = multilabel_scores(Yva, predict(Xva), names)
    order = top_neurons(coef, top_k)
    top = [{"neuron": n, "weight": {lab: float(coef[k, n]) for k, lab in enumerate(names)}} for n in order]
    probe = MultiProbe(
        C_by_label=C_by,
        thresholds=thresholds,
        val_f1_by_label=val_scores["f1_by_label"],
        val_macro_f1=val_scores["macro_f1"],
        val_f1_by_C={lab: {f"{c:g}": float(f1[c][k]) for c in C_GRID} for k, lab in enumerate(names)},
        converged_by_label=conv,
        train=multilabel_scores(Ytr, predict(Xtr), names),
        test=multilabel_scores(Yte, predict(Xte), names),
        nonzero=int((np.abs(coef).max(0) > 0).sum()),
        top=top,
        single=_single(order, coef, names, (Xtr, Ytr), (Xte, Yte), mean, scale, seed),
        coef=coef,
        intercept=intercept,
        test_pred=predict(Xte),
    )
    return probe, mean, scale


def _single(order, coef, names, tr, te, mean, scale, seed) -> dict:
    """The top neuron alone on the label it weighs most (of those with both classes among the training
    rows): a one-feature logistic regression on that label, its balanced accuracy the figure (a rare
    label's plain accuracy is its all-negative rate however the neuron does; both are kept), the threshold
    in the raw neuron's units."""
    n = order[0] if order else 0
    both = [k for k in range(len(names)) if 0 < tr[1][:, k].sum() < len(tr[1])]
    k = max(both, key=lambda j: abs(coef[j, n])) if both else int(np.abs(coef[:, n]).argmax())
    if not both:  # no label has both classes among the training rows: nothing to fit a threshold on
        none = ("train_accuracy", "test_accuracy", "train_balanced_accuracy", "test_balanced_accuracy")
        return {"label": names[k], "neuron": int(n), **dict.fromkeys(none), "threshold": None}
    single = _single_neuron(n, (tr[0], tr[1][:, k]), (te[0], te[1][:, k]), seed)
    thr = single.pop("threshold_standardised")
    single["threshold"] = [float(t * scale[n] + mean[n]) for t in thr] if thr else None
    return {"label": names[k], **single}


def multi_label_result(probe: MultiProbe, y: dict[str, np.ndarray]) -> dict:
    """transfer.json's probe fields of a multi-label task (y: each split's 0/1 matrix)."""
    names = list(probe.C_by_label)
    return {
        "labels": names,
        "label_counts": {s: {n: int(Y[:, k].sum()) for k, n in enumerate(names)} for s, Y in y.items()},
        "C_by_label": probe.C_by_label,
        "thresholds": {n: float(t) for n, t in zip(names, probe.thresholds)},
        "val_f1_by_C": probe.val_f1_by_C,
        "val_f1_by_label": probe.val_f1_by_label,
        "val_macro_f1": probe.val_macro_f1,
        "converged_by_label": probe.converged_by_label,
        "train_macro_f1": probe.train["macro_f1"],
        **{f"test_{k}": v for k, v in probe.test.items()},
        "nonzero_weights": probe.nonzero,
        "top_neurons": probe.top,
        "single_neuron": probe.single,
    }


def summary_lines(result: dict) -> list[str]:
    """The multi-label lines of app/transfer.py's summary: the probe per label, and the n-gram baseline."""
    thr, f1 = result["thresholds"], result["test_f1_by_label"]
    base = result["ngram_baseline"]
    per_label = ", ".join(f"{n} {f1[n]:.3f} (threshold {thr[n]:.2f})" for n in result["labels"])
    return [
        f"one-vs-rest L1 probes: test macro F1 {result['test_macro_f1']:.4f}, Jaccard "
        f"{result['test_jaccard']:.4f}, micro F1 {result['test_micro_f1']:.4f}, {result['nonzero_weights']} "
        "non-zero neurons",
        f"test F1 per label: {per_label}",
        f"n-gram baseline ({base['model']}): test macro F1 {base['test_macro_f1']:.4f}, Jaccard "
        f"{base['test_jaccard']:.4f}",
    ]
