"""A GPU loop's outputs checked against the float64 reference, element by element, on fresh inputs.

The reference is the one home of the cell math (`mlstm_core.forward_loop` / `backward_loop`) run in float64 on
the very inputs the loop gets (its own operands upcast). A loop passes when every output's worst element is
within `tolerance(dtype)` of the reference, on the scale of that output: max |out - ref| / (max |ref| + tiny).
So a localised error (one tile, one row) or a uniform drift of a few percent fails in bf16, where a norm over
everything would have let them through. The check's batch is one row short of the bucket the tiles were made
for, so the last batch tile is partial, as a length bucket's last micro-batch is; the initial state is not
zero (a carried state, prefill); every output is NaN before the loop runs (an unwritten element fails).

Used by the tuner (app/model/gpu_ranking.py) on every candidate before it is timed, on every loop of a choice
read from the disk cache before it is trusted, and (app/model/gpu_tuning.run) on a forced loop and any fallback
before their first run. The check runs the path training runs: the CUDA-graph replay where one is used.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from app.model import gpu_loops
from app.model.mlstm_core import MLSTMFunction, backward_loop, forward_loop, state_dtype

T_CHECK = 16  # steps: the error does not grow with T (the cell contracts); a race shows at any length
# Worst element over the output's largest, by operand precision. The reference core itself, measured against
# float64 on the check's inputs (B 15/63, H 256/1024, T 16/64): bf16 5.8e-3 (0.74 eps), fp16 6.5e-4 (0.66 eps),
# fp32 1.3e-6 (11 eps, its products' K = H sums). Two eps for the 16-bit ones (and tf32, 10 mantissa bits as
# fp16): a loop as accurate as the reference passes, a 3% drift or a wrong tile does not.
_EPS = {torch.bfloat16: 2.0**-7, torch.float16: 2.0**-10, torch.float32: 2.0**-23, torch.float64: 2.0**-52}


def tolerance(dtype: torch.dtype) -> float:
    if dtype == torch.float32 and torch.backends.cuda.matmul.allow_tf32 and not gpu_loops.interpreting():
        return 2 * 2.0**-10  # tf32 products
    if dtype in (torch.bfloat16, torch.float16):
        return 2 * _EPS[dtype]
    return max(64 * _EPS[dtype], 1e-12)  # fp32 / fp64: the products' K-long sums (sqrt(4096) = 64 roundings)


def check_rows(bucket: int) -> int:
    """The check's batch: one row short of the bucket, so the last batch tile is partial."""
    return max(1, bucket - 1)


def _randn(g: torch.Generator, *shape, scale: float = 1.0, dtype: torch.dtype, device) -> torch.Tensor:
    return (torch.randn(*shape, generator=g, device=device, dtype=torch.float64) * scale).to(dtype)


def forward_case(B: int, T: int, H: int, dtype: torch.dtype, device, seed: int) -> dict:
    """A forward loop's buffers (gpu_loops' names) at the scale training sees (weights ~ H^-1/2), from a
    non-zero state, every output NaN."""
    g = torch.Generator(device=device).manual_seed(seed)
    sdt = state_dtype(dtype)
    hs = torch.full((T + 1, B, H), float("nan"), dtype=dtype, device=device)
    cs = torch.full((T + 1, B, H), float("nan"), dtype=sdt, device=device)
    hs[0] = (torch.rand(B, H, generator=g, device=device, dtype=torch.float64) - 0.5).to(dtype)
    cs[0] = _randn(g, B, H, dtype=sdt, device=device)
    nan = dict(dtype=sdt, device=device)
    return dict(
        w_mh=_randn(g, H, H, scale=H**-0.5, dtype=dtype, device=device),
        w_m=_randn(g, 4 * H, H, scale=H**-0.5, dtype=dtype, device=device),
        pm=_randn(g, T, B, H, dtype=sdt, device=device),
        pg=_randn(g, T, B, 4 * H, dtype=sdt, device=device),
        hs=hs, cs=cs, rs=torch.full((T, B, H), float("nan"), **nan),
        ms=torch.full((T, B, H), float("nan"), dtype=dtype, device=device),
        gates=torch.full((T, B, 4 * H), float("nan"), **nan), tcs=torch.full((T, B, H), float("nan"), **nan),
    )  # fmt: skip


def reference_forward(b: dict) -> dict:
    """The forward outputs in float64 from the loop's own inputs (upcast)."""
    d = torch.float64
    state = (b["hs"][0].to(d), b["cs"][0].to(d))
    gates, cs, tcs, rs, ms, hs = forward_loop(b["pm"].to(d), b["pg"].to(d), b["w_mh"].to(d), b["w_m"].to(d),
                                              state, d)  # fmt: skip
    return dict(hs=hs, cs=cs, rs=rs, ms=ms, gates=gates, tcs=tcs)


def backward_case(fwd: dict, ref: dict, seed: int) -> dict:
    """A backward loop's buffers: the forward's inputs and the reference forward's outputs in the loop's
    dtypes, a fresh dy, every output NaN."""
    w_mh, w_m = fwd["w_mh"], fwd["w_m"]
    T, B, H = fwd["pm"].shape
    dtype, sdt, dev = w_mh.dtype, fwd["pm"].dtype, w_mh.device
    g = torch.Generator(device=dev).manual_seed(seed + 1)
    nan = dict(dtype=dtype, device=dev)
    return dict(
        w_mh_t=w_mh.t().contiguous(), w_m_t=w_m.t().contiguous(), pm=fwd["pm"],
        dy=_randn(g, T, B, H, dtype=sdt, device=dev),
        gates=ref["gates"].to(sdt), cs=ref["cs"].to(sdt), tcs=ref["tcs"].to(sdt), rs=ref["rs"].to(sdt),
        dp=torch.full((T, B, 5 * H), float("nan"), **nan), dr=torch.full((T, B, H), float("nan"), **nan),
        dc=torch.zeros(B, H, dtype=sdt, device=dev),
    )  # fmt: skip


def reference_backward(b: dict) -> dict:
    """The backward outputs in float64: dp's two parts apart (d(pm), the gate gradients: other scales), dr."""
    d = torch.float64
    dG, dPm, dR = backward_loop(b["dy"].to(d), b["w_mh_t"].t().to(d), b["w_m_t"].t().to(d), b["pm"].to(d),
                                b["gates"].to(d), b["cs"].to(d), b["tcs"].to(d), b["rs"].to(d), d)  # fmt: skip
    return {"dp[d(pm)]": dPm, "dp[dG]": dG, "dr": dR}


def _output(bufs: dict, name: str) -> torch.Tensor:
    """The loop's output `name` (a reference's key) as the reference holds it."""
    if name.startswith("dp["):
        H = bufs["dr"].shape[-1]
        return bufs["dp"][..., :H] if name == "dp[d(pm)]" else bufs["dp"][..., H:]
    return bufs[name][1:] if name in gpu_loops.TIME_PLUS_ONE else bufs[name]


def mismatch(bufs: dict, ref: dict, tol: float) -> str | None:
    """Why the loop's outputs in `bufs` are not the reference's (the worst output, its error), or None."""
    for n, want in ref.items():
        got = _output(bufs, n)
        want = want[1:] if n in gpu_loops.TIME_PLUS_ONE else want
        err = ((got.to(torch.float64) - want).abs().max() / (want.abs().max() + 1e-30)).item()
        if not err <= tol:  # NaN (an element never written) fails too
            return f"{n} differs from the float64 reference by {err:.1e} of its largest value (tolerance {tol:.1e})"
    return None


def check(
    loop: gpu_loops.Loop, fwd: bool, B: int, H: int, dtype: torch.dtype, device, seed: int = 0
) -> str | None:
    """Run `loop` (one direction) on a fresh check case of B rows; why it is wrong, or None. A loop that
    raises propagates (the caller leaves it out with why). It runs on the path training runs: where
    gpu_loops.run replays a CUDA graph of the loop (its second call of a length on), a first call on a copy of
    the case runs it eagerly, and the checked call captures the graph and replays it (the arena's copies in and
    out included); the check's arena is then dropped."""
    f = forward_case(B, T_CHECK, H, dtype, device, seed)
    ref = reference_forward(f)
    case = f if fwd else backward_case(f, ref, seed)
    want = ref if fwd else reference_backward(case)
    w = case["w_mh" if fwd else "w_mh_t"]
    replays = gpu_loops.replayed(loop, w)
    try:
        if replays:  # the eager first call (on a copy: the checked call starts from NaN outputs)
            gpu_loops.run(loop, fwd, {n: v.clone() for n, v in case.items()}, B, T_CHECK, H)
        gpu_loops.run(loop, fwd, case, B, T_CHECK, H)
    finally:
        if replays:
            gpu_loops.forget(loop, fwd, B, H, w)
    return mismatch(case, want, tolerance(dtype))


# ---- the whole op (triton_core.run_op), through its CUDA graphs where it runs them (app/model/op_graph.py)

OP_OUTPUTS = ("h", "dx", "d(w_in)", "d(bias)", "d(w_mh)", "d(w_m)")


def trial(choice, **paths):
    """A copy of a shape's choice (gpu_ranking.Choice) with its own rankings and checks, `paths` (op_graph,
    wgrad_chunks) set: what fails in a trial (a check, a timing) leaves the shape's ranking as it is."""
    bwd = None if choice.bwd_order is None else list(choice.bwd_order)
    return replace(choice, fwd_order=list(choice.fwd_order), bwd_order=bwd, checked=set(choice.checked), times={},
                   **paths)  # fmt: skip


def op_case(
    B: int, T: int, D: int, H: int, dtype: torch.dtype, device, backward: bool, seed: int
) -> tuple[list, torch.Tensor | None]:
    """The op's leaves (x, w_in, bias, w_mh, w_m) at B rows and T steps, at the scale training sees, and a dy
    (None for a forward alone)."""
    g = torch.Generator(device=device).manual_seed(seed)
    sdt = state_dtype(dtype)
    shapes = [((B, T, D), 1.0, dtype), ((5 * H, D), D**-0.5, dtype), ((4 * H,), 0.1, sdt),
              ((H, H), H**-0.5, dtype), ((4 * H, H), H**-0.5, dtype)]  # fmt: skip
    leaves = [(torch.randn(s, generator=g, device=device) * a).to(dt) for s, a, dt in shapes]
    dy = torch.randn(B, T, H, generator=g, device=device).to(dtype) if backward else None
    return leaves, dy


def reference_op(leaves: list, dy: torch.Tensor) -> list[torch.Tensor]:
    """h and the gradients (OP_OUTPUTS' order) of the reference core in float64 on the op's own inputs."""
    up = [t.detach().to(torch.float64).requires_grad_() for t in leaves]
    with torch.enable_grad():
        h = MLSTMFunction.apply(*up)
        h.backward(dy.to(torch.float64))
    return [h.detach(), *(t.grad for t in up)]


def _relative(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.to(torch.float64) - want).abs().max() / (want.abs().max() + 1e-30)).item()


def check_op(op, choice, B: int, D: int, H: int, dtype: torch.dtype, device) -> str | None:
    """Why the whole op `op` (triton_core.run_op) on `choice`'s path is wrong, or None: run on three fresh cases
    of check_rows(B) rows in turn (through the op's graphs: an eager first call, a capture, a replay; or with
    its weight gradients overlapped), then the second and third calls' h and gradients, each against the
    float64 reference core on its own case, within twice the error of the plain op (no graphs, no overlap) on
    that case (or `tolerance`). So a graph that replays a stale
    input fails (the third call), and so does one that hands on an output a later replay rewrites (the second
    call's, read after the third). It runs the op from a zero state with dx asked for (run_op): the carried
    state's forward and a backward without dx run the same code with two inputs more or one output fewer, and
    are checked on a GPU by the `gpu` tests only. What the op raises propagates."""
    cases = [op_case(check_rows(B), T_CHECK, D, H, dtype, device, True, seed) for seed in (11, 12, 13)]
    outs = [op(choice, leaves, dy) for leaves, dy in cases]
    for call in (1, 2):
        eager = op(trial(choice, op_graph=False, wgrad_chunks=0), *cases[call])
        want = reference_op(*cases[call])
        flat = lambda out: [out[0], *out[1]]  # noqa: E731
        for name, g, e, w in zip(OP_OUTPUTS, flat(outs[call]), flat(eager), want):
            err, base = _relative(g, w), _relative(e, w)
            if not err <= max(2 * base, tolerance(dtype)):  # NaN fails too
                return (f"{name} of call {call + 1} differs from the float64 reference by {err:.1e} of its "
                        f"largest value, {base:.1e} on the plain op")  # fmt: skip
    return None
