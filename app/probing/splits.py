"""Which rows fit and which choose: the seeded validation split of --train, and (multi-label) the labels
every split can hold, checked before any featurising.

A single-label split is stratified by class: every class on both sides when it can be, and always on the
fitting side. A multi-label split is stratified per label, rarest label first: a label of n >= 2 positive
rows gets round(fraction * n) of them (at least 1, at most n - 1) in validation, the rest fit; rows of no
label fill the validation share. A label that a split cannot hold (fewer than two positives in --train
and no --validation; none in --validation; none in --test) is one line before featurising that says what
to do: --validation with rows of it, or --drop-rare-labels to leave it out. Without a positive to fit or
to choose a threshold on, the run stops there (exit 2); a label missing from --test is said and its test
F1 follows the convention of app.probing.scores (1 when nothing is predicted).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from app.common.errors import UserError


def split_train(path: Path, y: np.ndarray, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """A seeded split of --train (fitting rows, validation rows: sorted index arrays)."""
    rng = np.random.default_rng(seed)
    val = _per_label(y, fraction, rng) if y.ndim == 2 else _per_class(y, fraction, rng)
    val_idx = np.asarray(sorted(val), dtype=np.int64)
    tr_idx = np.setdiff1d(np.arange(len(y)), val_idx)
    if len(val_idx) == 0:
        raise UserError(f"--train {path}: too few rows to hold out a validation split; give --validation")
    return tr_idx, val_idx


def _per_class(y: np.ndarray, fraction: float, rng) -> list[int]:
    """Every class on both sides when it can be, and always on the fitting side: a class of n rows gives
    the validation split at most n - 1 (a 2-row class at --val-fraction 0.75 keeps one; a 1-row class stays
    whole)."""
    val: list[int] = []
    for k in np.unique(y):
        rows = rng.permutation(np.flatnonzero(y == k))
        val.extend(rows[: min(round(fraction * len(rows)), len(rows) - 1)].tolist())
    return val


def _per_label(Y: np.ndarray, fraction: float, rng) -> list[int]:
    """Rarest label first, each label's unplaced positives placed so that it has round(fraction * n) of its
    n in validation (at least 1, at most n - 1); then rows of no label (or all placed) fill the validation
    share of the rows."""
    side = np.full(len(Y), -1)  # -1 unplaced, 0 fit, 1 validation
    for k in np.argsort(Y.sum(0), kind="stable"):
        pos = np.flatnonzero(Y[:, k])
        want = min(max(round(fraction * len(pos)), 1), len(pos) - 1)
        free = rng.permutation(pos[side[pos] == -1])
        more = max(0, min(want - int((side[pos] == 1).sum()), len(free)))
        if int((side[pos] == 0).sum()) == 0 and more == len(free):
            more -= 1  # one positive stays to fit
        side[free[:more]] = 1
        side[free[more:]] = 0
    free = rng.permutation(np.flatnonzero(side == -1))
    top_up = max(0, round(fraction * len(Y)) - int((side == 1).sum()))
    side[free[:top_up]] = 1
    return np.flatnonzero(side == 1).tolist()


def rare_labels(names: list[str], counts: dict[str, np.ndarray], split: bool) -> dict[str, str]:
    """Labels a split cannot hold -> why, in words: `counts` per split (train, validation when given, test)
    of each label's positive rows; `split`: validation is a split of --train (a label needs two there)."""
    why = {}
    for k, name in enumerate(names):
        n_train = int(counts["train"][k])
        if n_train == 0:
            why[name] = "no positive row in --train to fit"
        elif split and n_train < 2:
            why[name] = "1 positive row in --train, too few to split between fitting and validation"
        elif not split and int(counts["validation"][k]) == 0:
            why[name] = "no positive row in --validation to choose its threshold on"
        elif int(counts["test"][k]) == 0:
            why[name] = "no positive row in --test (its test F1 is 1 when nothing is predicted, else 0)"
    return why


def check_labels(
    names: list[str], Y: dict[str, np.ndarray], split: bool, drop: bool, say: Callable[[str], None]
) -> list[str]:
    """Before featurising: the labels every split can hold -> the labels kept. A label without a positive
    to fit or to choose its threshold on stops the run in one line saying what to do, unless
    --drop-rare-labels leaves it out (said); one missing from --test only is said."""
    why = rare_labels(names, {s: y.sum(0) for s, y in Y.items()}, split)
    if not why:
        return names
    listed = "; ".join(f"{n!r}: {w}" for n, w in why.items())
    if drop:
        kept = [n for n in names if n not in why]
        if not kept:
            raise UserError(f"--drop-rare-labels leaves no label ({listed})")
        say(f"--drop-rare-labels: leaving out {len(why)} label(s) ({listed})")
        return kept
    fix = "give --validation (or --test) with rows of each, or --drop-rare-labels to leave them out"
    if all("--test" in w for w in why.values()):
        say(f"multi-label: {listed}; to score them, {fix}")
        return names
    raise UserError(f"multi-label: labels a split cannot hold: {listed}; {fix}")
