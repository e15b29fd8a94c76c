"""Evaluation: held-out scoring, a text read as one stream, the neural cache, dynamic evaluation, the Bayesian
mixture both score their settings with, the compressors beside them, `app/evaluate.py`'s config and `Evaluator`."""
