"""The one op contract of the mLSTM time loop and the dispatcher that picks its backend.

Contract: an autograd Function (x, w_in, bias, w_mh, w_m) -> h, x (B, T, in) and the weights in the compute
dtype, bias (4H,) in the state dtype (`mlstm_core.state_dtype`), h (B, T, H) from a zero state; fp32 (fp64
with fp64 operands) gates, cell state and accumulation; and its from-state twin (x, ..., h_0, c_0) -> (h,
c_T). Backends, a file each:

    python  mlstm_core.MLSTMFunction          any device; the reference and test oracle
    fused   fused_core.FusedMLSTMFunction     CPU, a C++ op built on first use (float32/float64/bfloat16)
            triton_core.TritonMLSTMFunction   CUDA, Triton kernels (needs triton); its loop (step, cublas
                                              or persistent, app/model/gpu_loops.py) timed per shape

`core` (model.core): "python" the reference; "fused" the device's fused backend, an error saying why when
it cannot run; "auto" the fused backend where it runs, else the reference, and on CUDA, per (B, H, dtype),
whichever of the two measured faster (app/model/gpu_tuning.py). The choice is logged once per (device
type, dtype, backend). Same function, parameters and checkpoints whichever runs.
"""

from __future__ import annotations

import logging

import torch

from app.model import fused_core, gpu_loops, gpu_tuning, mlstm_core, triton_core
from app.model.config import CORES
from app.model.mlstm_core import MLSTMFromState, MLSTMFunction, state_dtype

log = logging.getLogger(__name__)
_logged: set = set()


def _fused_backend(x: torch.Tensor, w: torch.Tensor) -> tuple[type[torch.autograd.Function] | None, str]:
    """The device's fused backend, or (None, why it cannot run here)."""
    if x.device.type == "cuda" or gpu_loops.interpreting():
        why = triton_core.available(x, w)
        return (None, why) if why else (triton_core.TritonMLSTMFunction, "triton")
    if not fused_core.supports(x, w):
        return None, f"core='fused' runs on CPU in float32/float64/bfloat16, got {x.device.type} {w.dtype}"
    if fused_core.fused_ops() is None:
        return None, f"core='fused' requested but the C++ extension did not build: {fused_core.build_error()}"
    return fused_core.FusedMLSTMFunction, "cpu-fused"


def select(
    core: str, x: torch.Tensor, w: torch.Tensor, backward: bool = True
) -> type[torch.autograd.Function]:
    """The Function that runs `core` for these operands (w: a recurrent weight, in the compute dtype;
    `backward`: whether a backward will follow, for the GPU's timing)."""
    if core not in CORES:
        raise ValueError(f"core must be one of {CORES}, got {core!r}")
    fn, name = (MLSTMFunction, "python") if core == "python" else _fused_backend(x, w)
    timed = fn is triton_core.TritonMLSTMFunction and core == "auto" and x.device.type == "cuda"
    why = (
        gpu_tuning.prefers_reference(x, w, backward, fn, MLSTMFunction, triton_core.run_op) if timed else None
    )
    if why is not None:
        fn, name = MLSTMFunction, f"python ({why})"
    if fn is None:
        if core == "fused":
            raise (ValueError if "runs on" in name or "takes" in name else RuntimeError)(name)
        fn, name = MLSTMFunction, f"python ({name})"
    key = (x.device.type, w.dtype, name)
    if key not in _logged:
        _logged.add(key)
        log.info("mLSTM core on %s %s: %s", x.device.type, str(w.dtype).removeprefix("torch."), name)
    return fn


def mlstm_sequence(
    x: torch.Tensor,
    w_in: torch.Tensor,
    bias: torch.Tensor,
    w_mh: torch.Tensor,
    w_m: torch.Tensor,
    core: str = "auto",
) -> torch.Tensor:
    """x (B, T, in) -> h (B, T, H) from a zero state. Operands must already be in the compute dtype."""
    return select(core, x, w_mh).apply(x, w_in, bias.to(state_dtype(x.dtype)), w_mh, w_m)


@torch.no_grad()
def mlstm_prefill(
    x: torch.Tensor,
    lengths: torch.Tensor,
    w_in: torch.Tensor,
    bias: torch.Tensor,
    w_mh: torch.Tensor,
    w_m: torch.Tensor,
    state: tuple[torch.Tensor, torch.Tensor] | None = None,
    core: str = "auto",
) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """`mlstm_core.mlstm_prefill` (inference: h (B, T, H) and the state after row b's lengths[b] steps), on the
    CPU's compiled loop or the GPU's forward loop where `core` picks them (both keep every c_t, as training's
    does), from a zero or a given state (a text scored as one stream, chunk after chunk; generation's prompt
    after a context)."""
    fn = select(core, x, w_mh, backward=False) if core != "python" else MLSTMFunction
    if fn is fused_core.FusedMLSTMFunction:
        bias = bias.to(state_dtype(x.dtype))
        return fused_core.fused_prefill(x, w_in, bias, w_mh, w_m, lengths.to(x.device), state)
    if fn is triton_core.TritonMLSTMFunction:
        state = None if state is None else (state[0].to(x.dtype), state[1].to(state_dtype(x.dtype)))
        return triton_core.prefill(x, lengths, w_in, bias.to(state_dtype(x.dtype)), w_mh, w_m, state)
    return mlstm_core.mlstm_prefill(x, lengths, w_in, bias, w_mh, w_m, state)


def mlstm_sequence_from(
    x: torch.Tensor,
    state: tuple[torch.Tensor, torch.Tensor],
    w_in: torch.Tensor,
    bias: torch.Tensor,
    w_mh: torch.Tensor,
    w_m: torch.Tensor,
    core: str = "auto",
) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """x (B, T, in) from state (h_0, c_0) -> (h (B, T, H), (h_T, c_T)), with weight gradients only (the state
    enters as a constant: truncated backpropagation through time, for --carry-state and dynamic evaluation).
    The fused loop of the device where `core` picks it (the CPU's C++ op, the GPU's Triton loops), else the
    reference. Operands in the compute dtype; the state is cast to it (h) and to the state dtype (c)."""
    sdt = state_dtype(x.dtype)
    fn = select(core, x, w_mh) if core != "python" else MLSTMFunction
    from_state = {
        fused_core.FusedMLSTMFunction: fused_core.FusedMLSTMFromState,
        triton_core.TritonMLSTMFunction: triton_core.TritonMLSTMFromState,
    }.get(fn, MLSTMFromState)
    h0, c0 = state[0].detach().to(x.dtype), state[1].detach().to(sdt)
    h, c_last = from_state.apply(x, w_in, bias.to(sdt), w_mh, w_m, h0, c0)
    return h, (h[:, -1].detach(), c_last)
