"""The mLSTM time loop compiled for CPU: forward and backward each one C++ op (csrc/mlstm_cpu.cpp).

Same function, parameters and precision rules as `mlstm_core.MLSTMFunction` (the portable Python core,
kept as fallback and reference); only the per-time-step loop moves out of Python. The input projection
before the loop and the weight gradients after it stay large torch products (`app.model.matmul`).

Per step, forward:  r = h_{t-1} W_mh^T (GEMM) -> m = pm_t * r (elementwise) -> m W_m^T (GEMM) ->
ONE fused pass: pre-activations + bias, sigmoid/tanh gates, c_t, tanh(c_t), h_t.
Per step, backward: ONE fused pass for every gate and cell derivative (dh, dc carry, dG) -> dG W_m
(GEMM) -> one pass for d(pm), d(r) -> d(r) W_mh (GEMM). So the Python core's ~10 dispatched ops per
step forward and ~9 backward become 2 GEMMs + 2 elementwise passes in one op call
(`bench/mlstm_layer.py` counts them).

Build: on first use with torch.utils.cpp_extension.load (ninja), the way DeepSpeed JIT-builds its ops,
cached under TORCH_EXTENSIONS_DIR (default ~/.cache/torch_extensions); a failed build logs ONE warning
and the Python core runs instead. No -march=native: the cache may be shared by machines with different
CPUs, so the elementwise kernels are function-multiversioned (AVX-512 / AVX2+FMA / SSE2 clones picked at
load time) and written to auto-vectorise; see the C++ file's header.

GPU design (not built here; the layout is chosen so it maps 1:1):
- Per step the work is two GEMMs, (B, H) x (H, H) and (B, H) x (H, 4H), and the elementwise passes.
  On a GPU, `m = pm_t * r` becomes the epilogue of the first GEMM (cuBLASLt / CUTLASS epilogue, or a
  tiny kernel), and the gate/cell pass is ONE fused kernel over B x H threads (each thread reads its four
  pre-activations from the (B, 4H) GEMM output, writes gates, c, tanh c, h): 2 GEMMs + 1 fused kernel.
  Backward mirrors it: 1 fused derivative kernel + 2 GEMMs (+ the d(pm), d(r) epilogue).
- At small B the step is launch-bound (3 kernels x T steps): capture the whole T-step loop once per
  (B, T, H, dtype) in a CUDA graph (torch.cuda.graphs) with the preallocated buffers used here (all
  per-step tensors are slices of (T, B, .) buffers allocated before the loop, so addresses are static),
  and replay it; backward likewise. That is where the per-step host overhead the CPU op removes goes
  on a GPU.
- Beyond that, a persistent kernel keeping W_mh / W_m in shared memory / registers across steps (as
  cuDNN's persistent RNN does) removes the weight re-reads per step for H up to ~1-2K.
- The before-loop input projection and after-loop weight gradients are already single large GEMMs.
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path

import torch

from app.model.matmul import grad_weight, linear, use_onednn

log = logging.getLogger(__name__)

CORES = ("auto", "fused", "python")
_SRC = Path(__file__).with_name("csrc") / "mlstm_cpu.cpp"
_lock = threading.Lock()
_state: dict[str, object] = {}  # "ops": the loaded op namespace, or "error": why it did not build


def _build() -> None:
    from torch.utils.cpp_extension import load

    # -fno-trapping-math lets GCC if-convert the clamps/selects in the activations so the loops
    # vectorise; it changes no result (we never enable FP traps).
    # The name carries the torch version: a cached build against another torch's ABI is never reused.
    tv = "".join(ch if ch.isalnum() else "_" for ch in torch.__version__)
    load(
        name=f"mlstm_cpu_v3_torch{tv}",
        sources=[str(_SRC)],
        extra_cflags=["-O3", "-fopenmp", "-fno-trapping-math"],
        extra_ldflags=["-fopenmp"],
        is_python_module=False,
        verbose=os.environ.get("MLSTM_BUILD_VERBOSE") == "1",
    )


def fused_ops():
    """The compiled ops (torch.ops.mlstm_cpu), built on first call; None when the build failed."""
    if "ops" in _state or "error" in _state:
        return _state.get("ops")
    with _lock:
        if "ops" not in _state and "error" not in _state:
            try:
                _build()
                _state["ops"] = torch.ops.mlstm_cpu
            except Exception as e:  # any compiler / toolchain failure: fall back, say so once
                _state["error"] = (
                    f"{type(e).__name__}: {str(e).strip().splitlines()[-1] if str(e).strip() else ''}"
                )
                log.warning("fused mLSTM core did not build (%s); using the Python core", _state["error"])
    return _state.get("ops")


def supports(x: torch.Tensor, w: torch.Tensor) -> bool:
    """Devices and dtypes the compiled op implements (compute dtype of the operands)."""
    return x.device.type == "cpu" and w.dtype in (torch.float32, torch.float64, torch.bfloat16)


def use_fused(core: str, x: torch.Tensor, w: torch.Tensor) -> bool:
    """Whether `core` routes this call to the fused op. "fused" insists (errors say why it cannot)."""
    if core == "python":
        return False
    if core == "auto":
        return supports(x, w) and fused_ops() is not None
    if core != "fused":
        raise ValueError(f"core must be one of {CORES}, got {core!r}")
    if not supports(x, w):
        raise ValueError(
            f"core='fused' runs on CPU in float32/float64/bfloat16, got {x.device.type} {w.dtype}"
        )
    if fused_ops() is None:
        raise RuntimeError(f"core='fused' requested but the C++ extension did not build: {_state['error']}")
    return True


class FusedMLSTMFunction(torch.autograd.Function):
    """(x, w_in, bias, w_mh, w_m) -> h, exactly `MLSTMFunction`'s contract; bias arrives in the state dtype."""

    @staticmethod
    def forward(ctx, x, w_in, bias, w_mh, w_m):
        B, T, D = x.shape
        H = w_mh.shape[0]
        sdt = bias.dtype
        ops = fused_ops()
        xt = x.transpose(0, 1).contiguous()  # (T, B, D)
        proj = linear(xt.view(T * B, D), w_in).view(T, B, 5 * H).to(sdt)  # (T, B, 5H)
        pm = proj[..., :H].contiguous()  # (T, B, H)  W_mx x_t
        pg = proj[..., H:] + bias  # (T, B, 4H) W_x x_t + b
        cdt = w_mh.dtype
        # each per-step product on the path measured fastest for its shape (app/model/matmul.py)
        dnn_r, dnn_g = use_onednn(B, H, H, cdt), use_onednn(B, H, 4 * H, cdt)
        hs, cs, tcs, gates, ms, rs = ops.forward(pm, pg, w_mh, w_m, dnn_r, dnn_g)
        ctx.save_for_backward(xt, w_in, w_mh, w_m, pm, gates, cs, tcs, rs, ms, hs)
        return hs[1:].transpose(0, 1).contiguous()  # (B, T, H)

    @staticmethod
    def backward(ctx, dy):
        xt, w_in, w_mh, w_m, pm, gates, cs, tcs, rs, ms, hs = ctx.saved_tensors
        T, B, D = xt.shape
        H = w_mh.shape[0]
        dyt = dy.transpose(0, 1).to(pm.dtype).contiguous()  # (T, B, H) state dtype
        cdt = w_mh.dtype
        w_mh_t, w_m_t = w_mh.t().contiguous(), w_m.t().contiguous()  # (H, H), (H, 4H): products as x @ w.T
        dnn_m, dnn_h = use_onednn(B, 4 * H, H, cdt), use_onednn(B, H, H, cdt)
        dG, dPm, dR = fused_ops().backward(dyt, gates, cs, tcs, rs, pm, w_mh_t, w_m_t, dnn_m, dnn_h)
        N = T * B
        dG2, dPm2, X = dG.view(N, 4 * H), dPm.view(N, H), xt.view(N, D)
        d_w_m = grad_weight(dG2, ms.view(N, H))  # (4H, H)
        d_w_mh = grad_weight(dR.view(N, H), hs[:-1].reshape(N, H))  # (H, H)
        d_bias = dG2.sum(dim=0, dtype=pm.dtype)  # (4H,)
        d_w_in = torch.cat((grad_weight(dPm2, X), grad_weight(dG2, X)))  # (5H, D)
        dx = None
        if ctx.needs_input_grad[0]:
            dx = linear(dG2, w_in[H:].t().contiguous())  # (N, D)
            dx += linear(dPm2, w_in[:H].t().contiguous())
            dx = dx.view(T, B, D).transpose(0, 1)  # (B, T, D)
        return dx, d_w_in, d_bias, d_w_mh, d_w_m
