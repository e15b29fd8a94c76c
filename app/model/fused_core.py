"""The mLSTM time loop compiled for CPU: forward and backward each one C++ op (csrc/mlstm_cpu.cpp).

One backend of the op contract in app/model/core.py (which picks it on CPU for core "fused"/"auto").

Same function, parameters and precision rules as `mlstm_core.MLSTMFunction` (the portable Python core,
kept as fallback and reference); only the per-time-step loop moves out of Python. Before the loop, ONE
product (T*B, D) x (D, 5H) for both input projections; after it, one product per weight gradient over
all T*B tokens (d(w_in) and dx each one product, K = 5H), all routed by `app.model.matmul`.

Per step, forward (3 kernels: 2 GEMMs + 1 fused elementwise pass):
    r = h_{t-1} W_mh^T  [GEMM, epilogue: keep r, m = pm_t * r]
    q = m W_m^T         [GEMM]
    gate pass           pre-activations + bias, sigmoid/tanh gates, c_t, tanh c_t, h_t
Per step, backward (3 kernels):
    dm = dG_t W_m       [GEMM, epilogue: d(pm) = dm * r, d(r) = dm * pm]
    dh = d(r) W_mh      [GEMM]
    gate pass           every gate / cell derivative of step t-1: dc carry, dG_{t-1}, the bias gradient
The Python core dispatches ~10 ops per step forward and ~9 backward (`bench/mlstm_layer.py` counts them).

Why it is fast on a CPU: the per-step products have only B rows, and a BLAS call per step pays dispatch,
packing of the weight and generic blocking every step. Here each weight is packed ONCE per call into
register-tile panels and a register-tiled kernel runs each step with no ATen dispatch inside the loop;
light elementwise work rides in the GEMM's epilogue, and the gate math runs as one pass at full vector
width (measured faster than per tile, where its many streams and short loops stalled the kernel).
With several threads (torch.get_num_threads(): one process using several cores, as evaluation,
generation and the layer benchmark do; training runs one thread per process) ONE team of threads spans
the whole time loop and barriers separate a step's kernels: each product is split by weight panels, each
gate pass by units, so every value is computed as by one thread and no result depends on the thread
count. Which path each per-step product takes (this packed GEMM with one
of two tiles, MKL's mm, oneDNN's linear) is measured per shape at first use (kind "step" in
app/model/matmul.py; the table goes into checkpoints like the others, so a resume is bit-exact).
The op's (T, B, .) buffers come from a small pool in the extension: torch's CPU allocator gives large
tensors fresh pages every step, and faulting them in cost 5-14 ms of a ~100 ms step.

Build: on first use with torch.utils.cpp_extension.load (ninja), the way DeepSpeed JIT-builds its ops,
cached in a folder of ours (app/common/toolchain.py: $MLSTM_CACHE_DIR/torch_extensions/..., default
~/.cache/mlstm-ds/...), one per checkout of these sources (two checkouts at different paths would
otherwise rebuild over each other's build, each finding the other's source paths in build.ninja); a
failed build logs ONE warning and the Python core runs instead. No -march=native: the cache may be shared by machines with different
CPUs, so every kernel is compiled for AVX-512, AVX2+FMA and SSE2 (own vector width and register tiles
each) and the best level the CPU has is picked at load (`set_isa` lowers it: the tests run all three);
see the C++ file's header.

GPU design (built in app/model/triton_core.py, which follows it; the CPU op has the same structure):
- Per step: two GEMMs, (B, H) x (H, H) and (B, H) x (H, 4H), the first with its epilogue fused
  (cuBLASLt / CUTLASS epilogue), and ONE fused elementwise kernel over B x H threads (each reads its
  unit's four pre-activations, writes gates, c, tanh c, h): 3 kernels per step each way, as on the CPU;
  dy enters through the backward gate kernel. On a GPU the gate math can also move into the second
  GEMM's epilogue if its tile covers the four gates of the same units (pack W_m gate-interleaved).
- At small B the step is launch-bound (3 kernels x T steps): capture the whole T-step loop once per
  (B, T, H, dtype) in a CUDA graph (torch.cuda.graphs) with buffers allocated before the loop (every
  per-step tensor here is a slice of a (T, B, .) buffer, so addresses are static) and replay it;
  backward likewise. That is where the per-step host overhead the CPU op removes goes on a GPU.
- Beyond that, a persistent kernel keeping W_mh / W_m in shared memory / registers across steps (as
  cuDNN's persistent RNN does) removes the weight re-reads per step for H up to ~1-2K: the GPU analogue
  of packing the weights once per call here.
- The before-loop input projection and after-loop weight gradients are already single large GEMMs.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
from pathlib import Path

import torch

from app.common.logs import Progress, heartbeat
from app.common.toolchain import build_directory, build_lock, use_environment_scripts
from app.model import matmul
from app.model.matmul import grad_weight, linear

log = logging.getLogger(__name__)

_CSRC = Path(__file__).with_name("csrc")
# the ops (mlstm_cpu.cpp, with torch's headers) and one file per ISA level (mlstm_isa_*.cpp, no torch
# headers): ninja compiles them in parallel, ~2x faster than one file on 2 cores (the first launch on a
# machine pays this build)
_SOURCES = sorted(_CSRC.glob("*.cpp"))
# The name carries the torch version: a cached build against another torch's ABI is never reused.
EXTENSION = "mlstm_cpu_v6_torch" + "".join(ch if ch.isalnum() else "_" for ch in torch.__version__)
_lock = threading.Lock()
_state: dict[str, object] = {}  # "ops": the loaded op namespace, or "error": why it did not build


def build_folder() -> Path:
    """This checkout's build of the extension: its name and a digest of where its sources are."""
    where = hashlib.sha256(str(_CSRC.resolve()).encode()).hexdigest()[:10]
    return build_directory(f"{EXTENSION}-{where}")


def _build() -> None:
    from torch.utils.cpp_extension import load

    use_environment_scripts()  # this environment's ninja, whatever the shell's PATH (app/common/toolchain.py)
    # -fno-trapping-math lets GCC if-convert the clamps/selects in the activations so the loops
    # vectorise; it changes no result (we never enable FP traps).
    folder = build_folder()
    with build_lock(folder):  # a build killed earlier must not leave every later one waiting
        load(
            name=EXTENSION,
            sources=[str(f) for f in _SOURCES],
            extra_cflags=["-O3", "-fopenmp", "-fno-trapping-math"],
            extra_ldflags=["-fopenmp"],
            build_directory=str(folder),
            is_python_module=False,
            verbose=os.environ.get("MLSTM_BUILD_VERBOSE") == "1",
        )


def _needs_build() -> bool:
    """No library built from these sources yet (torch's loader also rebuilds one whose sources or flags
    changed; this says so for the cases we can see: none built, or built from another checkout's files)."""
    folder = build_folder()
    try:
        ninja = (folder / "build.ninja").read_text()
    except OSError:
        return True
    return not (folder / f"{EXTENSION}.so").is_file() or str(_SOURCES[0]) not in ninja


def fused_ops():
    """The compiled ops (torch.ops.mlstm_cpu), built on first call; None when the build failed."""
    if "ops" in _state or "error" in _state:
        return _state.get("ops")
    with _lock:
        if "ops" not in _state and "error" not in _state:
            try:
                # a first build takes tens of seconds (minutes on a loaded machine): said as it starts (no
                # library of it yet) and every heartbeat; loading a built one is quiet
                desc = "the fused CPU core: building its C++ extension, once"
                with heartbeat(desc) if _needs_build() else Progress(None, desc, "s", bar=False):
                    _build()
                _state["ops"] = torch.ops.mlstm_cpu
                _register_packed(torch.ops.mlstm_cpu.isa(-1))
            except Exception as e:  # any compiler / toolchain failure: fall back, say so once
                _state["error"] = (
                    f"{type(e).__name__}: {str(e).strip().splitlines()[-1] if str(e).strip() else ''}"
                )
                log.warning("fused mLSTM core did not build (%s); using the Python core", _state["error"])
    return _state.get("ops")


def _register_packed(isa: list[str]) -> None:
    """Offer the packed GEMM's two tiles of the active ISA level as "step" paths (app/model/matmul.py)."""
    ops = torch.ops.mlstm_cpu
    _state["isa"] = isa
    matmul.register_paths(
        "step",
        {
            name: matmul.Path(
                run=lambda x, pw, i=i: ops.packed_linear(x, pw[0], pw[1], i),
                prepare=lambda w, i=i: (ops.pack(w, i), w.shape[0]),
            )
            for i, name in enumerate(isa[1:])
        },
    )


def set_isa(level: int) -> list[str]:
    """Cap the kernels' ISA level (2 AVX-512, 1 AVX2 + FMA, 0 baseline SSE2; never above the CPU's) ->
    [level, tile names]. For tests: every level's code runs on one machine."""
    isa = fused_ops().isa(level)
    _register_packed(isa)
    return isa


def _path_code(m: int, k: int, n: int, dtype: torch.dtype) -> int:
    """The op's code for the path measured fastest for this per-step product: 0 mm, 1 oneDNN, 2 + i the
    packed GEMM with tile i of the active ISA level."""
    name = matmul.choose(m, k, n, dtype, kind="step")
    codes = {"mm": 0, "onednn": 1, **{t: 2 + i for i, t in enumerate(_state["isa"][1:])}}
    return codes[name]


def supports(x: torch.Tensor, w: torch.Tensor) -> bool:
    """Devices and dtypes the compiled op implements (compute dtype of the operands)."""
    return x.device.type == "cpu" and w.dtype in (torch.float32, torch.float64, torch.bfloat16)


def build_error() -> str | None:
    """Why the op did not build (None when it built or was not tried yet)."""
    return _state.get("error")


def _forward(x, w_in, bias, w_mh, w_m, state=None):
    """The op's forward over x (B, T, in) from `state` (h_0, c_0), zero when None -> (xt (T*B, in), [y (B, T, H),
    hs, cs, tcs, gates, ms, rs, pms]): what backward keeps, and the states a prefill picks from."""
    B, T, D = x.shape
    H = w_mh.shape[0]
    sdt, cdt = bias.dtype, w_mh.dtype
    # (T, B) token order: one step's rows contiguous in proj (a (B, T) buffer would put them a
    # power-of-two stride apart, on the same L1 sets)
    ops = fused_ops()  # buffers from its pool: no fresh pages to fault in every step
    xt = ops.empty([T * B, D], x.dtype)  # (T*B, D)
    xt.view(T, B, D).copy_(x.transpose(0, 1))
    proj = linear(xt, w_in, out=ops.empty([T * B, 5 * H], x.dtype))  # (T*B, 5H) [W_mx x | W_x x]
    if proj.dtype != sdt:
        proj = ops.empty([T * B, 5 * H], sdt).copy_(proj)
    proj = proj.view(T, B, 5 * H)
    # each per-step product on the path measured fastest for its shape (app/model/matmul.py)
    path_r, path_g = _path_code(B, H, H, cdt), _path_code(B, H, 4 * H, cdt)
    h0, c0 = (None, None) if state is None else (state[0].to(cdt), state[1].to(sdt))
    outs = ops.forward(proj.transpose(0, 1), bias, w_mh, w_m, path_r, path_g, h0, c0)  # y (B, T, H) first
    return xt, outs


@torch.no_grad()
def fused_prefill(x, w_in, bias, w_mh, w_m, lengths, state=None):
    """Inference from `state` (zero when None): x (B, T, in) -> (h (B, T, H), (h, c) after row b's lengths[b]
    steps), `mlstm_core.mlstm_prefill`'s contract on the compiled loop."""
    _, (y, hs, cs, *_) = _forward(x, w_in, bias, w_mh, w_m, state)
    rows = torch.arange(x.shape[0], device=x.device)
    return y, (hs[lengths, rows].clone(), cs[lengths, rows].clone())


class FusedMLSTMFunction(torch.autograd.Function):
    """(x, w_in, bias, w_mh, w_m) -> h, exactly `MLSTMFunction`'s contract; bias arrives in the state dtype."""

    @staticmethod
    def forward(ctx, x, w_in, bias, w_mh, w_m):
        xt, (y, hs, cs, tcs, gates, ms, rs, pms) = _forward(x, w_in, bias, w_mh, w_m)
        ctx.save_for_backward(xt, w_in, w_mh, w_m, pms, gates, cs, tcs, rs, ms, hs)
        return y  # (B, T, H)

    @staticmethod
    def backward(ctx, dy):
        xt, w_in, w_mh, w_m, pms, gates, cs, tcs, rs, ms, hs = ctx.saved_tensors
        T, B, H = pms.shape
        D = xt.shape[1]
        cdt = w_mh.dtype
        path_m, path_h = _path_code(B, 4 * H, H, cdt), _path_code(B, H, H, cdt)
        dP, dR, d_bias = fused_ops().backward(
            dy.to(pms.dtype), gates, cs, tcs, rs, pms, w_mh, w_m, path_m, path_h
        )
        N = B * T
        dP2 = dP.view(N, 5 * H)  # (T*B, 5H) rows [d(W_mx x) | dG]: columns in w_in's row order
        dG2 = dP2[:, H:]  # (N, 4H) view
        d_w_m = grad_weight(dG2, ms.view(N, H))  # (4H, H)
        d_w_mh = grad_weight(dR.view(N, H), hs[:-1].reshape(N, H))  # (H, H)
        d_w_in = grad_weight(dP2, xt)  # (5H, D): both input projections in one product
        dx = None
        if ctx.needs_input_grad[0]:
            dx = linear(
                dP2, w_in.t().contiguous(), out=fused_ops().empty([N, D], dP2.dtype)
            )  # (T*B, D), K = 5H
            dx = dx.view(T, B, D).transpose(0, 1)  # (B, T, D)
        return dx, d_w_in, d_bias, d_w_mh, d_w_m


class FusedMLSTMFromState(FusedMLSTMFunction):
    """(x, w_in, bias, w_mh, w_m, h_0, c_0) -> (h for all steps, c_T): `mlstm_core.MLSTMFromState`'s contract
    on the compiled loop. The state enters as a constant; the weight gradients are FusedMLSTMFunction's
    backward, which reads h_0 and c_0 from the saved hs[0] / cs[0] as it reads every later state."""

    @staticmethod
    def forward(ctx, x, w_in, bias, w_mh, w_m, h0, c0):
        xt, (y, hs, cs, tcs, gates, ms, rs, pms) = _forward(x, w_in, bias, w_mh, w_m, (h0, c0))
        ctx.save_for_backward(xt, w_in, w_mh, w_m, pms, gates, cs, tcs, rs, ms, hs)
        c_last = cs[-1].clone()  # (B, H)
        ctx.mark_non_differentiable(c_last)
        return y, c_last  # (B, T, H), (B, H)

    @staticmethod
    def backward(ctx, dy, _dc_last):
        return (*FusedMLSTMFunction.backward(ctx, dy), None, None)
