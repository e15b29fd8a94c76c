"""The Triton GPU core (app/model/triton_core.py) and the core dispatcher (app/model/core.py).

Without a GPU: the kernels run in Triton's interpreter (TRITON_INTERPRET=1, in a process of its own:
it must be set before any @triton.jit module is imported, and must not reach the rest of the suite),
against the float64 reference; and Triton's real compiler builds them for sm_90 (tests/triton_checks.py).
With a GPU (`gpu` marker, skipped without CUDA): the same parity at real sizes in bf16/fp32, the CUDA-graph
replay against the eager loop, and the dispatcher's choice.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from app.model import triton_core  # imports triton only when a kernel is needed

ROOT = Path(__file__).resolve().parents[1]
triton = pytest.importorskip("triton", reason="the gpu extra (triton) is not installed")
# torch 2.6-2.8's CUDA builds pin triton 3.2-3.4, below the core's floor: there the dispatcher runs the
# reference core (test_an_older_triton_is_named_and_not_run), and the kernels' own checks are skipped
OLD_TRITON = pytest.mark.skipif(
    triton_core.too_old(triton.__version__),
    reason=f"triton {triton.__version__} is below the Triton core's floor (3.5)",
)


def _check(mode: str, tmp_path: Path, **env) -> dict:
    if OLD_TRITON.args[0]:
        pytest.skip(OLD_TRITON.kwargs["reason"])
    env = dict(os.environ, PYTHONPATH=str(ROOT), TRITON_CACHE_DIR=str(tmp_path / "triton"), **env)
    p = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "triton_checks.py"), mode],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def interpreted(tmp_path_factory) -> dict:
    # MLSTM_MATMUL=mm: the before/after-loop products through torch.mm, no per-shape timing
    return _check("parity", tmp_path_factory.mktemp("interp"), TRITON_INTERPRET="1", MLSTM_MATMUL="mm")


@pytest.mark.parametrize("case", ["odd/triton/float64", "odd/triton/float32", "tiles/triton/float32"])
def test_forward_and_gradients_match_the_float64_reference(interpreted, case):
    """y, dx, d(w_in), d(bias), d(w_mh), d(w_m) at odd shapes (B3 T5 D7 H20: no tile is full) and over
    several tiles each way (B37 H40), relative to the reference's largest value."""
    tol = 1e-12 if case.endswith("float64") else 5e-6
    errs = interpreted[case]
    assert len(errs) == 6 and max(errs) < tol, errs


def test_bf16_is_as_close_as_the_reference_core_in_bf16(interpreted):
    """bf16 operands, fp32 state: the error against float64 is that of the Python core at bf16."""
    got, py = interpreted["odd/triton/bfloat16"], interpreted["odd/python/bfloat16"]
    for name, g, p in zip(["y", "dx", "dw_in", "dbias", "dw_mh", "dw_m"], got, py):
        assert g < max(3 * p, 5e-3), (name, g, p)
        assert g > 1e-5, (name, g)  # bf16 rounding is there: the operands really were bf16


def test_right_padding_leaves_real_positions_alone(interpreted):
    """Lengths 6, 4, 1 padded to 6: outputs, dx and every weight gradient equal the rows run alone."""
    assert max(interpreted["padded"]) < 1e-12, interpreted["padded"]


def test_dispatcher_picks_triton_for_fused_and_auto(interpreted):
    assert interpreted["dispatch"] == {
        "auto": "TritonMLSTMFunction",
        "fused": "TritonMLSTMFunction",
        "python": "MLSTMFunction",
    }


def test_dispatcher_on_cpu_and_a_device_triton_cannot_take(caplog, monkeypatch):
    from app.model import core, fused_core, triton_core

    x, w = torch.zeros(2, 3, 4), torch.zeros(5, 5)
    # caplog's handler on the logger itself, which stops there: an earlier test in this process may have set
    # up the app's logging, whose "app" logger keeps records from reaching the root, where caplog listens
    monkeypatch.setattr(logging.getLogger("app.model.core"), "propagate", False)
    logging.getLogger("app.model.core").addHandler(caplog.handler)
    try:
        with caplog.at_level("INFO", logger="app.model.core"):
            core._logged.clear()
            for _ in range(3):
                fn = core.select("auto", x, w)
    finally:
        logging.getLogger("app.model.core").removeHandler(caplog.handler)
    assert fn is (fused_core.FusedMLSTMFunction if fused_core.fused_ops() else core.MLSTMFunction)
    assert sum("mLSTM core on cpu float32" in r.message for r in caplog.records) == 1  # logged once
    assert "runs on CUDA devices, got meta" in triton_core.available(torch.zeros(1, device="meta"), w)
    with pytest.raises(ValueError, match="core must be one of"):
        core.select("gpu", x, w)


def test_an_older_triton_is_named_and_not_run(monkeypatch):
    from app.model import triton_core

    x, w = torch.zeros(2, 3, 4), torch.zeros(5, 5)
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # past the device check, as on a GPU
    monkeypatch.setattr(triton, "__version__", "3.4.0")
    assert triton_core.available(x, w) == (
        "the Triton core needs triton>=3.5 (float64 tl.dot), found 3.4.0; pip install 'mlstm-ds[gpu]'"
    )
    monkeypatch.setattr(triton, "__version__", "3.5.0+git1234")
    assert triton_core.available(x, w) is None


def test_kernels_compile_for_sm90_without_a_gpu(tmp_path):
    """Triton's real compiler (not the interpreter) builds all four kernels for an H100 in bf16 and fp32."""
    out = _check("compile", tmp_path)
    if "skip" in out:
        pytest.skip(out["skip"])
    assert sorted(out) == sorted(
        f"{k}/{d}" for k in ("fwd_r", "fwd_gates", "bwd_m", "bwd_h") for d in ("bf16", "fp32")
    )
    assert all(size > 1000 for size in out.values()), out


# ---- on a CUDA device


def _cuda_case(B, T, D, H, dtype, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(B, T, D, device="cuda", generator=g)
    ws = [torch.randn(s, device="cuda", generator=g) * a for s, a in
          [((5 * H, D), D**-0.5), ((4 * H,), 0.1), ((H, H), H**-0.5), ((4 * H, H), H**-0.5)]]  # fmt: skip
    dy = torch.randn(B, T, H, device="cuda", generator=g)
    return x, ws, dy


def _grads(fn, x, ws, dy, dtype):
    from app.model.mlstm_core import state_dtype

    leaves = [x.to(dtype).clone().requires_grad_()] + [
        w.to(state_dtype(dtype) if i == 1 else dtype).clone().requires_grad_() for i, w in enumerate(ws)
    ]
    y = fn.apply(*leaves)
    (y.float() * dy).sum().backward()
    return [y.detach().double()] + [t.grad.double() for t in leaves]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(16, 64, 256, 256), (64, 32, 1024, 1024), (5, 17, 33, 200)])
def test_cuda_parity_at_real_sizes(shape, dtype):
    from app.model.mlstm_core import MLSTMFunction
    from app.model.triton_core import TritonMLSTMFunction

    x, ws, dy = _cuda_case(*shape, dtype)
    torch.backends.cuda.matmul.allow_tf32 = False
    ref = _grads(MLSTMFunction, x.double(), [w.double() for w in ws], dy.double(), torch.float64)
    got = _grads(TritonMLSTMFunction, x, ws, dy, dtype)
    base = _grads(MLSTMFunction, x, ws, dy, dtype)  # the reference core at the same precision
    for name, g, b, r in zip(["y", "dx", "dw_in", "dbias", "dw_mh", "dw_m"], got, base, ref):
        scale = r.abs().max()
        err, err_base = (g - r).abs().max() / scale, (b - r).abs().max() / scale
        assert err < max(3 * err_base, 1e-5 if dtype == torch.float32 else 1e-2), (name, err, err_base)


@pytest.mark.gpu
def test_cuda_graph_replay_equals_the_eager_loop(monkeypatch):
    from app.model import triton_core

    x, ws, dy = _cuda_case(8, 12, 64, 128, torch.bfloat16)
    monkeypatch.setenv("MLSTM_CUDA_GRAPHS", "0")
    eager = _grads(triton_core.TritonMLSTMFunction, x, ws, dy, torch.bfloat16)
    monkeypatch.setenv("MLSTM_CUDA_GRAPHS", "1")
    triton_core._graphs.clear()
    triton_core._seen.clear()
    runs = [_grads(triton_core.TritonMLSTMFunction, x, ws, dy, torch.bfloat16) for _ in range(3)]
    assert len(triton_core._graphs) == 2  # forward and backward captured (the first call ran eagerly)
    for run in runs:
        for a, b in zip(run, eager):
            assert torch.equal(a, b)


@pytest.mark.gpu
def test_cuda_dispatch_picks_triton():
    from app.model import core, triton_core

    x, w = torch.zeros(2, 3, 4, device="cuda"), torch.zeros(5, 5, device="cuda")
    assert core.select("auto", x, w) is triton_core.TritonMLSTMFunction
    assert core.select("fused", x, w) is triton_core.TritonMLSTMFunction
