"""What a model needs of memory, estimated from its config alone, in closed form (a config may state 10^12
layers, which no loop should meet).

Estimates, not measurements: they stop a size far beyond what a machine holds (a hidden_dim of 10^6, a
micro-batch of 10^9 tokens) before anything of that size is allocated, not a tight one. Each counts the
larger terms only, and on the low side, so a size that fits is never refused:

- weights: 4 bytes a matrix parameter (float32; biases and gains left out: `matrix_parameters`);
- training state: 16 bytes a parameter: the weights, their gradients and Adam's two moments in float32 (under
  bf16/fp16 the 2-byte weights and gradients plus the float32 master copy and moments: the same 16);
- activations, per token: a recurrent layer's inputs, gates, states and outputs (about 10 H values at a
  time in inference, one layer after another; about 32 H a layer kept for the backward pass and their
  gradients in training), the embedding (E; 2 E in training), and the head's logits over the vocabulary
  (2 V in inference: the logits and their log-softmax; 3 V in training: with their gradient).
"""

from __future__ import annotations

from app.model.config import ModelConfig, matrix_parameters

WEIGHT_BYTES = 4  # float32
TRAINING_STATE_BYTES = 16  # weights, gradients, Adam's two moments (float32), per parameter


def activation_floats_per_token(cfg: ModelConfig, layers: int, training: bool) -> int:
    """Values a token's activations hold in the embedding and the recurrent layers (the head left out):
    2 E + 32 H per layer in training (kept for the backward pass, with their gradients), E + 10 H in
    inference (one layer at a time)."""
    e, h = cfg.embed_dim, cfg.hidden_dim
    return 2 * e + 32 * h * layers if training else e + 10 * h


def bytes_per_token(cfg: ModelConfig, training: bool, element_bytes: int = 4) -> int:
    """Bytes of activations a token of a batch needs in the whole model, the head's logits included."""
    body = activation_floats_per_token(cfg, cfg.num_layers, training)
    return element_bytes * (body + (3 if training else 2) * cfg.vocab_size)


def weight_bytes(cfg: ModelConfig) -> int:
    """The model's weights in float32."""
    return WEIGHT_BYTES * matrix_parameters(cfg)


def training_state_bytes(cfg: ModelConfig) -> int:
    """Weights, gradients and Adam's moments of the whole model (over all the ranks that share them)."""
    return TRAINING_STATE_BYTES * matrix_parameters(cfg)
