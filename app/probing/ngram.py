"""The baseline beside the LM's features: a bag-of-n-grams logistic regression on the same splits.

Word 1-2 grams and character 2-5 grams (within word boundaries), tf-idf weighted with sublinear term
frequency, fitted on the training rows only; an L2 logistic regression whose C is chosen on the same
validation rows as the probe's, then refitted on train + validation, as the probe is. What the user reads
beside it is what the LM's features add over counting n-grams.

Multi-label: one-vs-rest, as the multi-label probe (app/probing/multilabel.py): per label, the C and the
threshold with the best validation F1, no refit (a threshold belongs to the model it was chosen for);
per-label F1, macro F1 and Jaccard on the test rows. A label the fitting rows hold on none (or on every)
row cannot be fitted: it is predicted as they have it, and `not_fitted` says so in transfer.json.
"""

from __future__ import annotations

import numpy as np

NGRAM_C_GRID = tuple(float(c) for c in 2.0 ** np.arange(-2, 7))  # 0.25 .. 64


def _vectorizer():
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.pipeline import FeatureUnion

    return FeatureUnion(
        [
            ("word", TfidfVectorizer(analyzer="word", ngram_range=(1, 2), sublinear_tf=True, min_df=1)),
            ("char", TfidfVectorizer(analyzer="char_wb", ngram_range=(2, 5), sublinear_tf=True, min_df=2)),
        ]
    )


def _model(C: float, seed: int, binary: bool):
    from sklearn.linear_model import LogisticRegression

    # liblinear is exact and fast for two classes; more classes take a multinomial lbfgs fit
    solver = "liblinear" if binary else "lbfgs"
    return LogisticRegression(C=C, solver=solver, max_iter=1000, random_state=seed)


def ngram_baseline(train: tuple, val: tuple, test: tuple, seed: int, labels: list[str] | None = None) -> dict:
    """(texts, y) triples -> {"C", "val_accuracy_by_C", "train_accuracy", "test_accuracy", "features"}.
    More than two classes: one multinomial fit."""
    (t_tr, y_tr), (t_va, y_va), (t_te, y_te) = train, val, test
    if y_tr.ndim == 2:
        return _one_vs_rest(train, val, test, seed, labels)
    binary = len(np.unique(y_tr)) <= 2
    vec = _vectorizer().fit(t_tr)
    X_tr, X_va = vec.transform(t_tr), vec.transform(t_va)
    val_acc = {C: float(_model(C, seed, binary).fit(X_tr, y_tr).score(X_va, y_va)) for C in NGRAM_C_GRID}
    best = max(NGRAM_C_GRID, key=lambda C: (val_acc[C], -C))  # ties: the stronger regularisation
    both = [*t_tr, *t_va]
    vec = _vectorizer().fit(both)
    model = _model(best, seed, binary).fit(vec.transform(both), np.concatenate([y_tr, y_va]))
    return {
        "model": "tf-idf word 1-2 grams + char 2-5 grams, L2 logistic regression",
        "features": len(vec.get_feature_names_out()),
        "C": best,
        "val_accuracy_by_C": {f"{k:g}": v for k, v in val_acc.items()},
        "train_accuracy": float(model.score(vec.transform(both), np.concatenate([y_tr, y_va]))),
        "test_accuracy": float(model.score(vec.transform(t_te), y_te)),
    }


def _one_vs_rest(train: tuple, val: tuple, test: tuple, seed: int, labels: list[str]) -> dict:
    """(texts, Y (n, K) 0/1) triples -> per label the C and threshold picked on validation, and the test
    figures (app.probing.scores.multilabel_scores)."""
    from app.probing.scores import best_thresholds, multilabel_scores

    (t_tr, Y_tr), (t_va, Y_va), (t_te, Y_te) = train, val, test
    vec = _vectorizer().fit(t_tr)
    X_tr, X_va, X_te = vec.transform(t_tr), vec.transform(t_va), vec.transform(t_te)
    C_by, thr, P_te, P_tr = {}, np.zeros(len(labels)), np.zeros_like(Y_te), np.zeros_like(Y_tr)
    not_fitted = {}
    for k, name in enumerate(labels):
        if len(np.unique(Y_tr[:, k])) < 2:  # one class only among the fitting rows: nothing to tell apart
            has = "every" if Y_tr[:, k].all() else "no"
            not_fitted[name] = (
                f"{has} fitting row has the label: predicted {'on' if has == 'every' else 'off'}"
            )
            P_te[:, k], P_tr[:, k], thr[k] = Y_tr[0, k], Y_tr[0, k], np.nan
            continue
        fits, f1, t = {}, {}, {}
        for C in NGRAM_C_GRID:
            fits[C] = _model(C, seed, True).fit(X_tr, Y_tr[:, k])
            tk, fk = best_thresholds(fits[C].predict_proba(X_va)[:, 1:], Y_va[:, k : k + 1])
            t[C], f1[C] = float(tk[0]), float(fk[0])
        C = max(NGRAM_C_GRID, key=lambda c: (f1[c], -c))  # ties: the stronger regularisation
        C_by[name], thr[k] = C, t[C]
        P_te[:, k] = fits[C].predict_proba(X_te)[:, 1] >= t[C]
        P_tr[:, k] = fits[C].predict_proba(X_tr)[:, 1] >= t[C]
    test_scores = multilabel_scores(Y_te, P_te, labels)
    return {
        "model": "tf-idf word 1-2 grams + char 2-5 grams, L2 logistic regression, one-vs-rest",
        "features": len(vec.get_feature_names_out()),
        "C_by_label": C_by,
        "thresholds": {name: float(v) for name, v in zip(labels, thr) if name not in not_fitted},
        "not_fitted": not_fitted,
        "train_macro_f1": multilabel_scores(Y_tr, P_tr, labels)["macro_f1"],
        **{f"test_{k}": v for k, v in test_scores.items()},
    }
