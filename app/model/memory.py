"""What a model needs of memory, estimated from its config alone, in closed form (a config may state 10^12
layers, which no loop should meet).

Each estimate stops a size that cannot fit (a hidden_dim of 10^6, a micro-batch of 10^9 tokens) before
anything of that size exists, and admits one that fits: `bench/memory.py` runs every work that is admitted
or refused by one of them at a few sizes, on the CPU cores, and each estimate lies between 1x and 2x of the
memory the work really added (tests/ check the small end). The terms, per token of a batch, as the cores
hold them (app/model/mlstm_core.py, app/model/csrc/mlstm_cpu.cpp):

- inference (a prefill, one layer at a time): the layer's input and the core's copy of it, its projections
  (5 H), activated gates (4 H), and per step h, c, tanh c, m, W_mh h, W_mx x and the output (7 H): measured
  2 in + 17.5 H (fused) to 2 in + 18.5 H (Python core, which also stacks W_mh h once more), counted as
  2 in + 23 H (2 H more from the second layer on: the layer before's output is held as its input); the
  head's logits and their log-softmax (2 V) where a reader scores every position;
- training (forward and backward): per layer, what the backward keeps (its input, 10 H), the layer's output
  and their gradients, and once the backward's own buffers (the gradients of the projections, 5 H, and of
  the input): measured 14 H a layer and 4 H once (fused) to 16.5 H and 7.5 H (Python core), counted as
  in + 17 H a layer and 2 E + 12 H once; the head's logits, their log-softmax, the loss's float copy and
  the logits' gradient (4 V);
- the Python core also holds a few dozen tensor headers per time step (a view of each buffer: ~8 KB a step
  whatever the batch), counted per time step where it runs on the CPU;
- weights: 4 bytes a matrix parameter (float32; biases and gains left out: `matrix_parameters`);
- training state under DeepSpeed: the weights, their gradients, ZeRO's flat float32 copy of the weights,
  Adam's two moments, the averaged gradients and the reduce bucket, and once per process what an engine
  holds whatever the model's size: fitted on two sizes (10M and 28M parameters, ZeRO-1, float32,
  bench/memory.py) as 34.8 bytes a parameter and 57 MB, counted as 36 and 64 MiB (the run-to-run spread
  of one size is about 5%); under bf16 the 2-byte weights are less, the float32 gradient accumulation,
  master copy and moments the same.
"""

from __future__ import annotations

from app.model.config import ModelConfig, matrix_parameters

WEIGHT_BYTES = 4  # float32
TRAINING_STATE_BYTES = 36  # DeepSpeed ZeRO-1/2's training state per parameter (module docstring)
ENGINE_BYTES = 64 << 20  # a training engine's own memory, whatever the model's size (module docstring)
PYTHON_STEP_BYTES = 8 << 10  # the Python core's per-step views and small tensors (host memory)


def _widest_input(cfg: ModelConfig, layers: int) -> int:
    """The widest input among the first `layers` recurrent layers: the embedding's, then the hidden state's."""
    return max(cfg.embed_dim, cfg.hidden_dim) if layers > 1 else cfg.embed_dim


def prefill_floats_per_token(cfg: ModelConfig, layers: int) -> int:
    """Values a token holds while the first `layers` recurrent layers read it in inference, one layer after
    another (the largest layer's): 2 in + 23 H, and 2 H more beyond the first layer (the layer before's output,
    its input, is held beside it; module docstring)."""
    return 2 * _widest_input(cfg, layers) + (23 + 2 * (layers > 1)) * cfg.hidden_dim


def activation_floats_per_token(cfg: ModelConfig, layers: int, training: bool) -> int:
    """Values a token's activations hold in the embedding and the first `layers` recurrent layers (the head
    left out): in training, per layer its input and 17 H (what the backward keeps, the output and their
    gradients), and once the embedding and its gradient (2 E) and the backward's own buffers (12 H); in
    inference `prefill_floats_per_token`."""
    if not training:
        return prefill_floats_per_token(cfg, layers)
    e, h = cfg.embed_dim, cfg.hidden_dim
    inputs = e + (layers - 1) * h
    return 2 * e + inputs + 17 * h * layers + 12 * h


def bytes_per_token(cfg: ModelConfig, training: bool, element_bytes: int = 4) -> int:
    """Bytes of activations a token of a batch needs in the whole model, the head's logits included."""
    body = activation_floats_per_token(cfg, cfg.num_layers, training)
    return element_bytes * (body + (4 if training else 2) * cfg.vocab_size)


def python_core_runs(cfg: ModelConfig) -> bool:
    """Whether the Python core runs this model's time loop on the CPU: model.core python, or the fused op
    does not build here (app.model.core's choice; asking builds the op, as the first forward would)."""
    if cfg.cell != "mlstm":
        return False
    if cfg.core == "python":
        return True
    from app.model import fused_core

    return fused_core.fused_ops() is None


def step_bytes(cfg: ModelConfig, device=None) -> int:
    """Host bytes a batch holds per time step beside its tokens' (the Python core's on the CPU, else 0)."""
    on_host = device is None or str(device).startswith("cpu")
    return PYTHON_STEP_BYTES if on_host and python_core_runs(cfg) else 0


def weight_bytes(cfg: ModelConfig) -> int:
    """The model's weights in float32."""
    return WEIGHT_BYTES * matrix_parameters(cfg)


def training_state_bytes(cfg: ModelConfig) -> int:
    """Weights, gradients and Adam's moments of the whole model (over all the ranks that share them)."""
    return TRAINING_STATE_BYTES * matrix_parameters(cfg)
