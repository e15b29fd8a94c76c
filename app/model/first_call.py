"""The GPU core's first call at a new batch bucket, in bytes: what the tuner (app/model/gpu_tuning.py) holds on
the device while it checks and times the loops of a shape, beside the work that asked for them. The GPU memory
estimates (training, evaluation, featurizing, fine-tuning, generation) add it where the Triton core will run on
a CUDA device and the shape is new to the process (`first_call_bytes`); docs/memory.md says how it was counted.

Read from the code, per unit u = B x T_TUNE x H (B the bucket, T_TUNE the timed steps), s the compute dtype's
bytes and S the state dtype's (4; 8 for float64):

    F  the forward case (gpu_verify.forward_case): hs, ms (s each); cs, rs, tcs, pm (S each); gates, pg (4S)
       -> (2s + 12S) u, and the weights 5 H^2 s
    G  the backward case (backward_case): dp (5s), dr (s); dy, cs, rs, tcs (S each), gates (4S) -> (6s + 8S) u
    R  the float64 reference forward the backward case is made from (reference_forward): pm, pg upcast (40)
       and its outputs hs, cs, rs, ms, tcs, gates (72) -> 112 u, while F and G are held too
    A  one CUDA graph's arena per graphed loop timed (step and cublas; gpu_loops._Arena: a copy of that
       direction's buffers), kept until the shape is ranked: the forward's two while the backward is ranked
    C  a check (gpu_verify.check, T_CHECK steps, while the timed case is held): its own case, the float64
       reference of it and the compare's float64 copies: (2s + 12S + 112 + 64) per unit at T_CHECK forward;
       backward also its backward case and reference (6s + 8S + 48)
    P  the whole op timed against the reference core (prefers_reference, core "auto"): the reference's
       autograd at T_TUNE, counted as a layer's training activations (in + 17 H floats a token) plus the
       Triton op's saved buffers (F)

    forward only (inference):   max(F + 2 F_A + C_f, P)          F_A, G_A: F, G where graphs run, else 0
    forward and backward:       the same, and 2 F_A + F + R + G, 2 F_A + G + 2 G_A + C_b

(the candidates are checked and timed one after another, cuBLAS and step first: the last one's check runs
beside the arenas of the two graphed loops timed before it).

A shape whose ranking is in the disk cache (gpu_choice_cache) is only checked: C at T_CHECK. One already
ranked in this process costs nothing. tests/test_model_first_call.py holds the count to 1x-2x of what the
tuner's tensors take, counted at the dispatcher in Triton's interpreter (no graphs there: the arenas' terms
are the buffers' own sizes, read from gpu_loops._Arena).
"""

from __future__ import annotations

import torch

from app.model.config import ModelConfig
from app.model.gpu_tiles import interpreting, next_pow2


def bucket(rows: int) -> int:
    """gpu_tuning.batch_bucket: the next power of two, at least 16."""
    return max(16, next_pow2(rows))


def tuner_bytes(B: int, H: int, D: int, s: int, backward: bool, graphs: bool, steps: int, check_steps: int,
                op: bool = True) -> int:  # fmt: skip
    """The tuner's peak device bytes for a (bucket B, width H, input D) shape whose operands take `s` bytes,
    timed at `steps` steps and checked at `check_steps` (module docstring: F, G, R, C, A, P); `graphs`: CUDA
    graphs run (arenas held); `op`: the whole op is timed against the reference core."""
    S = 8 if s == 8 else 4
    u, c, w = B * steps * H, B * check_steps * H, 5 * H * H * s
    F, G, R = (2 * s + 12 * S) * u + w, (6 * s + 8 * S) * u + w, 112 * u
    C_f = (2 * s + 12 * S + 112 + 64) * c + w  # a forward check: its case, the float64 reference, the compare
    C_b = C_f + (6 * s + 8 * S + 48) * c + w  # a backward check: both cases, both references
    fa, ga = (F, G) if graphs else (0, 0)
    P = (4 * (D + 17 * H) * B * steps + F) if op else 0
    forward = max(F + 2 * fa + C_f, P)  # the last candidate is checked beside the arenas of those timed
    if not backward:
        return forward
    return max(forward, 2 * fa + F + R + G, 2 * fa + G + 2 * ga + C_b)


def first_call_bytes(cfg: ModelConfig, rows: int, device, backward: bool, element: int = 4) -> int:
    """Device bytes the Triton core's first call at `rows`' bucket takes beside the work, on `device` (0 off
    CUDA, for the reference core, for a shape this process already ranked); `element`: the compute dtype's
    bytes (2 under bf16/fp16)."""
    dev = torch.device(device) if device is not None else torch.device("cpu")
    if dev.type != "cuda" or cfg.cell != "mlstm" or cfg.core == "python":
        return 0
    from app.model import gpu_tuning, gpu_verify

    dtype = {2: torch.bfloat16, 4: torch.float32, 8: torch.float64}[element]
    B, H = bucket(rows), cfg.hidden_dim
    if any(k[0].type == "cuda" and k[1] >= B and k[2] == H and k[3] == dtype for k in gpu_tuning._choices):
        return 0
    D = max(cfg.embed_dim, cfg.hidden_dim if cfg.num_layers > 1 else 0)
    graphs = not interpreting() and gpu_tuning.gpu_loops.GRAPH_CACHE > 0
    t = gpu_verify.T_CHECK
    if _cached(B, H, dtype, dev):  # only checked: the checks' own buffers
        return tuner_bytes(B, H, D, element, backward, graphs=False, steps=0, check_steps=t, op=False)
    return tuner_bytes(B, H, D, element, backward, graphs, gpu_tuning.T_TUNE, t, op=cfg.core == "auto")


def _cached(B: int, H: int, dtype: torch.dtype, device) -> bool:
    from app.model import gpu_choice_cache, gpu_tuning

    try:
        entry = gpu_choice_cache.load(
            B, H, dtype, device, gpu_tuning._code_files(), gpu_tuning._variant(dtype)
        )
    except Exception:  # an unreadable cache or device: the shape will be timed
        return False
    return entry is not None
