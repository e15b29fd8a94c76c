"""The baseline beside the LM's features: a bag-of-n-grams logistic regression on the same splits.

Word 1-2 grams and character 2-5 grams (within word boundaries), tf-idf weighted with sublinear term
frequency, fitted on the training rows only; an L2 logistic regression whose C is chosen on the same
validation rows as the probe's, then refitted on train + validation, as the probe is. What the user reads
beside it is what the LM's features add over counting n-grams.
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


def ngram_baseline(train: tuple, val: tuple, test: tuple, seed: int) -> dict:
    """(texts, y) triples -> {"C", "val_accuracy_by_C", "train_accuracy", "test_accuracy", "features"}.
    More than two classes: one multinomial fit."""
    (t_tr, y_tr), (t_va, y_va), (t_te, y_te) = train, val, test
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
