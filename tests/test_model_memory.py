"""The memory estimates: closed forms of the model config, never above what the model really holds."""

from __future__ import annotations

from app.model.config import debug_config, matrix_parameters
from app.model.lm import LanguageModel
from app.model.memory import activation_floats_per_token, bytes_per_token, training_state_bytes, weight_bytes


def test_estimates_are_closed_forms_of_the_config():
    cfg = debug_config(vocab_size=259)  # E 32, H 64, 2 layers
    assert activation_floats_per_token(cfg, 2, training=True) == 2 * 32 + 32 * 64 * 2
    assert activation_floats_per_token(cfg, 2, training=False) == 32 + 10 * 64  # one layer at a time
    assert bytes_per_token(cfg, training=True) == 4 * (2 * 32 + 32 * 64 * 2 + 3 * 259)
    assert bytes_per_token(cfg, training=False) == 4 * (32 + 10 * 64 + 2 * 259)
    assert bytes_per_token(cfg, training=True, element_bytes=2) == bytes_per_token(cfg, training=True) // 2
    assert training_state_bytes(cfg) == 16 * matrix_parameters(cfg) == 4 * weight_bytes(cfg)
    huge = debug_config(hidden_dim=10**6, num_layers=10**12)  # no loop meets its layers
    assert training_state_bytes(huge) > 10**24 and bytes_per_token(huge, training=True) > 10**19


def test_the_weights_estimate_is_on_the_low_side():
    """A size that fits is never refused: the estimate counts no more than the model's float32 parameters."""
    for cfg in (debug_config(vocab_size=259), debug_config(vocab_size=300, cell="lstm", weight_norm=False)):
        real = sum(4 * p.numel() for p in LanguageModel(cfg).parameters())
        assert 0.9 * real <= weight_bytes(cfg) <= real
