"""What evaluation's flags may ask of the machine (app.common.resources' rule): a length or count larger
than the input can use is capped in one line, and an evaluation whose memory is more than the machine has
free is refused in one line, before the weights are read.

Capped, each at what the sequences it applies to can use (a warning when the value was given, an info line
for a default, as data prep says of --num-proc), none changing a figure:
- --text-chunk-len at the longest sequence cut into pieces (a --text file's tokens, EOS included, and with
  --stream or --cache the split's longest document): a longer piece is still the whole sequence;
- --dyn-segment at the longest sequence read dynamically (a split row, a --text file);
- --cache-window at the longest sequence read with the cache: the cache never holds more positions;
- --micro-batch at the most sequences evaluated together (a bucket of the split, a file's pieces).

Refused: the weights, the engine's largest micro-batch, and on rank 0 the stream, cache and dynamic
readers (a private copy of the model each, the dynamic one with its trained weights, mean squares and
gradients, and the activations of one piece, window or segment; they run one after another), estimated
(app.model.memory), against the host's available memory, or with the engine on CUDA its part against the
device's. The number of --dyn-lr step sizes costs time, not memory (one learner at a time, on one copy); the
--cache-lambda x --cache-theta grid is counted in the cache's part (each setting's scores of a block).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from app.common.resources import Part, available_memory, cap, refuse_over
from app.evaluation.cache import QUERY_BLOCK
from app.evaluation.config import EvalConfig
from app.model.config import ModelConfig
from app.model.first_call import first_call_bytes
from app.model.memory import bytes_per_token, step_bytes, weight_bytes

Say = Callable[[str], None] | None
STREAM_ROWS = 8  # sequences a stream reads at once (app.evaluation.stream.stream_nats' rows)
DYNAMIC_COPIES = 4  # the dynamic learner's model, trained weights, mean squared gradients, gradients
SETTING_BYTES = 320  # a cache setting's totals and its record in the result (a dict in the JSON)


@dataclass(frozen=True, slots=True)
class Inputs:
    """What an evaluation reads, in tokens per sequence (targets: a --text file's with its EOS)."""

    texts: list[int]  # each --text file
    rows: np.ndarray  # (n,) the split's examples (empty without --data)
    buckets: np.ndarray  # (B,) examples per bucket of the split
    bounds: list[int]  # the split's bucket bounds
    documents: np.ndarray  # (D,) the split's documents, each its examples joined

    def streamed(self, cfg: EvalConfig) -> list[int]:
        """Sequences read as one stream (--stream) or with the cache: the files and the split's documents."""
        return [*self.texts, *self.documents.tolist()] if cfg.stream or cfg.cache else []


def _longest(seqs) -> int:
    return max((int(n) for n in seqs), default=0)


def cap_lengths(cfg: EvalConfig, inputs: Inputs, say: Say, note: Say = None) -> EvalConfig:
    """--text-chunk-len, --dyn-segment, --cache-window and --micro-batch at what `inputs` can use (module
    docstring); each cap one line, through `note` for a default value."""
    defaults = {f.name: f.default for f in dataclasses.fields(EvalConfig)}
    out = {}

    def at(name: str, limit: int, why: str) -> None:
        value = getattr(cfg, name)
        line = note if value == defaults[name] else say
        out[name] = cap(f"--{name.replace('_', '-')}", value, [(max(1, limit), why)], line)

    cut = [*inputs.texts, *inputs.streamed(cfg)]
    if cut:
        at("text_chunk_len", _longest(cut), f"the longest sequence it cuts has {_longest(cut):,} tokens")
    if cfg.dynamic:
        n = _longest([*inputs.texts, *inputs.rows.tolist()])
        at("dyn_segment", n, f"the longest sequence read dynamically has {n:,} tokens")
    if cfg.cache:
        n = _longest(inputs.streamed(cfg))
        at("cache_window", n, f"the longest sequence read with the cache has {n:,} tokens")
    chunk = out.get("text_chunk_len", cfg.text_chunk_len)
    pieces = _longest([-(-t // chunk) for t in inputs.texts])
    most = max(pieces, _longest(inputs.buckets.tolist()))
    at("micro_batch", most, f"at most {most:,} sequences are evaluated together (a bucket, a file's pieces)")
    return dataclasses.replace(cfg, **out)


def engine_tokens(cfg: EvalConfig, inputs: Inputs) -> int:
    """Padded tokens of the engine's largest micro-batch: a bucket's rows, or a file's pieces."""
    split = [min(cfg.micro_batch, int(c)) * b for c, b in zip(inputs.buckets, inputs.bounds)]
    chunk = cfg.text_chunk_len
    texts = [min(cfg.micro_batch, -(-t // chunk)) * min(chunk, t) for t in inputs.texts]
    return _longest([*split, *texts])


def stream_bytes(model_cfg: ModelConfig, rows: int, chunk: int, longest: int) -> int:
    """--stream: a piece of `rows` rows through the model, and the rows' ids (inputs and targets, int64)."""
    return rows * (chunk * bytes_per_token(model_cfg, training=False) + 16 * longest) + chunk * step_bytes(
        model_cfg
    )


def cache_bytes(model_cfg: ModelConfig, chunk: int, window: int, settings: int, thetas: int) -> int:
    """--cache: a piece through the model; the cache's keys (and the copy that appends the piece's); a block
    of queries' similarities to them, masks and softmax (float64); each setting's scores of the block, its
    totals and its record in the result."""
    q = min(QUERY_BLOCK, chunk)
    return (
        chunk * (bytes_per_token(model_cfg, training=False) + step_bytes(model_cfg))
        + 8 * (window + chunk) * model_cfg.hidden_dim
        + 40 * q * (window + q)
        + 8 * q * (settings + thetas)
        + SETTING_BYTES * settings
    )


def dynamic_bytes(model_cfg: ModelConfig, segment: int) -> int:
    """--dynamic: a segment's activations kept for its backward pass, and their gradients (and the Python
    core's per-step tensors where it runs)."""
    return (segment + 1) * (bytes_per_token(model_cfg, training=True) + step_bytes(model_cfg))


def reader_parts(cfg: EvalConfig, model_cfg: ModelConfig, inputs: Inputs) -> list[Part]:
    """Rank 0's stream, cache and dynamic readers (module docstring): their copies of the model, and the
    largest of the activations they need one after another."""
    streamed = inputs.streamed(cfg)
    longest, copies = _longest(streamed), (1 if streamed else 0) + (DYNAMIC_COPIES if cfg.dynamic else 0)
    chunk = min(cfg.text_chunk_len, longest)
    acts: list[Part] = [(0, "", "")]
    if streamed and cfg.stream:
        n = min(STREAM_ROWS, len(streamed))
        what = f"--stream: {n} stream(s) at a time in pieces of --text-chunk-len {chunk:,}"
        acts.append(
            (stream_bytes(model_cfg, n, chunk, longest), what, "lower --text-chunk-len, or give --no-stream")
        )
    if streamed and cfg.cache:
        w, g = min(cfg.cache_window, longest), len(cfg.cache_lambda) * len(cfg.cache_theta)
        need = cache_bytes(model_cfg, chunk, w, g, len(cfg.cache_theta))
        what = f"--cache over --cache-window {w:,} positions with {g:,} (lambda, theta) setting(s)"
        acts.append((need, what, "lower --cache-window or the --cache-lambda x --cache-theta settings"))
    if cfg.dynamic:
        s = min(cfg.dyn_segment, _longest([*inputs.texts, *inputs.rows.tolist()]))
        what = f"--dynamic: segments of --dyn-segment {s:,} tokens with their gradients"
        acts.append((dynamic_bytes(model_cfg, s), what, "lower --dyn-segment"))
    if not copies:
        return []
    held = f"{copies} cop{'y' if copies == 1 else 'ies'} of the model for --stream, --cache or --dynamic"
    weights = (copies * weight_bytes(model_cfg), held, "leave out --dynamic, or --stream and --cache")
    return [weights, max(acts, key=lambda part: part[0])]


def engine_part(cfg: EvalConfig, model_cfg: ModelConfig, inputs: Inputs, stages: int, device=None) -> Part:
    """This process's stage of the engine: its share of the weights and of the largest micro-batch; on a CUDA
    `device`, the GPU core's first call at the micro-batch's bucket (app.model.first_call)."""
    tokens = engine_tokens(cfg, inputs)
    need = (weight_bytes(model_cfg) + tokens * bytes_per_token(model_cfg, training=False)) // stages
    need += first_call_bytes(model_cfg, cfg.micro_batch, device, backward=False)
    hint = "lower --micro-batch" + (" or --text-chunk-len" if inputs.texts else "")
    return need, f"evaluating micro-batches of up to {tokens:,} padded tokens", hint


def check_evaluation_fits(
    cfg: EvalConfig, model_cfg: ModelConfig, inputs: Inputs, *, stages: int, device: str, reads: bool
) -> None:
    """Refuse (one line) an evaluation that needs more memory than is free: the checkpoint's weights (read
    on the CPU), the engine (on `device`) and, where `reads` (rank 0), the readers."""
    weights = (weight_bytes(model_cfg), "the checkpoint's weights", "evaluate on a machine with more memory")
    host = [weights, *(reader_parts(cfg, model_cfg, inputs) if reads else [])]
    engine = engine_part(cfg, model_cfg, inputs, stages, device)
    if device == "cpu":
        refuse_over(available_memory("cpu"), [*host, engine])
        return
    refuse_over(available_memory(device), [engine], f" on {device}")
    refuse_over(available_memory("cpu"), host)
