"""The fused (C++) mLSTM core: parity with the float64 equations, with the Python core, and fallback.

The extension is JIT-built on first use (tens of seconds once per machine, cached per user).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from app.model import fused_core, matmul
from app.model.config import ModelConfig, debug_config
from app.model.core import mlstm_prefill, mlstm_sequence, mlstm_sequence_from
from app.model.fused_core import fused_ops
from app.model.reference import naive_mlstm
from app.parallel.pipeline import build_sequential

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module", autouse=True)
def built():
    if fused_ops() is None:  # a compiler is part of the supported setup: not building is a failure
        pytest.fail("the fused core did not build (see the warning above)")


def inputs(B, T, D, H, seed):
    """Fresh random x (B, T, D) and (w_in, bias, w_mh, w_m) in float64, weights at 1.5x the usual
    1/sqrt(fan_in) init scale so gates saturate in places and all derivative terms matter."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, T, D, generator=g, dtype=torch.float64)
    shapes = [(5 * H, D), (4 * H,), (H, H), (4 * H, H)]
    ws = [torch.randn(s, generator=g, dtype=torch.float64) * 1.5 / s[-1] ** 0.5 for s in shapes]
    return x, ws


def run(core, x, ws, gy, cdt, state=None):
    """h and the gradients of <h, gy> w.r.t. every input, operands cast to cdt (bias stays fp32/fp64);
    from `state` (h_0, c_0), a constant, where given (h_0 rounded to cdt, c_0 to the state dtype)."""
    sdt = torch.float64 if cdt == torch.float64 else torch.float32
    dts = [cdt, cdt, sdt, cdt, cdt]
    leaves = [t.to(dt, copy=True).requires_grad_() for t, dt in zip([x, *ws], dts, strict=True)]
    if core == "reference":  # the equations, float64 autograd, on the same (rounded) operands
        d = [t.detach().double().requires_grad_() for t in leaves]
        H = ws[2].shape[0]
        s0 = None if state is None else (state[0].to(cdt).double(), state[1].to(sdt).double())
        y = naive_mlstm(d[0], d[1][:H], d[1][H:], d[2], d[3], d[4], state=s0)
        leaves = d
    elif state is None:
        y = mlstm_sequence(*leaves, core=core)
    else:
        y, _ = mlstm_sequence_from(leaves[0], state, *leaves[1:], core=core)
    y.backward(gy.to(y.dtype))
    return [y.detach().double()] + [t.grad.double() for t in leaves]


# B=1, T=1, H not a multiple of 8/16 (vector tails), D != H, and one size past the parallel threshold.
SHAPES = [(1, 1, 3, 5), (1, 9, 7, 13), (4, 1, 16, 24), (3, 6, 20, 17), (5, 11, 33, 40), (8, 4, 24, 520)]
NAMES = ["h", "dx", "dw_in", "dbias", "dw_mh", "dw_m"]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "B{}T{}D{}H{}".format(*s))
def test_fused_matches_float64_equations(shape):
    B, T, D, H = shape
    x, ws = inputs(B, T, D, H, seed=sum(shape))
    gy = torch.randn(B, T, H, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    ref = run("reference", x, ws, gy, torch.float64)
    # float64 operands: same math as the equations, only summation order differs (~1e-16 per op,
    # amplified by the backward recurrence): 1e-10 relative to the largest entry is far above that and
    # far below any formula error.
    for name, a, b in zip(NAMES, run("fused", x, ws, gy, torch.float64), ref, strict=True):
        tol = 1e-10 * max(1.0, b.abs().max().item())
        torch.testing.assert_close(a, b, rtol=1e-10, atol=tol, msg=lambda m, n=name: f"fp64 {n}: {m}")
    # float32: eps 1.2e-7; products sum K <= 5H terms and the recurrence compounds errors over T <= 11
    # steps (measured: up to ~1e-5 of the largest entry, the Python core alike); the own exp/tanh are
    # within a few ulp of libm. So: 1e-4 relative to the largest entry, and no worse than the Python
    # core's own fp32 error (2x + 1e-6 for rounding luck).
    fused, py = run("fused", x, ws, gy, torch.float32), run("python", x, ws, gy, torch.float32)
    for name, a, p, b in zip(NAMES, fused, py, ref, strict=True):
        scale = max(1.0, b.abs().max().item())
        err_f, err_p = (a - b).abs().max().item(), (p - b).abs().max().item()
        assert err_f <= 2 * err_p + 1e-6 * scale, f"fp32 {name}: fused err {err_f:.3g} vs python {err_p:.3g}"
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4 * scale, msg=lambda m, n=name: f"fp32 {n}: {m}")


@pytest.mark.parametrize("shape", [(1, 1, 3, 5), (3, 6, 20, 17), (8, 4, 24, 520)], ids=str)
def test_fused_bf16_operands_fp32_state(shape):
    B, T, D, H = shape
    x, ws = inputs(B, T, D, H, seed=3 + sum(shape))
    gy = torch.randn(B, T, H, generator=torch.Generator().manual_seed(8), dtype=torch.float64)
    ref = run("reference", x, ws, gy, torch.bfloat16)  # the equations on the bf16-rounded operands
    py = run("python", x, ws, gy, torch.bfloat16)
    fused = run("fused", x, ws, gy, torch.bfloat16)
    for name, a, p, b in zip(NAMES, fused, py, ref, strict=True):
        # h and m are rounded to bf16 (8-bit mantissa, eps 7.8e-3) every step as matmul operands, and
        # gradients as dG/dm operands: errors of a few eps relative to the largest entry are expected.
        # The fused core must be as close to the float64 truth as the Python core is (within 2x + eps).
        scale = max(1.0, b.abs().max().item())
        err_f, err_p = (a - b).abs().max().item(), (p - b).abs().max().item()
        assert err_f <= 2 * err_p + 8e-3 * scale, f"bf16 {name}: fused err {err_f:.3g} vs python {err_p:.3g}"
        torch.testing.assert_close(a, b, rtol=5e-2, atol=5e-2 * scale, msg=lambda m, n=name: f"bf16 {n}: {m}")


def random_state(B: int, H: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A non-zero (h_0, c_0) as a trained layer leaves it: h in (-1, 1), c unbounded."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(B, H, generator=g, dtype=torch.float64).tanh(), 2 * torch.randn(B, H, generator=g)


@pytest.mark.parametrize("cdt", [torch.float64, torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("shape", [(1, 1, 3, 5), (3, 6, 20, 17), (8, 4, 24, 520)], ids=str)
def test_fused_from_a_carried_state_matches_float64_equations(shape, cdt):
    """--carry-state and dynamic evaluation: h and every gradient from a non-zero (h_0, c_0), fresh random
    inputs; the tolerances of the zero-state tests above, per dtype."""
    B, T, D, H = shape
    seed = int(torch.randint(1 << 30, ()))
    x, ws = inputs(B, T, D, H, seed=seed)
    state = random_state(B, H, seed + 1)
    gy = torch.randn(B, T, H, generator=torch.Generator().manual_seed(seed + 2), dtype=torch.float64)
    ref = run("reference", x, ws, gy, cdt, state)
    fused, py = run("fused", x, ws, gy, cdt, state), run("python", x, ws, gy, cdt, state)
    # float32's floor: the fused and Python cores sum the B*T terms of each weight gradient in other orders;
    # over 60 fresh draws at (8, 4, 24, 520) the fused error exceeded twice the Python core's by up to 3.8e-6
    # of the largest entry (32 eps, d(w_m)): the floor is 64 eps (1e-6, 8 eps, failed in a suite run)
    f32 = 64 * torch.finfo(torch.float32).eps
    floor, tol = {torch.float64: (0.0, 1e-10), torch.float32: (f32, 1e-4), torch.bfloat16: (8e-3, 5e-2)}[cdt]
    for name, a, p, b in zip(NAMES, fused, py, ref, strict=True):
        scale = max(1.0, b.abs().max().item())
        err_f, err_p = (a - b).abs().max().item(), (p - b).abs().max().item()
        assert err_f <= 2 * err_p + floor * scale + 1e-12, (
            f"{cdt} {name}: fused {err_f:.3g} vs python {err_p:.3g} (seed {seed})"
        )
        torch.testing.assert_close(a, b, rtol=tol, atol=tol * scale, msg=lambda m, n=name: f"{cdt} {n}: {m}")


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_chunks_with_the_state_carried_on_the_fused_loop_equal_one_pass(dtype):
    """A sequence cut in two, the second piece started from the first's state (a stream scored chunk by
    chunk; training's carried rows), equals one pass over the whole in float64: c_T is carried right too.
    Rows of unequal length in the second piece: each row's state at its own end, as the Python loop's."""
    B, T, D, H, cut = 3, 9, 7, 13, 4
    x, ws = inputs(B, T, D, H, seed=int(torch.randint(1 << 30, ())))
    whole = naive_mlstm(x, ws[0][:H], ws[0][H:], *ws[1:])  # float64
    x, ws = x.to(dtype), [w.to(dtype) for w in ws]
    tol = dict(rtol=1e-10, atol=1e-10) if dtype == torch.float64 else dict(rtol=1e-4, atol=1e-5)
    y1, s1 = mlstm_prefill(x[:, :cut], torch.full((B,), cut), *ws, core="fused")
    y2, _ = mlstm_prefill(x[:, cut:], torch.full((B,), T - cut), *ws, state=s1, core="fused")
    torch.testing.assert_close(torch.cat((y1, y2), 1).double(), whole, **tol)
    with torch.no_grad():
        h1, t1 = mlstm_sequence_from(x[:, :cut], (torch.zeros(B, H), torch.zeros(B, H)), *ws, core="fused")
        h2, _ = mlstm_sequence_from(x[:, cut:], t1, *ws, core="fused")
    torch.testing.assert_close(torch.cat((h1, h2), 1).double(), whole, **tol)
    lengths = torch.tensor([5, 2, 0])  # 0: the row's state is the one it came in with
    _, (h_f, c_f) = mlstm_prefill(x[:, cut:], lengths, *ws, state=s1, core="fused")
    _, (h_p, c_p) = mlstm_prefill(x[:, cut:], lengths, *ws, state=s1, core="python")
    torch.testing.assert_close(h_f, h_p, **tol)
    torch.testing.assert_close(c_f, c_p, **tol)
    torch.testing.assert_close(h_f[2], s1[0][2], rtol=0, atol=0)


LEVELS = {0: "base", 1: "avx2", 2: "avx512"}


@pytest.fixture
def isa(request):
    """The kernels compiled for ISA level request.param (every level up to the CPU's runs on it) ->
    [level, tile names]; the CPU's best level is restored after."""
    best = next(k for k, v in LEVELS.items() if v == fused_ops().isa(-1)[0])
    try:
        got = fused_core.set_isa(request.param)
        if got[0] != LEVELS[request.param]:  # e.g. AVX-512 on an AVX2-only box: said, not silent
            pytest.skip(f"this CPU runs kernels up to {LEVELS[best]}, not {LEVELS[request.param]}")
        yield got
    finally:
        fused_core.set_isa(best)


@pytest.mark.parametrize("isa", LEVELS, ids=LEVELS.values(), indirect=True)
def test_packed_gemm_tiles_match_float64_at_ragged_shapes(isa):
    """The packed GEMM alone, each tile of each ISA level: rows not a multiple of the tile's (tail rows on
    the padded copy), columns not a multiple of the panel (zero-padded panel), K of 1."""
    ops = fused_ops()
    g = torch.Generator().manual_seed(21)
    for M, K, N in [(1, 1, 1), (5, 7, 13), (16, 33, 70), (19, 64, 65)]:
        x, w = (
            torch.randn(M, K, generator=g, dtype=torch.float64),
            torch.randn(N, K, generator=g, dtype=torch.float64),
        )
        ref = x @ w.t()
        for tile in (0, 1):
            out = ops.packed_linear(x, ops.pack(w, tile), N, tile)
            torch.testing.assert_close(
                out, ref, rtol=1e-12, atol=1e-12, msg=lambda m, t=tile: f"f64 tile {t}: {m}"
            )
            out = ops.packed_linear(x.float(), ops.pack(w.float(), tile), N, tile)
            torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5 * K**0.5)
            xb, wb = x.bfloat16(), w.bfloat16()  # bf16 operands, fp32 accumulation: exact products
            out = ops.packed_linear(xb, ops.pack(wb, tile), N, tile)
            # fp32 sums of exact products, rounded once to bf16: within one bf16 ulp (2^-8) of the truth
            exact = (xb.double() @ wb.double().t()).bfloat16().double()
            torch.testing.assert_close(out.double(), exact, rtol=8e-3, atol=1e-3)


@pytest.mark.parametrize("isa", LEVELS, ids=LEVELS.values(), indirect=True)
def test_every_isa_and_product_path_matches_float64(isa, monkeypatch):
    """Forward and every gradient through each per-step product path (mm, oneDNN, each packed tile: their
    fused epilogues) with the kernels of each ISA level, against the float64 equations at odd shapes."""
    for shape in [(3, 5, 7, 17), (1, 2, 4, 6)]:
        B, T, D, H = shape
        x, ws = inputs(B, T, D, H, seed=sum(shape) + 100)
        gy = torch.randn(B, T, H, generator=torch.Generator().manual_seed(9), dtype=torch.float64)
        ref = run("reference", x, ws, gy, torch.float64)
        ref32 = run("python", x, ws, gy, torch.float32)
        for path in ["mm", "onednn", *isa[1:]]:
            monkeypatch.setenv("MLSTM_MATMUL", path)
            for cdt in (torch.float64, torch.float32):
                if path not in matmul.paths("step", cdt):
                    continue
                tol = 1e-10 if cdt == torch.float64 else 1e-4
                for name, a, b, p in zip(NAMES, run("fused", x, ws, gy, cdt), ref, ref32, strict=True):
                    scale = max(1.0, b.abs().max().item())
                    msg = f"{isa[0]} {path} {cdt} {name} {shape}"
                    torch.testing.assert_close(
                        a, b, rtol=tol, atol=tol * scale, msg=lambda m, s=msg: f"{s}: {m}"
                    )
                    if cdt == torch.float32:  # no worse than the Python core's own fp32 error
                        err_f, err_p = (a - b).abs().max().item(), (p - b).abs().max().item()
                        assert err_f <= 2 * err_p + 1e-6 * scale, f"{msg}: {err_f:.3g} vs python {err_p:.3g}"


@pytest.mark.parametrize("isa", LEVELS, ids=LEVELS.values(), indirect=True)
def test_threads_split_the_step_and_change_no_bit(isa):
    """A team of threads splits each step's products by panels and its gate passes by units: forward and
    backward outputs are bit-identical for 1, 2 and 3 threads (and every tile pair), at sizes where the
    split leaves a thread a partial panel, a partial unit chunk, or nothing."""
    ops = fused_ops()
    before = torch.get_num_threads()
    try:
        for B, T, H in [(3, 4, 40), (5, 3, 72), (16, 2, 96)]:
            g = torch.Generator().manual_seed(B * 1000 + H)
            proj = torch.randn(B, T, 5 * H, generator=g)
            bias, w_mh, w_m = (
                torch.randn(*s, generator=g) * s[-1] ** -0.5 for s in [(4 * H,), (H, H), (4 * H, H)]
            )
            dy = torch.randn(B, T, H, generator=g)
            for pr, pq in [(2, 2), (3, 3), (2, 3)]:  # packed tiles 0 / 1 of this level, for either product
                outs = []
                for threads in (1, 2, 3):
                    torch.set_num_threads(threads)
                    y, hs, cs, tcs, gates, ms, rs, pms = ops.forward(proj, bias, w_mh, w_m, pr, pq)
                    back = ops.backward(dy, gates, cs, tcs, rs, pms, w_mh, w_m, pq, pr)
                    outs.append([t.clone() for t in (y, hs, cs, gates, ms, *back)])
                for threads, got in zip((2, 3), outs[1:], strict=True):
                    for i, (a, b) in enumerate(zip(got, outs[0], strict=True)):
                        assert torch.equal(a, b), (
                            f"{isa[0]} B{B} T{T} H{H} tiles {pr, pq}: output {i}, {threads} threads"
                        )
    finally:
        torch.set_num_threads(before)


def test_fused_gradcheck():
    x, ws = inputs(2, 4, 3, 6, seed=11)
    args = [t.requires_grad_() for t in (x, *ws)]
    assert torch.autograd.gradcheck(lambda *a: mlstm_sequence(*a, core="fused"), args)


def test_matmul_paths_agree_and_timing_keeps_the_random_stream():
    g = torch.Generator().manual_seed(5)
    x, w = torch.randn(16, 40, generator=g), torch.randn(24, 40, generator=g)
    for p in matmul.paths().values():
        torch.testing.assert_close(
            p.run(x, p.prepare(w)), x.double().mm(w.double().t()).float(), rtol=1e-5, atol=1e-5
        )
    torch.manual_seed(0)
    expected = torch.rand(4)
    torch.manual_seed(0)
    assert matmul.choose(16, 40, 24, torch.float32) in matmul.paths()
    assert isinstance(matmul.bf16_is_native(64), bool)
    assert torch.equal(torch.rand(4), expected)


def train(core: str, steps: int = 4) -> tuple[list[float], dict[str, torch.Tensor]]:
    torch.manual_seed(0)
    model = build_sequential(debug_config(100, core=core))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(steps):
        ids = torch.randint(0, 100, (4, 17), generator=g)
        logits = model(ids[:, :-1])  # (B, T, V)
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, model.state_dict()


def test_training_and_checkpoints_match_between_cores():
    lf, sf = train("fused")
    lp, sp = train("python")
    # Same function, fp32: only rounding differs (~1e-7 per op), and 4 AdamW steps at lr 3e-3 keep that
    # at the ~1e-6 level; a wrong gate or derivative moves losses by >1e-2.
    assert lf == pytest.approx(lp, rel=1e-5, abs=1e-5)
    assert sf.keys() == sp.keys()
    for k in sf:
        torch.testing.assert_close(sf[k], sp[k], rtol=1e-4, atol=1e-5, msg=lambda m, k=k: f"{k}: {m}")
    # a checkpoint of one loads into the other (same names and shapes) and computes the same function
    ids = torch.randint(0, 100, (2, 9), generator=torch.Generator().manual_seed(2))
    other = build_sequential(debug_config(100, core="python"))
    other.load_state_dict(sf, strict=True)
    fused = build_sequential(debug_config(100, core="fused"))
    fused.load_state_dict(sf, strict=True)
    torch.testing.assert_close(other(ids), fused(ids), rtol=1e-5, atol=1e-5)
    # the choice of core is not saved with the model config
    assert "core" not in debug_config(core="fused").to_dict()
    with pytest.raises(ValueError, match="core"):
        debug_config(core="gpu")
    assert ModelConfig.from_dict({**debug_config().to_dict(), "core": "python"}).core == "python"


def test_build_failure_falls_back_with_one_warning(tmp_path):
    # A real failed build: a fresh extensions dir and a compiler that exits 1 at once.
    code = (
        "import logging, torch\n"
        "logging.basicConfig(level=logging.WARNING, format='%(levelname)s %(message)s')\n"
        "from app.model.core import mlstm_sequence\n"
        "x, ws = torch.randn(2, 3, 4), [torch.randn(s) for s in [(25, 4), (20,), (5, 5), (20, 5)]]\n"
        "for _ in range(3):\n"
        "    y = mlstm_sequence(x, *ws)\n"
        "print('auto ok', tuple(y.shape))\n"
        "try:\n"
        "    mlstm_sequence(x, *ws, core='fused')\n"
        "except RuntimeError as e:\n"
        "    print('fused error:', e)\n"
    )
    env = dict(os.environ, MLSTM_CACHE_DIR=str(tmp_path), CXX="false", PYTHONPATH=str(ROOT))
    p = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert p.returncode == 0, p.stderr[-3000:]
    assert "auto ok (2, 3, 5)" in p.stdout
    assert "fused error: core='fused' requested but the C++ extension did not build" in p.stdout
    assert p.stderr.count("WARNING fused mLSTM core did not build") == 1, p.stderr[-3000:]


def test_a_first_build_is_said_as_it_starts(tmp_path):
    """Nothing built in the extensions folder: the build is said before it starts (a first classify or
    transfer waits on it, and its time is start-up, not their rate); a built one loads without a word."""
    code = (
        "from app.common.logs import setup_logging\n"
        "setup_logging()\n"
        "from app.model import fused_core\n"
        "print('ops', fused_core.fused_ops() is not None)\n"
    )
    env = dict(os.environ, MLSTM_CACHE_DIR=str(tmp_path), CXX="false", PYTHONPATH=str(ROOT))
    p = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert p.returncode == 0 and "ops False" in p.stdout, p.stderr[-3000:]
    assert "INFO the fused CPU core: building its C++ extension, once ..." in p.stderr, p.stderr[-3000:]
    if fused_core.fused_ops() is not None:  # the built one of this process's cache folder: quiet
        env.pop("MLSTM_CACHE_DIR")
        env.pop("CXX")
        env.update({k: v for k, v in os.environ.items() if k == "MLSTM_CACHE_DIR"})
        p = subprocess.run(
            [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
        )
        assert "ops True" in p.stdout and "building its C++ extension" not in p.stderr, p.stderr[-3000:]


def test_kernel_table_round_trips_through_a_checkpoint_without_measuring(monkeypatch):
    """A resumed run must use the kernels the first run measured (same rounding): the table a checkpoint
    keeps restores every row bucket of every (kind, K, N, dtype), and nothing is timed again. Entries
    written before the fused core's "step" kind ([K, N, dtype, table]) restore as "linear"."""
    monkeypatch.delenv("MLSTM_MATMUL", raising=False)
    for m in (3, 16, 700):
        matmul.choose(m, 40, 24, torch.float32)
        matmul.choose(m, 24, 40, torch.float32, kind="step")
    saved = json.loads(json.dumps(matmul.export_choices()))  # as written to rng_rank<r>.json
    rows = (1, 5, 64, 4096)
    before = {(m, kind): matmul.choose(m, *kn, torch.float32, kind=kind) for m in rows
              for kind, kn in (("linear", (40, 24)), ("step", (24, 40)))}  # fmt: skip
    assert {p for (_, kind), p in before.items() if kind == "step"} <= set(matmul.paths("step"))
    monkeypatch.setattr(matmul, "_choice", {})
    monkeypatch.setattr(matmul, "_time_paths", lambda *a, **k: pytest.fail("measured again after restore"))
    matmul.restore_choices(saved)
    after = {(m, kind): matmul.choose(m, *kn, torch.float32, kind=kind) for m in rows
             for kind, kn in (("linear", (40, 24)), ("step", (24, 40)))}  # fmt: skip
    assert after == before
    legacy = [[k, n, dt, table] for k, n, dt, table, kind in saved if kind == "linear"]
    monkeypatch.setattr(matmul, "_choice", {})
    matmul.restore_choices(legacy)
    assert {m: matmul.choose(m, 40, 24, torch.float32) for m in rows} == {
        m: before[m, "linear"] for m in rows
    }


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_prefill_from_zero_state_on_the_fused_loop_equals_the_python_one(dtype):
    """Right-padded rows of unequal length: outputs and each row's (h, c) at its own end (features, prompts)."""
    x, ws = inputs(3, 9, 7, 13, seed=int(torch.randint(1 << 30, ())))
    x, ws = x.to(dtype), [w.to(dtype) for w in ws]
    lengths = torch.tensor([9, 4, 1])
    y_f, (h_f, c_f) = mlstm_prefill(x, lengths, *ws, core="fused")
    y_p, (h_p, c_p) = mlstm_prefill(x, lengths, *ws, core="python")
    tol = dict(rtol=1e-12, atol=1e-12) if dtype == torch.float64 else dict(rtol=1e-5, atol=1e-6)
    for a, b in ((y_f, y_p), (h_f, h_p), (c_f, c_p)):
        torch.testing.assert_close(a, b, **tol)
    torch.testing.assert_close(h_p, y_p[torch.arange(3), lengths - 1], rtol=0, atol=0)


def test_a_lock_left_by_a_killed_build_does_not_hang_the_next_one(tmp_path):
    """torch's JIT build waits forever on a `lock` file a killed build left behind (seen here: every later
    launch hung). A copy of the built extension with such a file must still load, in a fresh process."""
    from app.common.toolchain import cache_dir

    if fused_core.fused_ops() is None:
        pytest.skip(f"the fused core did not build here: {fused_core.build_error()}")
    src = fused_core.build_folder()
    dst = tmp_path / src.relative_to(cache_dir())
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("lock", "build.flock"))
    (dst / "lock").touch()  # what a build killed between torch's try_acquire and release leaves
    code = "from app.model import fused_core; print('ops', fused_core.fused_ops() is not None)"
    env = dict(os.environ, MLSTM_CACHE_DIR=str(tmp_path), PYTHONPATH=str(ROOT))
    p = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert p.returncode == 0, p.stderr[-3000:]
    assert "ops True" in p.stdout, p.stderr[-3000:]
    assert not (dst / "lock").exists()
