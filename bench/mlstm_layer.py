"""Train-step (forward + backward) throughput of ONE recurrent layer, and the machine's matmul peak.

    python bench/mlstm_layer.py [--sizes small,large] [--reps-small 5 --reps-large 3] [--budget-s 100]
    python bench/mlstm_layer.py --device cuda --save   # on a GPU: fused = the Triton core, torch_lstm = cuDNN

Contenders at each size (input width = hidden width H):
    fused_fp32 / fused_bf16    RecurrentLayer (mLSTM, weight norm on), core="fused" (compiled time loop)
    python_fp32 / python_bf16  the same layer with core="python" (the Python-loop core)
    fused_carried_fp32 / python_carried_fp32  the same layers from a non-zero (h_0, c_0) (`forward_from`:
                               --carry-state's continuing rows, dynamic evaluation)
    naive_fp32                 the equations stepped in Python with autograd (how the anchors run it)
    torch_lstm_fp32 / _bf16    torch's fused nn.LSTM at the same H (a different, cheaper cell)
A contender this machine cannot run (no compiler for the fused core, no oneDNN bf16 LSTM primitive on
an AVX2 CPU, ...) is reported as "unavailable" with the reason, never a crash.
Peak: the best fp32 path (MKL torch.mm, oneDNN linear) and bf16 torch.mm on a large product, timed
in the same round-robin as the contenders (the 2-core box is shared, so load hits both alike).
`bf16_native`: whether bf16 products beat fp32 here (app.model.matmul.bf16_is_native).

Model FLOPs count matmuls only, training = 3x forward: mLSTM 3 * 20 H^2 per token, LSTM 3 * 16 H^2.
`mfu` = model FLOP/s / measured peak of the precision used. `vs_python` = fused_fp32 / python_fp32
tokens/s (`carried_vs_python` the same from a carried state), `vs_naive` = fused_fp32 / naive_fp32; `vs_torch_lstm_per_flop` = fused_fp32 /
torch_lstm_fp32 model FLOP/s (`python_vs_torch_lstm_per_flop` the same for the Python core).
`loop_ms` / `outside_loop_ms`: the best fused_fp32 step's time inside the compiled time loop and outside
it (bench/loop_clock.py). `vs_python_ceiling` / `vs_torch_lstm_per_flop_ceiling`: the two ratios that step
would reach with the loop's recurrent products (20 H^2 FLOPs per token, training) at the measured fp32
peak and its elementwise work free (Amdahl: the part outside the loop runs as it does for the Python core).
`kernels_per_step`: compute ops dispatched per time step, forward and backward, counted with
torch.profiler at the small size from the difference between T=8 and T=16 (so per-sequence work
cancels); view/allocation ops are not kernels, nested ops count once (innermost). The fused core's
elementwise passes are recorded as mlstm_cpu::* events. This is the proxy for how the core maps to a
GPU, where every such op is one kernel launch. `act_mb` = memory
held for backward (tensors saved by autograd, deduplicated by storage), the part of peak training
memory that grows with B*T; `max_rss_mb` is the whole process's peak. The last line printed is JSON.

With --device cuda the profiler's CUDA kernels are counted instead (memcpy/memset left out), with CUDA
graphs off (`kernels_per_step`) and on (`graph_kernels_per_step`); the contenders add `auto_*` (what
`model.core=auto` runs), `loop_<name>_bf16` (each GPU loop forced) and the carried state in bf16, and each
size reports the loops the tuner chose with its times (`chosen`: with `op_graph` and `wgrad_chunks`, how the op
runs in training, its paths' times under `path/plain`, `path/graph` and `path/overlap`). `gpu_targets` (issue 34): `auto` bf16 model
FLOP/s against cuDNN's nn.LSTM bf16 >= 0.8 at both sizes, `auto` fp32 tokens/s >= the Python core's at both,
the Triton core from a carried state >= 3x the Python core's at the small size. `--save` appends the JSON line to
bench/results/mlstm_layer-<device>-<date>.json (bench/results.py: with the git commit).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import time
from collections.abc import Callable

import torch
from loop_clock import timing_fused_loop  # bench/loop_clock.py (this script's folder is on sys.path)
from results import save  # bench/results.py
from roofline import bound, measure_ceilings  # bench/roofline.py

from app.model.config import debug_config, recurrent_flops_per_token
from app.model.core import mlstm_sequence
from app.model.layers import RecurrentLayer
from app.model.matmul import _ONEDNN_LINEAR, bf16_is_native
from app.model.reference import naive_mlstm

# field: the size OpenAI and NVIDIA trained (the `large` preset's 4096 units) at B128, cuDNN's ratio at it too
SIZES = {
    "small": dict(B=16, T=128, H=256),
    "large": dict(B=64, T=128, H=1024),
    "field": dict(B=128, T=128, H=4096),
}
TARGETS = {"vs_python_small": 2.5, "vs_torch_lstm_per_flop": 1.0, "mfu": 0.6}
KINDS = [
    "fused_fp32",
    "fused_bf16",
    "python_fp32",
    "python_bf16",
    "fused_carried_fp32",
    "python_carried_fp32",
    "naive_fp32",
    "torch_lstm_fp32",
    "torch_lstm_bf16",
    # CUDA only: what core="auto" runs (the Triton core or, where it measured faster, the reference), each
    # GPU loop forced, and the carried state in bf16
    "auto_fp32",
    "auto_bf16",
    "loop_step_bf16",
    "loop_cublas_bf16",
    "loop_persistent_bf16",
    # the same with the old host wait after every persistent launch (MLSTM_BARRIER_HOST_WAIT=1): its A/B
    "auto_wait_bf16",
    "loop_persistent_wait_bf16",
    "fused_carried_bf16",
    "python_carried_bf16",
]
CUDA_ONLY = ("auto_", "loop_", "fused_carried_bf16", "python_carried_bf16")
UNAVAILABLE = "unavailable"
# Ops that move no data through a kernel: views, allocation, dtype no-ops.
META_OPS = {
    "aten::as_strided", "aten::empty", "aten::empty_strided", "aten::view", "aten::_unsafe_view", "aten::t",
    "aten::transpose", "aten::select", "aten::slice", "aten::unbind", "aten::split", "aten::expand",
    "aten::reshape", "aten::alias", "aten::detach", "aten::lift_fresh", "aten::resize_", "aten::to",
    "aten::contiguous", "aten::unsqueeze", "aten::squeeze", "aten::permute", "aten::narrow", "aten::chunk",
    "aten::result_type", "detach", "aten::empty_like", "aten::zeros", "aten::_to_copy", "aten::resolve_conj",
    "aten::resolve_neg",
}  # fmt: skip


DEVICE = torch.device("cpu")  # --device; every tensor below is made here
CEILINGS: dict = {}  # on CUDA: the device's measured HBM and L2 bandwidth and bf16 matmul rate (bench/roofline.py)


def sync() -> None:
    if DEVICE.type == "cuda":
        torch.cuda.synchronize()


def timeit(fn: Callable[[], None], reps: int, warmup: int = 1) -> float:
    """Best wall time of `reps` calls after `warmup` (best, not mean: the machine is shared)."""
    for _ in range(warmup):
        fn()
    sync()
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        sync()  # GPU work is asynchronous: time it to completion
        best = min(best, time.perf_counter() - t0)
    return best


def peak_paths() -> dict[str, tuple[Callable[[], object], float]]:
    """(fn, flops) of a (4096 x 1024) @ (1024 x 4096) product on each available path."""
    M, K, N = (8192, 8192, 8192) if DEVICE.type == "cuda" else (4096, 1024, 4096)
    a, w = torch.randn(M, K, device=DEVICE), torch.randn(N, K, device=DEVICE)
    ab, wb = a.bfloat16(), w.bfloat16()
    flops = 2.0 * M * K * N
    paths = {"fp32_mkl_mm": lambda: torch.mm(a, w.t()), "bf16_mm": lambda: torch.mm(ab, wb.t())}
    if _ONEDNN_LINEAR is not None and DEVICE.type == "cpu":
        paths["fp32_onednn_linear"] = lambda: _ONEDNN_LINEAR(a, w, None, "none", [], "")
    return {k: (f, flops) for k, f in paths.items()}


class SavedBytes:
    """Counts the bytes autograd keeps for backward (unique storages)."""

    def __init__(self) -> None:
        self.storages: dict[int, int] = {}

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        s = t.untyped_storage()
        self.storages[s.data_ptr()] = s.nbytes()
        return t

    def mb(self) -> float:
        return sum(self.storages.values()) / 2**20


@contextlib.contextmanager
def host_wait(on: bool):
    """MLSTM_BARRIER_HOST_WAIT as `on` asks, for the steps within (app/model/gpu_health.host_wait)."""
    before = os.environ.get("MLSTM_BARRIER_HOST_WAIT")
    os.environ["MLSTM_BARRIER_HOST_WAIT"] = "1" if on else "0"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("MLSTM_BARRIER_HOST_WAIT")
        else:
            os.environ["MLSTM_BARRIER_HOST_WAIT"] = before


def make_step(kind: str, B: int, T: int, H: int) -> tuple[Callable[[], None], Callable[[], float]]:
    torch.manual_seed(0)
    x = torch.randn(B, T, H, device=DEVICE, requires_grad=True)
    gy = torch.randn(B, T, H, device=DEVICE)
    bf16 = kind.endswith("bf16")
    wait = "_wait" in kind  # the old per-launch host wait, for this contender's steps only
    kind = kind.replace("_wait", "")
    forced: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext
    if kind.startswith("loop_"):
        from app.model.gpu_tuning import forcing

        loop = kind.split("_")[1]
        forced = lambda: forcing(loop)  # noqa: E731
        kind = "fused_" + kind.split("_")[2]
    if kind.startswith(("fused", "python", "auto")):
        core = kind.split("_")[0]
        layer = RecurrentLayer(debug_config(embed_dim=H, hidden_dim=H, num_layers=1, core=core), 0).to(DEVICE)
        if "_carried" in kind:
            g = torch.Generator(device=DEVICE).manual_seed(1)
            state = (
                torch.rand(B, H, device=DEVICE, generator=g) - 0.5,
                torch.randn(B, H, device=DEVICE, generator=g),
            )
            fwd = lambda: layer.forward_from(x, state)[0]  # noqa: E731
        else:
            fwd = lambda: layer(x)  # noqa: E731
    elif kind.startswith("torch_lstm"):
        lstm = torch.nn.LSTM(H, H, batch_first=True).to(DEVICE)
        fwd = lambda: lstm(x)[0]  # noqa: E731
    else:
        ws = [torch.empty(s, device=DEVICE).uniform_(-(H**-0.5), H**-0.5).requires_grad_() for s in
              [(H, H), (4 * H, H), (4 * H,), (H, H), (4 * H, H)]]  # fmt: skip
        fwd = lambda: naive_mlstm(x, *ws)  # noqa: E731

    def step() -> None:
        with host_wait(wait):
            with forced(), torch.autocast(DEVICE.type, dtype=torch.bfloat16, enabled=bf16):
                y = fwd()
            y.backward(gy.to(y.dtype))

    def act_mb() -> float:
        saved = SavedBytes()
        hooks = torch.autograd.graph.saved_tensors_hooks(saved.pack, lambda t: t)
        with forced(), hooks, torch.autocast(DEVICE.type, dtype=torch.bfloat16, enabled=bf16):
            y = fwd()
        del y
        return saved.mb()

    return step, act_mb


def why(e: BaseException) -> str:
    """One line: the exception type and the first line of its message."""
    msg = str(e).strip().splitlines()
    return f"{type(e).__name__}: {msg[0][:200]}" if msg else type(e).__name__


def ratio(a, b):
    return a / b if isinstance(a, float) and isinstance(b, float) else UNAVAILABLE


def bench_size(name: str, B: int, T: int, H: int, reps: int, budget_s: float) -> dict:
    tokens = B * T
    fpt = {c: 3 * recurrent_flops_per_token(c, H, H) for c in ("mlstm", "lstm")}
    steps, failed = {}, {}
    here = [k for k in KINDS if DEVICE.type == "cuda" or not k.startswith(CUDA_ONLY)]
    if (
        name == "field"
    ):  # the 4096-wide layer: the bf16 contenders (fp32 FMA products there take seconds a step)
        here = [k for k in here if k.endswith("bf16")]
    for k in here:
        try:
            steps[k] = make_step(k, B, T, H)
            steps[k][0]()  # a first step here, so a contender the machine cannot run is known up front
        except Exception as e:  # e.g. oneDNN has no bf16 LSTM primitive without AVX512-BF16
            failed[k] = why(e)
            steps.pop(k, None)
            print(f"{name:5s} {k:16s} {UNAVAILABLE}: {failed[k]}", flush=True)
    kinds = list(steps)
    deadline = time.perf_counter() + budget_s  # the timed rounds' budget starts after set-up
    peaks = peak_paths()
    best = dict.fromkeys([*kinds, *peaks], float("inf"))
    # Round-robin over contenders AND the peak products, so background load on the shared machine
    # hits numerators and denominators alike; best of the rounds (the first round also warms up:
    # allocations, oneDNN primitive creation, and is rarely the best). No new round past the deadline.
    rounds = 0
    loop_s: dict[str, float] = {}  # the fused kinds: seconds inside the time loop in their best step
    # the CPU op's loop clock (on CUDA the fused core is Triton: no clock, no Amdahl figures)
    with timing_fused_loop() if DEVICE.type == "cpu" else contextlib.nullcontext() as clock:
        for rep in range(reps):
            if rep >= 1 and time.perf_counter() > deadline:
                break
            rounds += 1
            for kind in kinds:
                if kind.startswith("naive") and rep >= 2:
                    continue  # the slow baseline: two rounds are enough signal
                if clock is not None:
                    clock.reset()
                t = timeit(steps[kind][0], reps=1, warmup=0)
                if t < best[kind]:
                    best[kind] = t
                    if kind.startswith("fused") and clock is not None:
                        loop_s[kind] = clock.seconds
            for path, (fn, _) in peaks.items():
                try:
                    best[path] = min(best[path], timeit(fn, reps=2, warmup=1 if rep == 0 else 0))
                except Exception as e:
                    failed[path] = why(e)
    peak = {path: flops / best[path] / 1e9 for path, (_, flops) in peaks.items() if path not in failed}
    peak["fp32"] = max(v for k, v in peak.items() if k.startswith("fp32"))
    peak["bf16"] = peak.get("bf16_mm", float("nan"))
    print(f"{name:5s} peak GFLOP/s", {k: round(v) for k, v in peak.items()}, flush=True)
    tok_s, gflops, act = dict.fromkeys(KINDS, UNAVAILABLE), dict.fromkeys(KINDS, UNAVAILABLE), dict(failed)
    for kind in kinds:
        tok_s[kind] = tokens / best[kind]
        gflops[kind] = tok_s[kind] * fpt["lstm" if kind.startswith("torch_lstm") else "mlstm"] / 1e9
        act[kind] = steps[kind][1]()
        print(
            f"{name:5s} {kind:16s} {tok_s[kind]:10.0f} tok/s {gflops[kind]:7.1f} GFLOP/s act {act[kind]:7.1f} MB",
            flush=True,
        )
    return {
        "B": B, "T": T, "H": H, "rounds": rounds,
        "peak_gflops": peak,
        "tokens_per_s": tok_s,
        "model_gflops": gflops,
        "mfu": {"fp32": ratio(gflops["fused_fp32"], peak["fp32"]), "bf16": ratio(gflops["fused_bf16"], peak["bf16"]),
                "python_fp32": ratio(gflops["python_fp32"], peak["fp32"])},
        "vs_python": ratio(tok_s["fused_fp32"], tok_s["python_fp32"]),
        "vs_python_bf16": ratio(tok_s["fused_bf16"], tok_s["python_bf16"]),
        "carried_vs_python": ratio(tok_s["fused_carried_fp32"], tok_s["python_carried_fp32"]),
        "vs_naive": ratio(tok_s["fused_fp32"], tok_s["naive_fp32"]),
        "vs_torch_lstm_per_flop": ratio(gflops["fused_fp32"], gflops["torch_lstm_fp32"]),
        "python_vs_torch_lstm_per_flop": ratio(gflops["python_fp32"], gflops["torch_lstm_fp32"]),
        "vs_torch_lstm_per_flop_bf16": ratio(gflops["fused_bf16"], gflops["torch_lstm_bf16"]),
        "act_mb": act,
        **amdahl(best, loop_s, tok_s, fpt, tokens, H, peak["fp32"]),
        **(cuda_ratios(tok_s, gflops, B, T, H) if DEVICE.type == "cuda" else {}),
    }  # fmt: skip


def cuda_ratios(tok_s: dict, gflops: dict, B: int, T: int, H: int) -> dict:
    """What a GPU user gets (core="auto") against the reference core and cuDNN, each loop's own figure, the
    loops the tuner chose for this shape (with its timings), and how far its bf16 step is from the bound
    (bench/roofline.py: FLOPs, HBM and L2 bytes over the device's measured ceilings)."""
    from app.model import gpu_tuning
    from app.model.gpu_tiles import weights_in_l2

    chosen = {
        str(dt).removeprefix("torch."): {"fwd": c.fwd.label if c.fwd else None, "bwd": c.bwd.label if c.bwd else None,
                                         "python": c.python, "op_graph": c.op_graph, "wgrad_chunks": c.wgrad_chunks,
                                         "times_ms": c.times}
        for (dev, b, h, dt, tf32, forced), c in gpu_tuning._choices.items()
        if (b, h, forced) == (gpu_tuning.batch_bucket(B), H, None)
    }  # fmt: skip
    bf16 = gpu_tuning._choices.get(
        next((k for k in gpu_tuning._choices if k[1:] == (gpu_tuning.batch_bucket(B), H, torch.bfloat16, False, None)),
             None))  # fmt: skip
    roof = UNAVAILABLE
    if bf16 is not None and isinstance(tok_s.get("auto_bf16"), float) and CEILINGS:
        l2 = torch.cuda.get_device_properties(DEVICE).L2_cache_size
        roof = bound(
            dict(B=B, T=T, H=H), 2, weights_in_l2(H, torch.bfloat16, l2), CEILINGS, bf16.fwd, bf16.bwd
        )
        roof["measured_ms"] = round(1e3 * B * T / tok_s["auto_bf16"], 4)
        roof["of_bound"] = round(roof["bound_ms"] / roof["measured_ms"], 3)
    return {
        "roofline_auto_bf16": roof,
        "auto_vs_python_fp32": ratio(tok_s.get("auto_fp32"), tok_s.get("python_fp32")),
        "auto_vs_python_bf16": ratio(tok_s.get("auto_bf16"), tok_s.get("python_bf16")),
        "auto_vs_torch_lstm_per_flop_bf16": ratio(gflops.get("auto_bf16"), gflops.get("torch_lstm_bf16")),
        "carried_vs_python_bf16": ratio(tok_s.get("fused_carried_bf16"), tok_s.get("python_carried_bf16")),
        "loops_bf16_tokens_per_s": {k: tok_s.get(f"loop_{k}_bf16") for k in gpu_tuning.LOOPS},
        # the persistent launch's old host wait, on against off (off: the default), tokens/s
        "host_wait_ab_bf16": {
            k: {"off": tok_s.get(f"{k}_bf16"), "on": tok_s.get(f"{k.replace('_bf16', '')}_wait_bf16")}
            for k in ("auto", "loop_persistent")
        },
        "chosen": chosen,
    }


def recurrent_loop_flops_per_token(H: int) -> int:
    """The time loop's products per token, training: forward h W_mh^T, m W_m^T, backward dG W_m,
    d(r) W_mh, each 2 FLOPs per multiply-add: 2 * (H^2 + 4 H^2) * 2."""
    return 20 * H * H


def amdahl(best: dict, loop_s: dict, tok_s: dict, fpt: dict, tokens: int, H: int, peak: float) -> dict:
    """What a faster time loop could still win. The fused step's time inside its loop and outside it
    (input projection, weight gradients, weight norm: work the Python core does the same way), and the
    ratios the step would reach with the loop's products running at the machine's measured fp32 matmul
    peak (`*_ceiling`; its elementwise work free): no loop runs its 20 H^2 FLOPs per token faster, so a
    target above its ceiling is out of any core's reach at this size, on this machine."""
    if "fused_fp32" not in loop_s:
        return {"loop_ms": UNAVAILABLE}
    loop, step = loop_s["fused_fp32"], best["fused_fp32"]
    outside = step - loop
    loop_flops = recurrent_loop_flops_per_token(H) * tokens
    fastest = outside + loop_flops / (peak * 1e9)
    out = {
        "loop_ms": 1e3 * loop, "outside_loop_ms": 1e3 * outside, "loop_share": loop / step,
        "loop_gflops": loop_flops / loop / 1e9, "loop_at_peak_ms": 1e3 * loop_flops / (peak * 1e9),
    }  # fmt: skip
    if isinstance(tok_s["python_fp32"], float):
        out["vs_python_ceiling"] = best["python_fp32"] / fastest
    if isinstance(tok_s["torch_lstm_fp32"], float):
        out["vs_torch_lstm_per_flop_ceiling"] = (fpt["mlstm"] / fastest) / (
            fpt["lstm"] / best["torch_lstm_fp32"]
        )
    return out


def count_kernels(run: Callable[[], None]) -> int:
    """Compute ops dispatched by `run`, innermost only (an op that calls other compute ops is not counted)."""
    from torch.profiler import ProfilerActivity, profile

    if DEVICE.type == "cuda":  # the kernels the GPU ran
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            run()
            sync()
        cuda = torch.autograd.DeviceType.CUDA
        return sum(
            1 for e in prof.events() if e.device_type == cuda and not e.name.startswith(("Memcpy", "Memset"))
        )
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        run()

    def has_compute_below(e) -> bool:
        return any(c.name not in META_OPS or has_compute_below(c) for c in e.cpu_children)

    return sum(1 for e in prof.events() if e.name not in META_OPS and not has_compute_below(e))


def make_fwd(core: str, x: torch.Tensor, ws: list[torch.Tensor]) -> Callable[[], torch.Tensor]:
    if core == "naive":
        H = ws[2].shape[0]
        return lambda: naive_mlstm(x, ws[0][:H], ws[0][H:], *ws[1:])
    return lambda: mlstm_sequence(x, *ws, core=core)


def kernels_per_step(B: int = 16, H: int = 256) -> dict:
    """Kernels per time step forward and backward for each core, (count(T=16) - count(T=8)) / 8."""
    out: dict = {}
    for core in ("fused", "python", "naive"):
        counts = {}
        try:
            for T in (8, 16):
                g = torch.Generator().manual_seed(0)
                x = torch.randn(B, T, H, generator=g).to(DEVICE).requires_grad_()
                ws = [(torch.randn(s, generator=g) * H**-0.5).to(DEVICE).requires_grad_()
                      for s in [(5 * H, H), (4 * H,), (H, H), (4 * H, H)]]  # fmt: skip
                fwd = make_fwd(core, x, ws)
                fwd().sum().backward()  # warm: kernel choices measured, extension built
                box = []
                f = count_kernels(lambda: box.append(fwd()))  # noqa: B023
                y = box[0].sum()
                b = count_kernels(y.backward)
                counts[T] = (f, b)
            out[core] = {"fwd": (counts[16][0] - counts[8][0]) / 8, "bwd": (counts[16][1] - counts[8][1]) / 8}
        except Exception as e:
            out[core] = f"{UNAVAILABLE}: {why(e)}"
    return out


def gpu_targets(result: dict) -> dict:
    """The issues' GPU targets, measured side by side in this run: what core="auto" gives in bf16 against
    cuDNN's nn.LSTM per FLOP (issue 39: >= 0.9 at the small and large sizes, >= 0.8 at the field's) and in fp32
    against the reference core (>= 1); the Triton core from a carried state against the reference core's
    (>= 3 at the small size)."""

    def met(size: str, field: str, target: float):
        v = result[size].get(field, UNAVAILABLE) if size in result else UNAVAILABLE
        return {"ratio": v, "met": v >= target} if isinstance(v, float) else UNAVAILABLE

    return {
        "large_auto_bf16_vs_cudnn_lstm_per_flop>=0.9": met("large", "auto_vs_torch_lstm_per_flop_bf16", 0.9),
        "small_auto_bf16_vs_cudnn_lstm_per_flop>=0.9": met("small", "auto_vs_torch_lstm_per_flop_bf16", 0.9),
        "field_auto_bf16_vs_cudnn_lstm_per_flop>=0.8": met("field", "auto_vs_torch_lstm_per_flop_bf16", 0.8),
        "small_auto_fp32_vs_python_fp32>=1": met("small", "auto_vs_python_fp32", 1.0),
        "large_auto_fp32_vs_python_fp32>=1": met("large", "auto_vs_python_fp32", 1.0),
        "small_carried_fp32_vs_python_carried_fp32>=3": met("small", "carried_vs_python", 3.0),
    }


def rounded(v):
    if isinstance(v, dict):
        return {k: rounded(x) for k, x in v.items()}
    return round(v, 3) if isinstance(v, float) else v


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--sizes", default="small,large", help="comma list of: " + ",".join(SIZES) + " (field: GPUs)"
    )
    ap.add_argument("--reps-small", type=int, default=5)
    ap.add_argument("--reps-large", type=int, default=3)
    ap.add_argument(
        "--budget-s", type=float, default=100,
        help="no new timed round after this many seconds of timing (small size: a fifth of it)",
    )  # fmt: skip
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    ap.add_argument("--device", default="cpu", help="cpu or cuda")
    ap.add_argument("--save", action="store_true", help="append the JSON line to bench/results/ (results.py)")
    args = ap.parse_args()
    global DEVICE
    DEVICE = torch.device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    result = {"bench": "mlstm_layer", "torch": torch.__version__, "threads": torch.get_num_threads()}
    result["device"] = torch.cuda.get_device_name() if DEVICE.type == "cuda" else "cpu"
    result["loadavg_start"] = os.getloadavg()[0]  # the dev box is shared: context for the numbers
    result["bf16_native"] = bf16_is_native()
    if DEVICE.type == "cuda":
        CEILINGS.update(measure_ceilings(DEVICE))
        result["ceilings"] = dict(CEILINGS)
        print("ceilings", CEILINGS, flush=True)
        os.environ["MLSTM_CUDA_GRAPHS"] = "0"
        result["kernels_per_step"] = kernels_per_step()
        os.environ["MLSTM_CUDA_GRAPHS"] = "1"
        result["graph_kernels_per_step"] = kernels_per_step()
    else:
        result["kernels_per_step"] = kernels_per_step()
    print("kernels per step", result["kernels_per_step"], flush=True)
    for name in args.sizes.split(","):
        reps = args.reps_small if name == "small" else args.reps_large
        budget = args.budget_s * (0.2 if name == "small" else 1.0)
        result[name] = bench_size(name, **SIZES[name], reps=reps, budget_s=budget)

    def met(v, target):
        return v >= target if isinstance(v, float) else UNAVAILABLE

    targets = {}
    if "small" in result:
        r = result["small"]
        targets["small_vs_python>=2.5"] = met(r["vs_python"], TARGETS["vs_python_small"])
        targets["small_vs_torch_lstm_per_flop>=1"] = met(r["vs_torch_lstm_per_flop"], 1.0)
    if "large" in result:
        r = result["large"]
        targets["large_vs_torch_lstm_per_flop>=1"] = met(r["vs_torch_lstm_per_flop"], 1.0)
        targets["large_mfu_fp32>=0.6"] = met(r["mfu"]["fp32"], TARGETS["mfu"])
    result["targets"] = targets
    if DEVICE.type == "cuda":
        result["gpu_targets"] = gpu_targets(result)
    # the most each target's ratio could reach here with a perfect time loop (see amdahl())
    result["target_ceilings"] = {
        key: result[size].get(field, UNAVAILABLE)
        for key, size, field in [
            ("small_vs_python>=2.5", "small", "vs_python_ceiling"),
            ("small_vs_torch_lstm_per_flop>=1", "small", "vs_torch_lstm_per_flop_ceiling"),
            ("large_vs_torch_lstm_per_flop>=1", "large", "vs_torch_lstm_per_flop_ceiling"),
        ]
        if size in result
    }
    result["loadavg_end"] = os.getloadavg()[0]
    result["max_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    result["seconds"] = time.perf_counter() - t0
    print(json.dumps(rounded(result)))
    if args.save:
        print("saved to", save(rounded(result), "mlstm_layer", result["device"]))


if __name__ == "__main__":
    main()
