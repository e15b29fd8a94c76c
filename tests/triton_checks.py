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
    from app.model.core import select
    from app.model.mlstm_core import MLSTMFunction
    from app.model.triton_core import TritonMLSTMFunction

    out: dict = {}
    for name, (B, T, D, H) in {"odd": (3, 5, 7, 20), "tiles": (37, 3, 5, 40)}.items():
        x = torch.randn(B, T, D, dtype=torch.float64, generator=torch.Generator().manual_seed(B))
        ws = _weights(D, H, seed=H)
        dy = torch.randn(B, T, H, dtype=torch.float64, generator=torch.Generator().manual_seed(7))
        ref = _run_reference(x, ws, dy)
        dtypes = (torch.float64, torch.float32, torch.bfloat16) if name == "odd" else (torch.float32,)
        for dt in dtypes:
            dn = str(dt).removeprefix("torch.")
            out[f"{name}/triton/{dn}"] = _errors(_run_core(TritonMLSTMFunction, x, ws, dt, dy), ref)
            if dt == torch.bfloat16:  # the reference core at the same precision: the bf16 yardstick
                out[f"{name}/python/{dn}"] = _errors(_run_core(MLSTMFunction, x, ws, dt, dy), ref)
    out["padded"] = _padded(TritonMLSTMFunction)
    x32, w32 = torch.zeros(2, 3, 4), torch.zeros(5, 5)
    out["dispatch"] = {c: select(c, x32, w32).__name__ for c in ("auto", "fused", "python")}
    return out


def _padded(fn) -> list[float]:
    """A right-padded batch (lengths 6, 4, 1) in float64: outputs at real positions and the weight
    gradients of a loss over real positions equal those of each row run alone, unpadded."""
    B, T, D, H = 3, 6, 5, 18
    lengths = [6, 4, 1]
    x = torch.randn(B, T, D, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    ws = _weights(D, H, seed=5)
    dy = torch.randn(B, T, H, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    for b, n in enumerate(lengths):
        dy[b, n:] = 0.0  # pad positions carry no loss
    whole = _run_core(fn, x, ws, torch.float64, dy)
    rows = [
        _run_core(fn, x[b : b + 1, :n], ws, torch.float64, dy[b : b + 1, :n]) for b, n in enumerate(lengths)
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
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from app.model import triton_kernels as k

    tl = triton.language
    target = GPUTarget("cuda", 90, 32)
    out = {}
    for dt, ty in (("bf16", "*bf16"), ("fp32", "*fp32")):
        consts = dict(BM=16, BN=64, BK=32, UPCAST=False, ACC=tl.float32, PREC="ieee")
        for kern, ptrs, ints in (
            (k.fwd_r, {"h_ptr": ty, "w_mh_ptr": ty, "pm_ptr": "*fp32", "r_ptr": "*fp32", "m_ptr": ty}, 3),
            (k.fwd_gates, {"m_ptr": ty, "w_m_ptr": ty, "pg_ptr": "*fp32", "gates_ptr": "*fp32",
                           "cs_ptr": "*fp32", "tcs_ptr": "*fp32", "hs_ptr": ty}, 4),
            (k.bwd_m, {"dp_ptr": ty, "w_m_ptr": ty, "rs_ptr": "*fp32", "pm_ptr": "*fp32", "dr_ptr": ty}, 3),
            (k.bwd_h, {"dr_ptr": ty, "w_mh_ptr": ty, "dy_ptr": "*fp32", "gates_ptr": "*fp32",
                       "cs_ptr": "*fp32", "tcs_ptr": "*fp32", "dc_ptr": "*fp32", "dp_ptr": ty}, 3),
        ):  # fmt: skip
            names = kern.arg_names
            c = dict(consts, **({"WITH_DOT": True} if "WITH_DOT" in names else {}))
            sig = {n: ptrs.get(n) or ("constexpr" if n in c else "i32") for n in names}
            assert sum(v == "i32" for v in sig.values()) == ints, (kern.__name__, sig)
            compiled = triton.compile(ASTSource(fn=kern, signature=sig, constexprs=c), target=target)
            out[f"{kern.__name__}/{dt}"] = len(compiled.asm["cubin"])
    return out


if __name__ == "__main__":
    if sys.argv[1] == "parity":
        print(json.dumps(parity()))
    else:
        try:
            import triton.compiler  # noqa: F401
        except ImportError as e:
            print(json.dumps({"skip": f"triton is not installed: {e}"}))
            sys.exit(0)
        print(json.dumps(compile_sm90()))
