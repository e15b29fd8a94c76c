"""The GPU core's first call at a new batch bucket, in bytes: what the tuner (app/model/gpu_tuning.py) holds on
the device while it checks and times the loops of a shape, beside the work that asked for them. The GPU memory
estimates (training, evaluation, featurizing, fine-tuning, generation) add it where the Triton core will run on
a CUDA device and the shape is new to the process (`first_call_bytes`); docs/memory.md says how it was counted.

Read from the code (gpu_ranking.rank, gpu_verify, gpu_loops, triton_core.run_op), per unit u = B x T_TUNE x H
(B the bucket, T_TUNE the timed steps), s the compute dtype's bytes and S the state dtype's (4; 8 for float64):

    C  the checks first (gpu_verify.check, T_CHECK steps on one row fewer): a check's own case, the float64
       reference of it and the compare's float64 copies, (2s + 12S + 112 + 64) per unit at T_CHECK forward,
       backward also its backward case and reference (6s + 8S + 48); where graphs run, a copy of the case
    W  the whole op timed per candidate (run_op): x and its token-major copy, the projection (5S), the forward's
       buffers and output, (3s + 17S) u; backward also dy and its copy, dp, dr, dx, the weights' gradients
    A  a CUDA graph's arena per graphed loop and direction timed (a copy of that direction's buffers), kept until
       the shape is ranked: MAX_ARENAS (4) at most, 2 forward only
    F, G, R  each loop timed alone (gpu_ranking._alone) on the timed forward case (gpu_verify.forward_case:
       (2s + 12S) u and the weights 5 H^2 s), the backward case ((6s + 8S) u) and the float64 reference forward
       it is made from (112 u)
    Q  training: the whole op timed through its CUDA graphs (app/model/op_graph.py), beside A and W: the graph's
       static inputs and outputs and the copies handed on (2 op_graph.call_bytes at T_TUNE; none where a call is
       too large for a graph), or with its weight gradients overlapped: their float32 accumulators
    P  the whole op timed against the reference core (prefers_reference, core "auto"): the reference's autograd
       at T_TUNE, counted as a layer's training activations (in + 17 H floats a token), beside W

    peak = max(C, A + W + Q, A + F (+ R + G backward), P)

A shape whose ranking is in the disk cache (gpu_choice_cache) is only checked: C. One already ranked in this
process costs nothing. tests/test_model_first_call.py holds the count to 1x-2x of what the tuner's tensors
take, counted at the dispatcher in Triton's interpreter (no graphs there: the arenas are the buffers' own
sizes, read from gpu_loops._Arena).
"""

from __future__ import annotations

import torch

from app.model import op_graph, wgrad_overlap
from app.model.config import ModelConfig
from app.model.gpu_tiles import interpreting, next_pow2


def bucket(rows: int) -> int:
    """gpu_tuning.batch_bucket: the next power of two, at least 16."""
    return max(16, next_pow2(rows))


def tuner_bytes(B: int, H: int, D: int, s: int, backward: bool, graphs: bool, steps: int, check_steps: int,
                op: bool = True, op_graphs: bool = False) -> int:  # fmt: skip
    """The tuner's peak device bytes for a (bucket B, width H, input D) shape whose operands take `s` bytes,
    timed at `steps` steps and checked at `check_steps` (module docstring: F, G, R, C, W, A, P); `graphs`: CUDA
    graphs run (arenas held); `op`: the whole op is timed against the reference core; `op_graphs`: the op's own
    graphs may run (app/model/op_graph.py: timed through them in training)."""
    S = 8 if s == 8 else 4
    u, c, w = B * steps * H, B * check_steps * H, 5 * H * H * s
    F, G, R = (2 * s + 12 * S) * u + w, (6 * s + 8 * S) * u + w, 112 * u
    C = (2 * s + 12 * S + 112 + 64) * c + w  # a forward check: its case, the float64 reference, the compare
    if backward:
        C += (6 * s + 8 * S + 48) * c + w  # a backward check: both cases, both references
    x, k = B * steps * D * s, 6 * B * H * S  # the input; a loop's scratch (its products, a step's)
    W = (
        (3 * s + 17 * S) * u + 2 * x + w + k
    )  # the whole op's forward: projection, buffers, output, x and its copy
    if backward:
        W += (7 * s + S) * u + x + w  # dy, its copy, dp, dr, dx, the weights' gradients and transposes
    A = (
        (4 * max(F, G) if backward else 2 * F) if graphs else 0
    )  # the graphed loops' arenas, MAX_ARENAS at most
    alone = F + (R + G if backward else 0) + k  # each loop timed alone on the timed cases
    P = (4 * (D + 17 * H) * B * steps + W) if op else 0
    call = op_graph.call_bytes(B * steps, D, H, s)
    timed_graphs = op_graphs and backward and not op_graph.too_large(call)
    Q = (
        2 * call if timed_graphs else 0
    )  # the op timed through its graphs: their tensors, the copies handed on
    if backward:  # or with its weight gradients overlapped: their float32 accumulators
        Q = max(Q, overlap_bytes(D, H, s))
    return max(C + (c * (2 * s + 12 * S) if graphs else 0), A + W + Q, A + alone, P)


def overlap_bytes(D: int, H: int, s: int) -> int:
    """The overlapped backward's accumulators beside the plain backward's (app/model/wgrad_overlap.py): each
    weight gradient in float32 (float64 for float64 operands) while the pieces sum into it."""
    return (5 * H * D + 5 * H * H + 4 * H) * (8 if s == 8 else 4)


def op_paths_bytes(cfg: ModelConfig, tokens: int, device, element: int = 4) -> int:
    """What the op's paths other than plain hold while training on `device` with micro-batches of at most
    `tokens` padded tokens (0 off CUDA or for the reference core): where its CUDA graphs may run, the kept
    graphs' static tensors (at most op_graph.MAX_BYTES; a layer's two widths, forward and backward, 4 graphs of
    the largest call) and their shared pool (a call's temporaries, about twice its static tensors); the
    overlapped weight gradients' accumulators of one backward (unless MLSTM_WGRAD_OVERLAP=0). A shape whose
    tuner finds a path slower holds nothing of it; this counts them wherever they may run."""
    dev = torch.device(device) if device is not None else torch.device("cpu")
    if dev.type != "cuda" or cfg.cell != "mlstm" or cfg.core == "python":
        return 0
    D = max(cfg.embed_dim, cfg.hidden_dim if cfg.num_layers > 1 else 0)
    graphs = 0
    if op_graph.why_not(dev) is None:
        call = op_graph.call_bytes(tokens, D, cfg.hidden_dim, element)
        graphs = min(op_graph.MAX_BYTES, 4 * call) + min(2 * call, op_graph.MAX_BYTES)
    overlap = overlap_bytes(D, cfg.hidden_dim, element) if wgrad_overlap.chunks() != 0 else 0
    return graphs + overlap


def first_call_bytes(cfg: ModelConfig, rows: int, device, backward: bool, element: int = 4) -> int:
    """Device bytes the Triton core's first call at `rows`' bucket takes beside the work, on `device` (0 off
    CUDA, for the reference core, for a shape this process already ranked); `element`: the compute dtype's
    bytes (2 under bf16/fp16)."""
    dev = torch.device(device) if device is not None else torch.device("cpu")
    if dev.type != "cuda" or cfg.cell != "mlstm" or cfg.core == "python":
        return 0
    from app.model import gpu_ranking, gpu_tuning, gpu_verify

    dtype = {2: torch.bfloat16, 4: torch.float32, 8: torch.float64}[element]
    B, H = bucket(rows), cfg.hidden_dim
    if any(k[0].type == "cuda" and k[1] >= B and k[2] == H and k[3] == dtype for k in gpu_tuning._choices):
        return 0
    D = max(cfg.embed_dim, cfg.hidden_dim if cfg.num_layers > 1 else 0)
    graphs = not interpreting() and not gpu_tuning.gpu_loops.graphs_off()
    t = gpu_verify.T_CHECK
    if _cached(B, H, dtype, dev):  # only checked: the checks' own buffers
        return tuner_bytes(B, H, D, element, backward, graphs=False, steps=0, check_steps=t, op=False)
    op_graphs = graphs and op_graph.why_not(dev) is None
    return tuner_bytes(
        B, H, D, element, backward, graphs, gpu_ranking.T_TUNE, t, cfg.core == "auto", op_graphs
    )


def _cached(B: int, H: int, dtype: torch.dtype, device) -> bool:
    from app.model import gpu_choice_cache, gpu_tuning

    try:
        entry = gpu_choice_cache.load(
            B, H, dtype, device, gpu_tuning._code_files(), gpu_tuning._variant(dtype)
        )
    except Exception:  # an unreadable cache or device: the shape will be timed
        return False
    return entry is not None
