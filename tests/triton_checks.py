"""Run in a subprocess by tests/test_model_triton_core.py: the Triton core checked with no GPU.

`python tests/triton_checks.py parity`  (with TRITON_INTERPRET=1, which must be set before any
@triton.jit module is imported, hence a process of its own): the Triton core's forward and every gradient
against the float64 reference (app/model/reference.py, autograd through a per-step Python loop) at tiny odd
shapes, in float64, float32 and bfloat16 (the bf16 Python core's own error beside it), a multi-tile shape, a
right-padded batch against its rows run alone, and the dispatcher's choice. Prints one JSON object.

`python tests/triton_checks.py tuning` / `faults` / `op_graph` (TRITON_INTERPRET=1): the tuner's logic (every candidate
checked against float64, then timed by a wall clock) and the failure paths: a grid barrier that "times out", a
loop that raises at launch, a wrong loop, and cache entries that are corrupt, foreign or wrong; each must give
the right answer through a fallback with one warning line.
"""

from __future__ import annotations

import gc
import json
import logging
import os
import sys

import torch


def _weights(D: int, H: int, seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    shapes, scales = [(5 * H, D), (4 * H,), (H, H), (4 * H, H)], [0.4, 0.3, 0.4, 0.4]
    return [torch.randn(s, generator=g, dtype=torch.float64) * a for s, a in zip(shapes, scales)]


def _run_core(fn, x, ws, dt, dy) -> list[torch.Tensor]:
    """y and the gradients of (y * dy).sum() w.r.t. x and every weight, as float64."""
    from app.model.mlstm_core import state_dtype

    leaves = [x.to(dt).clone().requires_grad_()]
    leaves += [w.to(state_dtype(dt) if i == 1 else dt).clone().requires_grad_() for i, w in enumerate(ws)]
    y = fn.apply(*leaves)
    (y.double() * dy).sum().backward()
    return [y.detach().double()] + [t.grad.double() for t in leaves]


def _run_reference(x, ws, dy) -> list[torch.Tensor]:
    from app.model.reference import naive_mlstm

    H = ws[2].shape[0]
    leaves = [t.clone().requires_grad_() for t in (x, *ws)]
    x_, w_in, bias, w_mh, w_m = leaves
    y = naive_mlstm(x_, w_in[:H], w_in[H:], bias, w_mh, w_m)
    (y * dy).sum().backward()
    return [y.detach()] + [t.grad for t in leaves]


def _errors(got, want) -> list[float]:
    """Max abs error of y, dx, d(w_in), d(bias), d(w_mh), d(w_m), each relative to the reference's max."""
    return [((g - w).abs().max() / w.abs().max().clamp_min(1e-12)).item() for g, w in zip(got, want)]


def parity() -> dict:
    """Every GPU loop (MLSTM_GPU_LOOP: step, cublas, persistent and persistent-l2 run phase by phase, the l2
    tiles' K slices of r, dh and dm with their sums) against the reference."""
    import os

    from app.model import gpu_tuning, gpu_verify
    from app.model.core import select
    from app.model.mlstm_core import MLSTMFunction
    from app.model.triton_core import TritonMLSTMFunction

    # each loop is checked before its first run per shape: short checks here (2 steps: one of them with the
    # backward's dh product)
    gpu_verify.T_CHECK = 2
    out: dict = {}
    warned: list[
        str
    ] = []  # a forced loop that failed its check or its run fell back: its parity is another's
    _keep_log("app.model.gpu_tuning", logging.WARNING, warned)
    # float64 checks the arithmetic (to 1e-12), bf16 the low-precision operands, and the float32 case over
    # several tiles (B17 H20: 2 x 2 tiles of rows and units, 2 x 5 of gate rows, K over 2 steps, the last of
    # each partial) the float32 operands, in a shape where tiles meet
    cases = {("odd", "float64"), ("odd", "bfloat16"), ("tiles", "float32")}
    for loop in gpu_tuning.LABELS:
        os.environ["MLSTM_GPU_LOOP"] = loop
        gpu_tuning._choices.clear()
        for name, (B, T, D, H) in {"odd": (3, 4, 7, 20), "tiles": (17, 3, 5, 20)}.items():
            x = torch.randn(B, T, D, dtype=torch.float64, generator=torch.Generator().manual_seed(B))
            ws = _weights(D, H, seed=H)
            dy = torch.randn(B, T, H, dtype=torch.float64, generator=torch.Generator().manual_seed(7))
            ref = _run_reference(x, ws, dy)
            for dt in (torch.float64, torch.float32, torch.bfloat16):
                if (name, str(dt)[6:]) not in cases:
                    continue
                dn = str(dt).removeprefix("torch.")
                out[f"{name}/{loop}/{dn}"] = _errors(_run_core(TritonMLSTMFunction, x, ws, dt, dy), ref)
                if dt == torch.bfloat16 and loop == "step":  # the reference core at bf16: the yardstick
                    out[f"{name}/python/{dn}"] = _errors(_run_core(MLSTMFunction, x, ws, dt, dy), ref)
        out[f"from_state/{loop}"] = _from_state()
        out[f"prefill/{loop}"] = _prefill()
        if loop != "step":
            out[f"padded/{loop}"] = _padded(TritonMLSTMFunction)
        out[f"fell_back/{loop}"] = list(warned)
        del warned[:]
    x32, w32 = torch.zeros(2, 3, 4), torch.zeros(5, 5)
    out["dispatch"] = {c: select(c, x32, w32).__name__ for c in ("auto", "fused", "python")}
    return out


def _from_state() -> list[float]:
    """From a non-zero (h_0, c_0) in float64: h and every weight gradient (the state a constant) against the
    float64 reference stepped from the same state, and c_T against the reference core's."""
    from app.model.mlstm_core import MLSTMFromState
    from app.model.reference import naive_mlstm
    from app.model.triton_core import TritonMLSTMFromState

    B, T, D, H = 4, 4, 5, 24
    g = torch.Generator().manual_seed(11)
    x = torch.randn(B, T, D, dtype=torch.float64, generator=g)
    ws = _weights(D, H, seed=13)
    h0, c0 = (
        torch.rand(B, H, dtype=torch.float64, generator=g) - 0.5,
        torch.randn(B, H, dtype=torch.float64, generator=g),
    )
    dy = torch.randn(B, T, H, dtype=torch.float64, generator=g)
    leaves = [t.clone().requires_grad_() for t in (x, *ws)]
    y, c_last = TritonMLSTMFromState.apply(*leaves, h0, c0)
    (y * dy).sum().backward()
    got = [y.detach(), c_last] + [t.grad for t in leaves[1:]]
    ref_leaves = [t.clone().requires_grad_() for t in (x, *ws)]
    x_, w_in, bias, w_mh, w_m = ref_leaves
    y_ref = naive_mlstm(x_, w_in[:H], w_in[H:], bias, w_mh, w_m, (h0, c0))
    (y_ref * dy).sum().backward()
    c_ref = MLSTMFromState.apply(x, *ws, h0, c0)[1]
    want = [y_ref.detach(), c_ref.detach()] + [t.grad for t in ref_leaves[1:]]
    return _errors(got, want)


def _prefill() -> list[float]:
    """Inference from a given state, rows of lengths 4, 2, 3: h at real positions and each row's state after
    its own length, against the reference core's prefill (float64)."""
    from app.model import mlstm_core, triton_core

    B, T, D, H = 3, 4, 6, 20
    g = torch.Generator().manual_seed(21)
    x = torch.randn(B, T, D, dtype=torch.float64, generator=g)
    w_in, bias, w_mh, w_m = _weights(D, H, seed=23)
    state = (
        torch.randn(B, H, dtype=torch.float64, generator=g),
        torch.randn(B, H, dtype=torch.float64, generator=g),
    )
    lengths = torch.tensor([4, 2, 3])
    h, (hl, cl) = triton_core.prefill(x, lengths, w_in, bias, w_mh, w_m, state)
    h_ref, (hl_ref, cl_ref) = mlstm_core.mlstm_prefill(x, lengths, w_in, bias, w_mh, w_m, state)
    real = torch.arange(T)[None, :] < lengths[:, None]
    return _errors([h[real], hl, cl], [h_ref[real], hl_ref, cl_ref])


def _padded(fn) -> list[float]:
    """A right-padded batch (lengths 4, 3, 1) in float64: outputs at real positions and the weight
    gradients of a loss over real positions equal those of each row run alone, unpadded (by the reference
    core: the loops' parity with it is checked above)."""
    from app.model.mlstm_core import MLSTMFunction

    B, T, D, H = 3, 4, 5, 18
    lengths = [4, 3, 1]
    x = torch.randn(B, T, D, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    ws = _weights(D, H, seed=5)
    dy = torch.randn(B, T, H, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    for b, n in enumerate(lengths):
        dy[b, n:] = 0.0  # pad positions carry no loss
    whole = _run_core(fn, x, ws, torch.float64, dy)
    rows = [
        _run_core(MLSTMFunction, x[b : b + 1, :n], ws, torch.float64, dy[b : b + 1, :n])
        for b, n in enumerate(lengths)
    ]
    errs = [
        max((whole[0][b, :n] - r[0][0]).abs().max().item() for b, (n, r) in enumerate(zip(lengths, rows)))
    ]
    errs.append(
        max((whole[1][b, :n] - r[1][0]).abs().max().item() for b, (n, r) in enumerate(zip(lengths, rows)))
    )
    for i in range(2, 6):  # weight gradients: the batch's = the sum of the rows'
        errs.append((whole[i] - sum(r[i] for r in rows)).abs().max().item())
    return errs


def tuning() -> dict:
    """The tuner's own logic, in the interpreter (a wall clock for CUDA events): every loop checked against the
    float64 reference and timed each way, a loop made to compute something else left out, the whole op
    compared with the reference core, the choice logged once."""
    import logging
    import os

    from app.model import gpu_ranking, gpu_tuning, gpu_verify
    from app.model.mlstm_core import MLSTMFunction
    from app.model.triton_core import TritonMLSTMFunction, run_op

    os.environ["MLSTM_GPU_LOOP"] = ""  # time them, as on a GPU
    gpu_ranking.T_TUNE, gpu_ranking.REPS, gpu_ranking.WARMUP, gpu_verify.T_CHECK = 3, 1, 0, 3
    lines: list[str] = []
    _keep_log("app.model.gpu_tuning", logging.INFO, lines)
    dev = torch.device("cpu")
    choice = gpu_tuning._tune(16, 7, 20, torch.float32, dev, True, run_op)
    out: dict = {
        "choice": choice.times,
        "checked": sorted(map(list, choice.checked)),
        "paths": [choice.op_graph, choice.wgrad_chunks],
    }
    out["ranked_line"] = [ln for ln in lines if ln.startswith("ranked the mLSTM core's GPU loops")]
    loops = gpu_tuning.candidates(16, 20, torch.float32, dev)
    times: dict = {}
    ranked = gpu_ranking.rank([loops[0], _wrong(loops[1], "negated")], 16, 7, 20, torch.float32, dev, False,
                              run_op, times)  # fmt: skip
    out["wrong"] = {"ranked": [lp.label for lp in ranked.fwd_order], "times": times}
    out["op_order"] = _ranked_by_the_op(dev, run_op)
    x, w = torch.zeros(3, 2, 7), torch.zeros(20, 20)
    out["python"] = [
        gpu_tuning.prefers_reference(x, w, True, TritonMLSTMFunction, MLSTMFunction, run_op) for _ in range(2)
    ]
    out["logged"] = len(gpu_tuning._logged)
    return out


def _keep_log(name: str, level: int, into: list) -> None:
    class Keep(logging.Handler):
        def emit(self, r):
            if r.levelno >= level:
                into.append(r.getMessage())

    logger = logging.getLogger(name)
    logger.setLevel(min(level, logger.level or level))
    logger.addHandler(Keep())


def _ranked_by_the_op(dev, run_op) -> dict:
    """The ranking follows the whole op's time, not each loop's alone: an op that costs 2 s more whenever the
    step loop runs a direction (as a loop whose launch holds the host would: injected through the op the tuner
    is handed, the math the real op's) puts it last each way, though alone it is as fast as before; the
    forwards are timed behind one backward (the first that passed: cuBLAS's), the backwards behind the fastest
    forward. Returns the rankings, the pairs timed and the op and loop-alone times."""
    import time

    from app.model import gpu_ranking, gpu_tuning

    pairs: list[list[str]] = []

    def op(choice, leaves, dy):
        pairs.append([choice.fwd.label, choice.bwd.label])
        if "step" in (choice.fwd.label, choice.bwd.label):
            time.sleep(2.0)
        run_op(choice, leaves, dy)

    loops = [
        lp
        for lp in gpu_tuning.candidates(16, 20, torch.float32, dev)
        if lp.label in ("step", "cublas", "persistent")
    ]
    t_tune, gpu_ranking.T_TUNE = gpu_ranking.T_TUNE, 1  # the interpreter's own time small beside the 2 s
    try:
        c = gpu_ranking.rank(loops, 16, 7, 20, torch.float32, dev, True, op, {})
    finally:
        gpu_ranking.T_TUNE = t_tune
    return {"fwd": [lp.label for lp in c.fwd_order], "bwd": [lp.label for lp in c.bwd_order], "pairs": pairs,
            "times": c.times}  # fmt: skip


def _wrong(loop, how: str):
    """`loop` made to hand on a wrong forward: h negated, one batch row off by 10% (a localised error: one
    tile), every output 3% off (a uniform drift), or the last, partial batch tile's rows left NaN."""

    class Wrong(type(loop)):
        name = f"wrong-{how}"

        def forward(self, b, B, T, H):
            super().forward(b, B, T, H)
            hs = b["hs"][1:]
            if how == "negated":
                hs.neg_()
            elif how == "row":
                hs[:, B // 2].mul_(1.1)
            elif how == "drift":
                for n in ("hs", "cs", "rs", "ms", "gates", "tcs"):
                    (b[n][1:] if n in ("hs", "cs") else b[n]).mul_(1.03)
            else:  # the partial tile
                hs[:, 16 * (B // 16) :] = float("nan")

    wrong = object.__new__(Wrong)
    wrong.__dict__.update(loop.__dict__)
    return wrong


def faults() -> dict:
    """Each failure path in the interpreter, on a B5 H20 shape (partial tiles both ways; the checks' batch 15 of
    the bucket's 16) in float64, forward and backward through the op, against the float64 reference: what the
    user gets, the warning lines said, and the ranking left behind."""
    import logging
    import os

    from app.common import faults as injected
    from app.model import gpu_choice_cache, gpu_health, gpu_ranking, gpu_tuning, gpu_verify

    records: list[str] = []
    _keep_log("app.model.gpu_tuning", logging.WARNING, records)
    gpu_ranking.T_TUNE, gpu_ranking.REPS, gpu_ranking.WARMUP, gpu_verify.T_CHECK = 2, 1, 0, 3
    out: dict = {}

    def case(name: str, loop: str, fault: dict | None = None, before=None, wait: bool = False) -> None:
        os.environ["MLSTM_GPU_LOOP"] = loop
        os.environ["MLSTM_BARRIER_HOST_WAIT"] = "1" if wait else "0"
        gpu_tuning._choices.clear()
        injected._FAULTS.clear()
        injected._FAULTS.update(fault or {})
        injected._seen.clear()
        if before:
            before()
        del records[:]
        errs = _op_vs_reference(5, 3, 5, 20, each=True)
        health = gpu_health.check() if gpu_health.active() else []  # where the host already waits
        choice = next(iter(gpu_tuning._choices.values()))
        out[name] = {"errors": errs if isinstance(errs, str) else _worst(errs), "each": errs,
                     "warnings": list(records), "health": health, "fwd": [lp.label for lp in choice.fwd_order],
                     "bwd": [lp.label for lp in choice.bwd_order or []], "times": choice.times,
                     "checked": sorted(map(list, choice.checked)), "again": _op_vs_reference(5, 3, 5, 20)}  # fmt: skip

    # a forced loop is checked before its first run each way (a persistent launch each): launch 2 is the
    # forward's run after its check, launch 4 the backward's. No host wait (the default): the poisoned
    # direction's outputs are NaN, the flag read afterwards drops the loop in one line, and the next run is
    # right; with the old wait the work is redone at once
    case("barrier_timeout_fwd", "persistent", {"barrier_timeout": {2}})
    case("barrier_timeout_bwd", "persistent", {"barrier_timeout": {4}})
    case("wait_barrier_timeout_fwd", "persistent", {"barrier_timeout": {2}}, wait=True)
    case("wait_barrier_timeout_bwd", "persistent", {"barrier_timeout": {4}}, wait=True)
    case("launch_error", "step", {"gpu_launch_error": {1}})
    case("every_loop_fails", "step", {"gpu_launch_error": set(range(1, 20))})
    cache = os.environ["MLSTM_CACHE_DIR"]

    def corrupt() -> None:
        os.makedirs(cache, exist_ok=True)
        with open(os.path.join(cache, "gpu_loops.json"), "w") as f:
            f.write("{not json")

    def foreign() -> None:
        _store_entry(
            {"fwd": ["warp9"], "bwd": ["persistent"], "python": False, "op_graph": False, "wgrad_chunks": 0}
        )

    case("cache_corrupt", "", before=corrupt)
    case("cache_foreign", "", before=foreign)
    # a cached ranking whose first loop is wrong here (a race on this GPU, another driver): caught by the check
    # of a cache hit, and timed afresh, where the tuner's own check leaves it out
    step_forward = gpu_tuning.StepLoop.forward

    def wrong_step(self, b, B, T, H):
        step_forward(self, b, B, T, H)
        b["hs"][1:, -1].mul_(1.5)

    def wrong_cached() -> None:
        _store_entry(
            {
                "fwd": ["step", "cublas"],
                "bwd": ["cublas"],
                "python": False,
                "op_graph": False,
                "wgrad_chunks": 0,
            }
        )
        gpu_tuning.StepLoop.forward = wrong_step

    case("cache_wrong", "", before=wrong_cached)
    gpu_tuning.StepLoop.forward = step_forward
    case("cache_good", "")  # what the last case stored, read back and checked
    _wrong_fallbacks(case, step_forward, wrong_step)
    out["cache_file"] = sorted(os.listdir(cache))
    out["cache_key"] = gpu_choice_cache.device_label("cpu")
    return out


def poison() -> dict:
    """The persistent loops' poison path, in the interpreter: each launch (forward, backward, the split
    backward) finds its barrier word's `failed` already set, as after a barrier that gave up, so every barrier
    returns at once and the kernel runs whole, its programs one after another (the interpreter's order, as on
    a GPU whose programs were not all resident). Every output starts finite (7.0); after the launch every
    element of every output is NaN (each program poisoned the tiles it owns, at every step) and the flag is
    still set. -> per loop and direction, the outputs' NaN fractions, the inputs' (row 0 of hs and cs: none),
    the programs and the tiles each phase has."""
    from app.model import gpu_loops, gpu_tuning, gpu_verify

    B, T, H = 17, 3, 20  # 2 x 2 tiles of rows x units, 2 x 5 gate tiles, a 3-way split: 3 programs each loop
    dev, dt = torch.device("cpu"), torch.float32
    out: dict = {}
    for loop in [lp for lp in gpu_tuning.candidates(B, H, dt, dev) if lp.barrier]:
        f = gpu_verify.forward_case(B, T, H, dt, dev, seed=1)
        b = gpu_verify.backward_case(f, gpu_verify.reference_forward(f), seed=1)
        for fwd, bufs, outs in ((True, f, gpu_loops.FWD_OUT), (False, b, gpu_loops.BWD_OUT)):
            if ("fwd" if fwd else "bwd") not in loop.directions:
                continue
            for n in outs:
                (bufs[n][1:] if n in gpu_loops.TIME_PLUS_ONE else bufs[n]).fill_(7.0)
            bar = torch.tensor([0, 1], dtype=torch.int32)
            gpu_loops.run(loop, fwd, {**bufs, "bar": bar}, B, T, H)
            t = loop.tiles
            out[f"{loop.label}/{'fwd' if fwd else 'bwd'}"] = {
                "nan": {n: (bufs[n][1:] if n in gpu_loops.TIME_PLUS_ONE else bufs[n]).isnan().float().mean().item()
                        for n in outs},
                "inputs_nan": [bufs[n][0].isnan().any().item() for n in ("hs", "cs") if fwd],
                "flag": bar.tolist(), "programs": loop.n_programs,
                "tiles": [t.n_r(B, H), t.n_g(B, H)] if fwd else [t.n_h(B, H), t.n_m(B, H)],
            }  # fmt: skip
    return out


def overlap() -> dict:
    """The backward with its weight-gradient products overlapped (MLSTM_WGRAD_OVERLAP=3: T = 7 in pieces of 3,
    2 and 2 steps, the dc carry and d(r) crossing their edges), each loop forced, in float64: y and every
    gradient against the float64 reference, and against the same loop without the overlap; and 7 pieces of
    one step each, and more pieces than steps."""
    import os

    from app.model import gpu_tuning

    out: dict = {}
    B, T, D, H = 5, 7, 6, 20
    x = torch.randn(B, T, D, dtype=torch.float64, generator=torch.Generator().manual_seed(31))
    ws = _weights(D, H, seed=33)
    dy = torch.randn(B, T, H, dtype=torch.float64, generator=torch.Generator().manual_seed(35))
    ref = _run_reference(x, ws, dy)
    from app.model.triton_core import TritonMLSTMFunction

    for loop in gpu_tuning.LABELS:
        os.environ["MLSTM_GPU_LOOP"] = loop
        runs = {}
        for n in ("0", "3", "7", "50"):
            os.environ["MLSTM_WGRAD_OVERLAP"] = n
            gpu_tuning._choices.clear()
            runs[n] = _run_core(TritonMLSTMFunction, x, ws, torch.float64, dy)
        out[loop] = {n: {"vs_reference": _errors(got, ref), "vs_plain": _errors(got, runs["0"])}
                     for n, got in runs.items()}  # fmt: skip
    os.environ["MLSTM_WGRAD_OVERLAP"] = "0"
    return out


class _LiveBytes:
    """Peak bytes of the tensors alive while it is entered, counted at the dispatcher (what a device's caching
    allocator hands out, here on the CPU): each operator's outputs' storages, freed when their last tensor
    goes. Tensors made before it count nothing."""

    def __init__(self) -> None:
        import weakref

        from torch.utils._python_dispatch import TorchDispatchMode

        outer = self

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                for t in torch.utils._pytree.tree_flatten(out)[0]:
                    if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr():
                        outer._hold(t, weakref)
                return out

        self.mode, self.refs, self.sizes, self.now, self.peak = Mode(), {}, {}, 0, 0

    def _hold(self, t: torch.Tensor, weakref) -> None:
        key = t.untyped_storage().data_ptr()
        if key not in self.refs:
            self.refs[key], self.sizes[key] = 0, t.untyped_storage().nbytes()
            self.now += self.sizes[key]
            self.peak = max(self.peak, self.now)
        self.refs[key] += 1
        weakref.finalize(t, self._drop, key)

    def _drop(self, key: int) -> None:
        self.refs[key] -= 1
        if not self.refs[key]:
            self.now -= self.sizes.pop(key)
            del self.refs[key]

    def __enter__(self):
        self.mode.__enter__()
        return self

    def __exit__(self, *exc):
        self.mode.__exit__(*exc)


def tuner_memory() -> dict:
    """The tuner's peak bytes at a new shape (every candidate checked against float64, then timed as the whole op
    and alone, forward and backward or forward alone; T_TUNE 12, T_CHECK 3, in the interpreter: no CUDA graphs),
    counted at the dispatcher, beside app/model/first_call.tuner_bytes's count of the same (graphs off, no timing
    against the reference core)."""
    from app.model import first_call, gpu_loops, gpu_ranking, gpu_tuning, gpu_verify
    from app.model.triton_core import run_op

    gpu_ranking.T_TUNE, gpu_ranking.REPS, gpu_ranking.WARMUP, gpu_verify.T_CHECK = 12, 1, 0, 3
    os.environ["MLSTM_GPU_LOOP"] = ""
    out: dict = {}
    D = 8
    for B, H, dtype in ((32, 24, torch.float32), (16, 40, torch.float64)):
        for backward in (False, True):
            gc.collect()
            with _LiveBytes() as live:
                gpu_tuning._tune(B, D, H, dtype, torch.device("cpu"), backward, run_op)
                gpu_loops.clear_graphs()
            s = torch.finfo(dtype).bits // 8
            want = first_call.tuner_bytes(
                B, H, D, s, backward, False, gpu_ranking.T_TUNE, gpu_verify.T_CHECK, op=False
            )
            key = f"B{B} H{H} {str(dtype)[6:]} {'fwd+bwd' if backward else 'fwd'}"
            out[key] = {"peak": live.peak, "count": want}
    return out


def op_graph() -> dict:
    """The op's paths without a GPU (Triton's interpreter has no CUDA graphs): the tuner says why the graphs do
    not run and times the overlapped weight gradients beside the plain op; a cached ranking with graphs checks
    them at the hit and runs plain, in one line, one with the overlap checks it and keeps it; the check of a
    graph's replay (gpu_verify.check_op) passes an op whose graph path is right and fails one that replays the
    capture's inputs or hands on outputs a later replay rewrites; op_graph.call_bytes against the op's own
    tensors each way."""
    from dataclasses import replace

    from app.model import gpu_ranking, gpu_tuning, gpu_verify, op_graph, triton_core, wgrad_overlap

    gpu_ranking.T_TUNE, gpu_ranking.REPS, gpu_ranking.WARMUP, gpu_verify.T_CHECK = 3, 1, 0, 3
    lines: list[str] = []
    _keep_log("app.model.gpu_tuning", logging.INFO, lines)
    dev, f64 = torch.device("cpu"), torch.float64
    choice = gpu_tuning._forced(16, 20, f64, dev)  # MLSTM_GPU_LOOP's (persistent), untimed
    gpu_ranking.rank_paths(choice, 16, 7, 20, f64, dev, triton_core.run_op)
    out: dict = {
        "tuned": [choice.op_graph, choice.wgrad_chunks, choice.times, gpu_ranking.path_words(choice)]
    }
    out["check_op"] = {kind: gpu_verify.check_op(_emulated(kind), replace(choice, op_graph=True), 16, 7, 20, f64,
                                                 dev) for kind in ("right", "stale", "uncloned")}  # fmt: skip
    del lines[:]
    out["cache_hit"] = {}
    products = wgrad_overlap._products

    def wrong_products(grads, *args):  # an overlap that sums d(w_m) wrong (a race on a GPU, a bad driver)
        products(grads, *args)
        grads["w_m"].mul_(1.5)

    for name, graph, chunks in (("graph", True, None), ("overlap", False, 4), ("overlap_wrong", False, 4)):
        del lines[:]
        _store_entry({"fwd": ["persistent"], "bwd": ["persistent"], "python": False, "op_graph": graph,
                      "wgrad_chunks": chunks})  # fmt: skip
        wgrad_overlap._products = wrong_products if name == "overlap_wrong" else products
        hit = gpu_tuning._cached(16, 20, f64, dev, True, triton_core.run_op)
        out["cache_hit"][name] = [hit.op_graph, hit.wgrad_chunks, [ln for ln in lines if "path" in ln]]
    wgrad_overlap._products = products
    # a ranking cached without the shape's own path (a forward-only one's, or the environment chose it): the
    # paths are measured at the hit, and stored
    _store_entry({"fwd": ["persistent"], "bwd": ["persistent"], "python": False, "op_graph": None,
                  "wgrad_chunks": None})  # fmt: skip
    gpu_tuning._choices.clear()
    os.environ["MLSTM_GPU_LOOP"] = ""  # the tuner's own choice, not the interpreter's default forced loop
    hit = gpu_tuning.loops_for(torch.zeros(16, 2, 7, dtype=f64), torch.zeros(20, 20, dtype=f64), True,
                               triton_core.run_op)  # fmt: skip
    from app.model import gpu_choice_cache

    stored = gpu_choice_cache.load(16, 20, f64, "cpu", gpu_tuning._code_files())
    out["cache_unranked"] = [sorted(k for k in hit.times if k.startswith("path/")), stored["op_graph"],
                             stored["wgrad_chunks"] == hit.wgrad_chunks]  # fmt: skip
    out["cache_old"] = []
    for entry in ({"op_graph": None}, {"op_graph": False, "wgrad_chunks": "4"}):  # from before; a foreign one
        _store_entry({"fwd": ["persistent"], "bwd": ["persistent"], "python": False, **entry})
        out["cache_old"].append(gpu_tuning._cached(16, 20, f64, dev, True, triton_core.run_op) is None)
    out["bytes"] = {}
    for dt, (B, T, D, H) in ((torch.float32, (5, 4, 7, 12)), (torch.bfloat16, (3, 6, 16, 8))):
        leaves, dy = gpu_verify.op_case(B, T, D, H, dt, dev, True, seed=0)
        fwd = triton_core._fwd_outputs(choice, *leaves)
        _, _, kept = triton_core._run_forward(choice, leaves, (), grad=True)
        bwd = triton_core._grad_outputs(choice, True, dy, *kept)
        counted = [op_graph.nbytes([*leaves, *fwd]), op_graph.nbytes([dy, *kept, *bwd])]
        out["bytes"][str(dt)] = [counted, op_graph.call_bytes(B * T, D, H, dt.itemsize)]
    return out


def _emulated(kind: str):
    """The op with its graph path played by the eager op: as it should be ("right"), replaying the inputs of
    the call that captured ("stale"), or handing on the same output tensors each call ("uncloned")."""
    from dataclasses import replace

    from app.model.triton_core import run_op

    calls: list = []

    def op(choice, leaves, dy):
        plain = replace(choice, op_graph=False)
        if not choice.op_graph:
            return run_op(plain, leaves, dy)
        calls.append((leaves, dy))
        if kind == "stale":
            return run_op(plain, *calls[min(1, len(calls) - 1)])
        h, grads = run_op(plain, leaves, dy)
        if kind == "uncloned" and len(calls) > 1:
            if len(calls) == 2:
                op.static = (h, grads)
            else:
                for a, b in zip([op.static[0], *op.static[1]], [h, *grads]):
                    a.copy_(b)
            return op.static
        return h, grads

    return op


def _wrong_fallbacks(case, step_forward, wrong_step) -> None:
    """A forced loop that is wrong here, and the first loop it falls back to too: each is checked before its
    first run, the user gets the third loop's right result, one line each. A cached ranking whose first loop
    is right and whose fallback is wrong: every loop in it is checked at the hit, the wrong one dropped (one
    line), no timing afresh."""
    from app.model import gpu_tuning

    cublas_forward = gpu_tuning.CublasLoop.forward

    def wrong_cublas(self, b, B, T, H):
        cublas_forward(self, b, B, T, H)
        b["hs"][1:, 0].mul_(0.5)

    gpu_tuning.StepLoop.forward, gpu_tuning.CublasLoop.forward = wrong_step, wrong_cublas
    try:
        case("forced_wrong", "step")
        gpu_tuning.StepLoop.forward = step_forward
        fallback = {
            "fwd": ["persistent", "cublas", "step"],
            "bwd": ["persistent", "cublas"],
            "python": False,
            "op_graph": False,
            "wgrad_chunks": 0,
        }
        case("cache_fallback_wrong", "", before=lambda: _store_entry(fallback))
    finally:
        gpu_tuning.StepLoop.forward, gpu_tuning.CublasLoop.forward = step_forward, cublas_forward


def _store_entry(entry: dict) -> None:
    from app.model import gpu_choice_cache, gpu_tuning

    gpu_choice_cache.store(16, 20, torch.float64, "cpu", gpu_tuning._code_files(), entry)


def _op_vs_reference(B: int, T: int, D: int, H: int, each: bool = False):
    """The op's y and gradients in float64 against the reference (the worst, or `each`: y, dx, d(w_in),
    d(bias), d(w_mh), d(w_m)), or the error it raised (one line)."""
    from app.model.triton_core import TritonMLSTMFunction

    x = torch.randn(B, T, D, dtype=torch.float64, generator=torch.Generator().manual_seed(B))
    ws = _weights(D, H, seed=H)
    dy = torch.randn(B, T, H, dtype=torch.float64, generator=torch.Generator().manual_seed(7))
    try:
        got = _run_core(TritonMLSTMFunction, x, ws, torch.float64, dy)
    except Exception as e:
        return f"{type(e).__name__}: {str(e).splitlines()[0]}"
    errs = _errors(got, _run_reference(x, ws, dy))
    return errs if each else _worst(errs)


def _worst(errs: list[float]) -> float:
    """The largest error; NaN where any is NaN (Python's max may pass over one)."""
    return float("nan") if any(e != e for e in errs) else max(errs)


CHECKS = {"parity": parity, "tuning": tuning, "faults": faults, "poison": poison, "overlap": overlap,
          "tuner_memory": tuner_memory, "op_graph": op_graph}  # fmt: skip

if __name__ == "__main__":
    print(json.dumps(CHECKS[sys.argv[1]]()))
