"""The memory estimates: closed forms of the model config, never above what the model really holds."""

from __future__ import annotations

from app.model.config import debug_config, matrix_parameters
from app.model.lm import LanguageModel
from app.model.memory import (
    PYTHON_STEP_BYTES,
    activation_floats_per_token,
    bytes_per_token,
    prefill_floats_per_token,
    step_bytes,
    training_state_bytes,
    weight_bytes,
)


def test_estimates_are_closed_forms_of_the_config():
    cfg = debug_config(vocab_size=259)  # E 32, H 64, 2 layers
    e, h, v = 32, 64, 259
    assert activation_floats_per_token(cfg, 2, training=True) == 2 * e + (e + h) + 17 * h * 2 + 12 * h
    assert activation_floats_per_token(cfg, 1, training=False) == 2 * e + 23 * h  # one layer at a time
    assert prefill_floats_per_token(cfg, 2) == 2 * h + 25 * h  # the layer before's output held too
    assert bytes_per_token(cfg, training=True) == 4 * (activation_floats_per_token(cfg, 2, True) + 4 * v)
    assert bytes_per_token(cfg, training=False) == 4 * (prefill_floats_per_token(cfg, 2) + 2 * v)
    assert bytes_per_token(cfg, training=True, element_bytes=2) == bytes_per_token(cfg, training=True) // 2
    assert training_state_bytes(cfg) == 36 * matrix_parameters(cfg)
    assert step_bytes(debug_config(core="python")) == PYTHON_STEP_BYTES
    assert step_bytes(debug_config(core="python"), "cuda:0") == 0  # the views are host memory
    huge = debug_config(hidden_dim=10**6, num_layers=10**12)  # no loop meets its layers
    assert training_state_bytes(huge) > 10**24 and bytes_per_token(huge, training=True) > 10**19


def test_the_weights_estimate_is_on_the_low_side():
    """A size that fits is never refused: the estimate counts no more than the model's float32 parameters."""
    for cfg in (debug_config(vocab_size=259), debug_config(vocab_size=300, cell="lstm", weight_norm=False)):
        real = sum(4 * p.numel() for p in LanguageModel(cfg).parameters())
        assert 0.9 * real <= weight_bytes(cfg) <= real
