"""Run in a subprocess by tests/test_model_triton_core.py: the Triton core checked with no GPU.

`python tests/triton_checks.py parity`  (with TRITON_INTERPRET=1, which must be set before any
@triton.jit module is imported, hence a process of its own): the Triton core's forward and every gradient
against the float64 reference (app/model/reference.py, autograd through a per-step Python loop) at tiny odd
shapes, in float64, float32 and bfloat16 (the bf16 Python core's own error beside it), a multi-tile shape, a
right-padded batch against its rows run alone, and the dispatcher's choice. Prints one JSON object.

`python tests/triton_checks.py compile`: Triton's real compiler builds every kernel for sm_90 (H100) in
bf16 and fp32 with no GPU present; prints one JSON object (kernel -> cubin bytes), or {"skip": why}.
"""

from __future__ import annotations

import json
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
    """Every GPU loop (MLSTM_GPU_LOOP: step, cublas, persistent run phase by phase) against the reference."""
    import os

    from app.model import gpu_tuning
    from app.model.core import select
    from app.model.mlstm_core import MLSTMFunction
    from app.model.triton_core import TritonMLSTMFunction

    out: dict = {}
    # float64 checks the arithmetic (to 1e-12), bf16 the low-precision operands, and the float32 case over
    # several tiles (B17 H20: 2 x 2 tiles of rows and units, 2 x 5 of gate rows, K over 2 steps, the last of
    # each partial) the float32 operands, in a shape where tiles meet
    cases = {("odd", "float64"), ("odd", "bfloat16"), ("tiles", "float32")}
    for loop in gpu_tuning.LOOPS:
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


def compile_sm90() -> dict:
    """Both kernels, every way they run (a phase of a step with the product in it or read back from cuBLAS;
    the persistent loop; the backward split over K), built by Triton's real compiler for an H100 with the
    tiles the tuner picks for B64 H1024, in bf16 and fp32, with the argument divisibility the JIT specialises
    on. Per build: cubin bytes, whether its K loop was software-pipelined (asynchronous copies) and whether
    it uses Hopper's warpgroup MMA."""
    import triton

    from app.model import triton_kernels as k
    from app.model.gpu_tuning import split_tiles, tiles_for

    out = {}
    for dt, ty, torch_dt in (("bf16", "*bf16", torch.bfloat16), ("fp32", "*fp32", torch.float32)):
        base = tiles_for(64, 1024, torch_dt, sms=132, weights_in_l2=True)
        split = split_tiles(base, 64, 1024, sms=132)
        builds = [(kern, base, p, s, d, "dot" if d else "cublas") for kern in (k.mlstm_fwd, k.mlstm_bwd)
                  for p, s, d in _WAYS]  # fmt: skip
        builds += [(k.mlstm_bwd, split, p, s, True, "splitk") for p, s in ((2, False), (3, False), (0, True))]
        for kern, t, phase, sync, dot, way in builds:
            if kern is k.mlstm_fwd:
                tiles = dict(BB_R=t.bb_r, BU_R=t.bu_r, BB_G=t.bb_g, BU_G=t.bu_g)
            else:
                tiles = dict(zip(("BB_H", "BU_H", "BB_M", "BU_M"), t.bwd()), SPLIT=t.split)
            c = dict(PHASE=phase, SYNC=sync, USE_DOT=dot, BK=t.bk, UPCAST=False, ACC=triton.language.float32,
                     PREC="ieee", CACHE=".cg" if sync else "", MAX_SPIN=1 << 22, **tiles)  # fmt: skip
            ttgir, cubin = _build(kern, c, ty, t)
            out[f"{kern.__name__}/phase{phase}/{way}/{dt}"] = {
                "cubin": len(cubin),
                "pipelined": "async_copy_global_to_local" in ttgir,
                "wgmma": "warp_group_dot" in ttgir,
            }
    return out


def _build(kern, consts: dict, ty: str, tiles) -> tuple[str, bytes]:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    sig = {n: "constexpr" if n in consts else ty if n in _OPERANDS else "*fp32" if n in _STATE else
           "*i32" if n == "bar" else "i32" for n in kern.arg_names}  # fmt: skip
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(kern.arg_names)
             if sig[n].startswith("*") or n == "H"}  # fmt: skip
    src = ASTSource(fn=kern, signature=sig, constexprs=consts, attrs=attrs)
    opts = dict(num_warps=tiles.warps, num_stages=tiles.stages, enable_fp_fusion=True)
    cc = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=opts)
    return cc.asm["ttgir"], cc.asm["cubin"]


_WAYS = ((1, False, True), (2, False, True), (0, True, True), (1, False, False), (2, False, False))


def tuning() -> dict:
    """The tuner's own logic, in the interpreter (a wall clock for CUDA events): every loop timed each way,
    their outputs checked against the cuBLAS loop's, a loop made to compute something else left out, the
    whole op compared with the reference core, the choice logged once."""
    import logging
    import os

    from app.model import gpu_loops, gpu_tuning
    from app.model.mlstm_core import MLSTMFunction
    from app.model.triton_core import TritonMLSTMFunction

    os.environ["MLSTM_GPU_LOOP"] = ""  # time them, as on a GPU
    gpu_tuning.T_TUNE, gpu_tuning.REPS, gpu_tuning.WARMUP = 3, 1, 0
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    dev = torch.device("cpu")
    out: dict = {"choice": gpu_tuning._tune(3, 20, torch.float32, dev, backward=True).times}

    class Wrong(gpu_loops.StepLoop):  # a loop that runs, fast, and gets the state wrong
        name = "wrong"

        def forward(self, b, B, T, H):
            super().forward(b, B, T, H)
            b["hs"][1:].neg_()

    loops = gpu_tuning.candidates(3, 20, torch.float32, dev)
    wrong = Wrong(loops[1].tiles)
    times: dict = {}
    bufs = gpu_tuning._tuning_buffers(3, 20, torch.float32, dev)
    picked = gpu_tuning._fastest([loops[0], wrong], True, bufs, 3, 20, times)
    out["wrong"] = {"picked": picked.name, "times": times}
    x, w = torch.zeros(3, 2, 7), torch.zeros(20, 20)
    out["python"] = [
        gpu_tuning.prefers_reference(x, w, True, TritonMLSTMFunction, MLSTMFunction) for _ in range(2)
    ]
    out["logged"] = len(gpu_tuning._logged)
    return out


_OPERANDS = {"hs", "w_mh", "w_m", "ms", "prod_r", "prod_g", "dr", "w_mh_t", "w_m_t", "dp", "prod_h", "prod_m"}
_STATE = {"cs", "pm", "pg", "rs", "gates", "tcs", "dy", "dc", "part"}


if __name__ == "__main__":
    if sys.argv[1] == "parity":
        print(json.dumps(parity()))
    elif sys.argv[1] == "tuning":
        print(json.dumps(tuning()))
    else:
        try:
            import triton.compiler  # noqa: F401
        except ImportError as e:
            print(json.dumps({"skip": f"triton is not installed: {e}"}))
            sys.exit(0)
        print(json.dumps(compile_sm90()))
