"""The Triton GPU core (app/model/triton_core.py) and the core dispatcher (app/model/core.py).

Without a GPU: the kernels run in Triton's interpreter (TRITON_INTERPRET=1, in a process of its own:
it must be set before any @triton.jit module is imported, and must not reach the rest of the suite),
against the float64 reference; (tests/triton_checks.py).
With a GPU (`gpu` marker, skipped without CUDA): the same parity at real sizes in bf16/fp32, the CUDA-graph
replay against the eager loop, a grid barrier that really times out, the fallback from one, and the
dispatcher's choice. The kernels' builds for sm_90/89/80 are tests/test_bench_kernel_report.py's.
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


LOOPS = ("step", "cublas", "persistent", "splitk", "persistent-l2")  # persistent-l2: the re-tiled loop
TIMED = {f"fwd/{n}" for n in LOOPS if n != "splitk"} | {f"bwd/{n}" for n in LOOPS}  # splitk: backward only


@pytest.mark.parametrize("loop", LOOPS)
@pytest.mark.parametrize("case", ["odd/float64", "tiles/float32"])
def test_forward_and_gradients_match_the_float64_reference(interpreted, loop, case):
    """y, dx, d(w_in), d(bias), d(w_mh), d(w_m) of each GPU loop (the persistent ones phase by phase, 3
    programs looping over several tiles; persistent-l2 with r split 2 ways over K, dh 3 ways (its last slice
    empty), dm 2 ways, each summed by a phase of its own) at odd shapes (B3 T4 D7 H20: no tile is full) in
    float64, and in float32 over several tiles each way (B17 H20), relative to the reference's largest value."""
    name, dt = case.split("/")
    errs = interpreted[f"{name}/{loop}/{dt}"]
    tol = 1e-12 if dt == "float64" else 5e-6
    assert len(errs) == 6 and max(errs) < tol, errs
    # the forced loop ran: none failed its check (or its run) and handed the work to another loop
    assert interpreted[f"fell_back/{loop}"] == [], interpreted[f"fell_back/{loop}"]


@pytest.mark.parametrize("loop", LOOPS)
def test_bf16_is_as_close_as_the_reference_core_in_bf16(interpreted, loop):
    """bf16 operands, fp32 state: the error against float64 is that of the Python core at bf16."""
    got, py = interpreted[f"odd/{loop}/bfloat16"], interpreted["odd/python/bfloat16"]
    for name, g, p in zip(["y", "dx", "dw_in", "dbias", "dw_mh", "dw_m"], got, py):
        assert g < max(3 * p, 5e-3), (name, g, p)
        assert g > 1e-5, (name, g)  # bf16 rounding is there: the operands really were bf16


@pytest.mark.parametrize("loop", LOOPS)
def test_a_carried_state_runs_through_the_triton_loops(interpreted, loop):
    """From a non-zero (h_0, c_0): h, c_T and every weight gradient equal the float64 reference's."""
    assert max(interpreted[f"from_state/{loop}"]) < 1e-12, interpreted[f"from_state/{loop}"]


@pytest.mark.parametrize("loop", LOOPS)
def test_prefill_gives_each_row_its_state_after_its_length(interpreted, loop):
    assert max(interpreted[f"prefill/{loop}"]) < 1e-12, interpreted[f"prefill/{loop}"]


@pytest.mark.parametrize("loop", ["cublas", "persistent", "splitk", "persistent-l2"])
def test_right_padding_leaves_real_positions_alone(interpreted, loop):
    """Lengths 4, 3, 1 padded to 4: outputs, dx and every weight gradient equal the rows run alone."""
    assert max(interpreted[f"padded/{loop}"]) < 1e-12, interpreted[f"padded/{loop}"]


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


# ---- on a CUDA device


@pytest.fixture
def forced_loop(monkeypatch):
    """Run the Triton core with one loop, untimed."""
    from app.model import gpu_loops, gpu_tuning

    def force(loop: str) -> None:
        monkeypatch.setenv("MLSTM_GPU_LOOP", loop)
        gpu_tuning._choices.clear()
        gpu_loops.clear_graphs()

    yield force
    gpu_tuning._choices.clear()


@pytest.mark.gpu
@pytest.mark.parametrize("loop", LOOPS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(16, 64, 256, 256), (64, 32, 1024, 1024), (5, 17, 33, 200)])
def test_cuda_parity_at_real_sizes(shape, dtype, loop, forced_loop):
    from app.model.mlstm_core import MLSTMFunction
    from app.model.triton_core import TritonMLSTMFunction

    forced_loop(loop)
    x, ws, dy = _cuda_case(*shape, dtype)
    torch.backends.cuda.matmul.allow_tf32 = False
    ref = _grads(MLSTMFunction, x.double(), [w.double() for w in ws], dy.double(), torch.float64)
    base = _grads(MLSTMFunction, x, ws, dy, dtype)  # the reference core at the same precision
    for _ in range(3):  # eager, then captured (step, cublas), then replayed
        got = _grads(TritonMLSTMFunction, x, ws, dy, dtype)
    for name, g, b, r in zip(["y", "dx", "dw_in", "dbias", "dw_mh", "dw_m"], got, base, ref):
        scale = r.abs().max()
        err, err_base = (g - r).abs().max() / scale, (b - r).abs().max() / scale
        assert err < max(3 * err_base, 1e-5 if dtype == torch.float32 else 1e-2), (name, err, err_base)


@pytest.mark.gpu
@pytest.mark.parametrize("loop", LOOPS)
def test_cuda_carried_state_and_prefill(loop, forced_loop):
    """From a non-zero state, fp32: h, c_T and the weight gradients against the reference core's; prefill's
    per-row states."""
    from app.model import mlstm_core, triton_core

    forced_loop(loop)
    torch.backends.cuda.matmul.allow_tf32 = False
    x, ws, dy = _cuda_case(8, 24, 64, 256, torch.float32, seed=3)
    g = torch.Generator(device="cuda").manual_seed(4)
    h0, c0 = (
        torch.rand(8, 256, device="cuda", generator=g) - 0.5,
        torch.randn(8, 256, device="cuda", generator=g),
    )
    outs = []
    for fn in (triton_core.TritonMLSTMFromState, mlstm_core.MLSTMFromState):
        leaves = [t.clone().requires_grad_() for t in (x, *ws)]
        y, c = fn.apply(*leaves, h0, c0)
        (y * dy).sum().backward()
        outs.append([y.detach(), c] + [t.grad for t in leaves])
    for a, b in zip(*outs):
        assert (a - b).abs().max() <= 1e-4 * b.abs().max(), (a - b).abs().max()
    lengths = torch.tensor([24, 3, 17, 1, 24, 9, 2, 20], device="cuda")
    got = triton_core.prefill(x, lengths, *ws, (h0, c0))[1]
    want = mlstm_core.mlstm_prefill(x, lengths, *ws, (h0, c0))[1]
    for a, b in zip(got, want):
        assert (a - b).abs().max() <= 1e-4 * b.abs().max()


@pytest.mark.gpu
@pytest.mark.parametrize("loop", ["step", "cublas"])
def test_cuda_graph_replay_equals_the_eager_loop(monkeypatch, loop, forced_loop):
    from app.model import gpu_loops, triton_core

    forced_loop(loop)
    x, ws, dy = _cuda_case(8, 12, 64, 128, torch.bfloat16)
    monkeypatch.setenv("MLSTM_CUDA_GRAPHS", "0")
    eager = _grads(triton_core.TritonMLSTMFunction, x, ws, dy, torch.bfloat16)
    monkeypatch.setenv("MLSTM_CUDA_GRAPHS", "1")
    runs = [_grads(triton_core.TritonMLSTMFunction, x, ws, dy, torch.bfloat16) for _ in range(3)]
    assert gpu_loops.graphs_held() == 2  # forward and backward captured (the first call ran eagerly)
    x2, ws2, dy2 = _cuda_case(8, 7, 64, 128, torch.bfloat16, seed=5)  # a shorter length: the same arena
    monkeypatch.setenv("MLSTM_CUDA_GRAPHS", "0")
    eager2 = _grads(triton_core.TritonMLSTMFunction, x2, ws2, dy2, torch.bfloat16)
    monkeypatch.setenv("MLSTM_CUDA_GRAPHS", "1")
    runs2 = [_grads(triton_core.TritonMLSTMFunction, x2, ws2, dy2, torch.bfloat16) for _ in range(2)]
    assert gpu_loops.graphs_held() == 4 and len(gpu_loops._arenas) == 2
    for run, want in [*((r, eager) for r in runs), *((r, eager2) for r in runs2)]:
        for a, b in zip(run, want):
            assert torch.equal(a, b)


@pytest.mark.gpu
def test_cuda_graph_arenas_are_capped(forced_loop):
    """Each batch size has its own arena (a whole sequence's buffers): at most MAX_ARENAS are kept."""
    from app.model import gpu_loops, triton_core

    forced_loop("step")
    for B in range(3, 3 + 2 * gpu_loops.MAX_ARENAS):
        x, ws, dy = _cuda_case(B, 6, 32, 64, torch.bfloat16, seed=B)
        for _ in range(2):  # eager, then captured
            _grads(triton_core.TritonMLSTMFunction, x, ws, dy, torch.bfloat16)
        assert len(gpu_loops._arenas) <= gpu_loops.MAX_ARENAS


@pytest.mark.gpu
def test_cuda_a_barrier_that_times_out_poisons_every_output_and_never_waits(monkeypatch):
    """A grid 64x the SMs launched without the cooperative guarantee: its programs cannot all be resident, the
    grid barrier gives up after MAX_SPIN polls, and the launch returns without waiting: every output element
    is NaN (each program poisoned the tiles it owns) and the barrier word's flag is set. Under the old host wait
    (MLSTM_BARRIER_HOST_WAIT=1) the same launch raises BarrierTimeout; launched cooperatively, the grid is
    refused at launch."""
    from app.model import gpu_loops, gpu_tuning, gpu_verify
    from app.model.gpu_loops import BarrierTimeout, PersistentLoop

    monkeypatch.setattr(gpu_loops, "MAX_SPIN", 1 << 10)
    dev = torch.device("cuda")
    loops = gpu_tuning.candidates(16, 256, torch.bfloat16, dev)
    persistent = next(c for c in loops if c.name == "persistent")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    too_many = PersistentLoop(persistent.tiles, programs=64 * sms)
    bufs = gpu_verify.forward_case(16, 64, 256, torch.bfloat16, dev, seed=0)
    bufs.update(too_many.scratch(16, 256, torch.bfloat16, dev))
    for n in gpu_loops.FWD_OUT:
        (bufs[n][1:] if n in gpu_loops.TIME_PLUS_ONE else bufs[n]).fill_(7.0)
    too_many.cooperative = False
    bar = torch.zeros(2, dtype=torch.int32, device=dev)
    too_many.forward({**bufs, "bar": bar}, 16, 8, 256)
    torch.cuda.synchronize()
    assert int(bar[1]) == 1
    for n in gpu_loops.FWD_OUT:
        out = (bufs[n][1:] if n in gpu_loops.TIME_PLUS_ONE else bufs[n])[:8]
        assert out.isnan().all(), (n, out.isnan().float().mean().item())
    monkeypatch.setenv("MLSTM_BARRIER_HOST_WAIT", "1")
    with pytest.raises(BarrierTimeout, match="grid barrier timed out"):
        too_many.forward(bufs, 16, 8, 256)
    too_many.cooperative = True
    with pytest.raises(RuntimeError, match=r"(?i)cooperative"):
        too_many.forward(bufs, 16, 8, 256)


@pytest.mark.gpu
@pytest.mark.parametrize("wait", [False, True])
def test_cuda_a_failed_barrier_is_found_and_the_next_run_is_right(monkeypatch, caplog, forced_loop, wait):
    """The persistent loop's first forward and first backward each find their barrier's flag set (injected).
    Without the host wait the op's outputs and gradients are NaN, and the flags read afterwards drop the loop
    in one line per direction; the next run is right. With it (MLSTM_BARRIER_HOST_WAIT=1) each direction is
    redone at once with the next loop, in one line each, and the first run is right."""
    from app.common import faults
    from app.model import gpu_health
    from app.model.mlstm_core import MLSTMFunction
    from app.model.triton_core import TritonMLSTMFunction

    forced_loop("persistent")
    monkeypatch.setenv("MLSTM_BARRIER_HOST_WAIT", "1" if wait else "0")
    monkeypatch.setitem(faults._FAULTS, "barrier_timeout", {1, 2})
    monkeypatch.setattr(faults, "_seen", {})
    torch.backends.cuda.matmul.allow_tf32 = False
    x, ws, dy = _cuda_case(16, 32, 64, 256, torch.float32, seed=9)
    logger = logging.getLogger("app.model.gpu_tuning")  # its records, whatever logging an earlier test set up
    monkeypatch.setattr(logger, "propagate", False)
    logger.addHandler(caplog.handler)
    try:
        with caplog.at_level("WARNING", logger="app.model.gpu_tuning"):
            got = _grads(TritonMLSTMFunction, x, ws, dy, torch.float32)
    finally:
        logger.removeHandler(caplog.handler)
    redone = [r.getMessage() for r in caplog.records if "redoing it with the" in r.getMessage()]
    lines = gpu_health.check()
    want = _grads(MLSTMFunction, x, ws, dy, torch.float32)
    if not wait:
        assert all(g.isnan().any() for g in got[1:]) and not redone, redone
        assert len(lines) == 2 and all("grid barrier gave up" in ln for ln in lines), lines
        got = _grads(TritonMLSTMFunction, x, ws, dy, torch.float32)
    else:
        assert lines == [] and len(redone) == 2, redone
    for a, b in zip(got, want):
        assert (a - b).abs().max() <= 1e-4 * b.abs().max()


@pytest.mark.gpu
def test_cuda_dispatch_times_the_loops_once_and_logs_the_choice(caplog, monkeypatch, tmp_path):
    from app.model import core, gpu_tuning, triton_core

    monkeypatch.delenv("MLSTM_GPU_LOOP", raising=False)
    monkeypatch.setenv("MLSTM_CACHE_DIR", str(tmp_path))
    gpu_tuning._choices.clear()
    gpu_tuning._logged.clear()
    x, w = (
        torch.zeros(32, 3, 64, device="cuda", dtype=torch.bfloat16),
        torch.zeros(256, 256, device="cuda", dtype=torch.bfloat16),
    )
    with caplog.at_level("INFO", logger="app.model.gpu_tuning"):
        fns = {core.select("auto", x, w) for _ in range(3)}
    choice = gpu_tuning._choices[(*gpu_tuning._key(x, w), None)]
    assert fns == {core.MLSTMFunction if choice.python else triton_core.TritonMLSTMFunction}, choice.times
    lines = [
        r.message for r in caplog.records if r.message.startswith("mLSTM core on") and "B32 H256" in r.message
    ]
    assert len(lines) == 1 and "ms at T=64" in lines[0], lines  # the choice, said once
    assert set(choice.times) >= TIMED - {"fwd/persistent-l2", "bwd/persistent-l2"}, (
        choice.times
    )  # none at H256
    assert core.select("fused", x, w) is triton_core.TritonMLSTMFunction  # "fused" asks for it, whatever won
    n = len(gpu_tuning._choices)
    core.select("auto", x[:20], w)  # a micro-batch with fewer rows: its bucket's choice, no new timing
    assert len(gpu_tuning._choices) == n
    assert "B32 H256" in (tmp_path / "gpu_loops.json").read_text()  # a later run skips the timing


@pytest.mark.gpu
def test_cuda_the_check_runs_the_graph_replay_training_runs(monkeypatch):
    """A graphed loop whose eager run is right and whose CUDA-graph replay is not (an op recorded only under
    capture): the float64 check, which runs the replay where training would, fails it; with the graphs off
    (MLSTM_CUDA_GRAPHS=0: training runs it eagerly) it passes. The check's arena is not kept."""
    from app.model import gpu_loops, gpu_tuning, gpu_verify

    class ReplayWrong(gpu_loops.StepLoop):
        def forward(self, b, B, T, H):
            super().forward(b, B, T, H)
            if torch.cuda.is_current_stream_capturing():
                b["hs"][1:].mul_(1.5)

    step = next(
        c for c in gpu_tuning.candidates(16, 256, torch.bfloat16, torch.device("cuda")) if c.name == "step"
    )
    loop = ReplayWrong(step.tiles)
    monkeypatch.setenv("MLSTM_CUDA_GRAPHS", "1")
    why = gpu_verify.check(loop, True, 15, 256, torch.bfloat16, torch.device("cuda"))
    assert why is not None and "hs differs" in why, why
    assert not any(k[0] == repr(loop) for k in gpu_loops._arenas)
    monkeypatch.setenv("MLSTM_CUDA_GRAPHS", "0")
    assert gpu_verify.check(loop, True, 15, 256, torch.bfloat16, torch.device("cuda")) is None


@pytest.mark.gpu
def test_cuda_the_l2_tiles_match_the_reference_at_the_large_width(forced_loop):
    """persistent-l2 at B100 (bucket 128) H4096 in bf16, where the traffic model picks its tiles (r and dh split
    over K, dm's (128, 128) slices): outputs and gradients as close to float64 as the reference core's in bf16,
    and no fallback (the forced loop ran)."""
    from app.model import gpu_tuning
    from app.model.mlstm_core import MLSTMFunction
    from app.model.triton_core import TritonMLSTMFunction

    if not any(
        c.label == "persistent-l2"
        for c in gpu_tuning.candidates(128, 4096, torch.bfloat16, torch.device("cuda"))
    ):
        pytest.skip("this GPU has no l2 tiles at B128 H4096 (the traffic model's choice for its SM count)")
    forced_loop("persistent-l2")
    x, ws, dy = _cuda_case(100, 6, 512, 4096, torch.bfloat16, seed=2)
    ref = _grads(MLSTMFunction, x.double(), [w.double() for w in ws], dy.double(), torch.float64)
    base = _grads(MLSTMFunction, x, ws, dy, torch.bfloat16)
    got = _grads(TritonMLSTMFunction, x, ws, dy, torch.bfloat16)
    choice = next(iter(gpu_tuning._choices.values()))
    assert (choice.fwd.label, choice.bwd.label) == ("persistent-l2", "persistent-l2"), choice.times
    for name, g, b, r in zip(["y", "dx", "dw_in", "dbias", "dw_mh", "dw_m"], got, base, ref):
        scale = r.abs().max()
        err, err_base = (g - r).abs().max() / scale, (b - r).abs().max() / scale
        assert err < max(3 * err_base, 1e-2), (name, err, err_base)
