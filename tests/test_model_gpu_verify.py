"""app/model/gpu_verify.py: a GPU loop's outputs against the float64 reference, element by element.

The loops here are the reference core's own loops run in the check's dtype (no Triton needed): a correct one
passes at each dtype's tolerance, and each way a kernel can be wrong in silence fails - a localised error (one
batch row), a uniform 3% drift in bf16 (which a norm-relative 5e-2 let through), the last partial batch tile
left unwritten, a backward off by a little."""

import pytest
import torch

from app.model import gpu_verify
from app.model.gpu_loops import Loop
from app.model.gpu_tiles import Tiles
from app.model.mlstm_core import backward_loop, forward_loop


class ReferenceLoop(Loop):
    """mlstm_core's loops in the buffers' own dtypes, written into the GPU loops' buffers; `spoil` then
    changes the outputs the way a broken kernel would."""

    name = "reference"

    def __init__(self, spoil=None) -> None:
        super().__init__(Tiles(16, 16, 16, 4, 16))
        self.spoil = spoil

    def forward(self, b, B, T, H):
        state = (b["hs"][0], b["cs"][0])
        out = forward_loop(b["pm"], b["pg"], b["w_mh"], b["w_m"], state, b["w_mh"].dtype)
        for n, v in zip(("gates", "cs", "tcs", "rs", "ms", "hs"), out):
            b[n].copy_(v)
        if self.spoil:
            self.spoil(b, B, fwd=True)

    def backward(self, b, B, T, H):
        dG, dPm, dR = backward_loop(b["dy"], b["w_mh_t"].t(), b["w_m_t"].t(), b["pm"], b["gates"], b["cs"],
                                    b["tcs"], b["rs"], b["dp"].dtype)  # fmt: skip
        b["dp"].copy_(torch.cat((dPm, dG), dim=2))
        b["dr"].copy_(dR)
        if self.spoil:
            self.spoil(b, B, fwd=False)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
@pytest.mark.parametrize("fwd", [True, False])
def test_a_correct_loop_passes_at_its_dtype(dtype, fwd):
    assert gpu_verify.check(ReferenceLoop(), fwd, 31, 64, dtype, "cpu", seed=3) is None


def _row(b, B, fwd):
    (b["hs"][1:, B // 2] if fwd else b["dr"][:, B // 2]).mul_(1.1)


def _drift(b, B, fwd):
    for n in ("hs", "cs", "rs", "ms", "gates", "tcs") if fwd else ("dp", "dr"):
        b[n].mul_(1.03)


def _partial_tile(b, B, fwd):
    (b["hs"] if fwd else b["dp"])[:, 16 * (B // 16) :] = float("nan")


def _slightly_off_backward(b, B, fwd):
    if not fwd:
        b["dp"][..., : b["dr"].shape[-1]] *= 1.02  # d(pm) 2% off, the gate gradients right


@pytest.mark.parametrize(
    "spoil, fwd, what",
    [
        (_row, True, "hs differs"),
        (_row, False, "dr differs"),
        (_drift, True, "differs from the float64 reference by"),
        (_drift, False, "differs from the float64 reference by"),
        (_partial_tile, True, "hs differs from the float64 reference by nan"),
        (_partial_tile, False, "dp[d(pm)] differs from the float64 reference by nan"),
        (_slightly_off_backward, False, "dp[d(pm)] differs"),
    ],
)
def test_a_wrong_loop_fails_in_bf16(spoil, fwd, what):
    """bf16's tolerance (2 eps = 1.6e-2) is under what each of these does; the old norm-relative 5e-2 check
    passed the drift and the one-row error."""
    why = gpu_verify.check(ReferenceLoop(spoil), fwd, 31, 64, torch.bfloat16, "cpu", seed=5)
    assert why is not None and what in why, why


def test_the_check_batch_leaves_a_partial_tile_and_the_state_is_not_zero():
    assert [gpu_verify.check_rows(b) for b in (16, 32, 256)] == [15, 31, 255]
    f = gpu_verify.forward_case(15, 4, 32, torch.bfloat16, "cpu", seed=0)
    assert f["hs"][0].abs().min() > 0 and f["cs"][0].abs().sum() > 0
    assert all(f[n].isnan().all() for n in ("rs", "ms", "gates", "tcs")) and f["hs"][1:].isnan().all()


def test_tolerances_follow_the_dtype():
    assert gpu_verify.tolerance(torch.bfloat16) == pytest.approx(2 * 2**-7)
    assert gpu_verify.tolerance(torch.float16) == pytest.approx(2 * 2**-10)
    assert gpu_verify.tolerance(torch.float32) < 1e-5 and gpu_verify.tolerance(torch.float64) <= 1e-12
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = True
    try:
        assert gpu_verify.tolerance(torch.float32) == pytest.approx(2 * 2**-10)  # tf32's products
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before


class SecondRunWrong(ReferenceLoop):
    """Right on its first run, wrong from its second on: as a graphed loop whose eager run is right and whose
    graph replay is not (a capture that recorded the wrong buffers)."""

    def __init__(self) -> None:
        super().__init__(spoil=self._after_first)
        self.runs = 0

    def _after_first(self, b, B, fwd):
        self.runs += 1
        if self.runs > 1:
            _row(b, B, fwd)


@pytest.mark.parametrize("fwd", [True, False])
def test_the_check_runs_the_path_training_runs(monkeypatch, fwd):
    """Where gpu_loops.run would replay a CUDA graph of the loop, the check runs it twice (the eager first call
    on a copy, then the call that captures and replays) and judges the second: a loop whose replay is wrong
    fails. Off CUDA there is no replay (gpu_loops.replayed; the real capture is tests/test_model_triton_core's
    gpu test): run here as gpu_loops.run runs a loop eagerly, the math the loop's own."""
    from app.model import gpu_loops

    assert gpu_verify.check(SecondRunWrong(), fwd, 31, 64, torch.bfloat16, "cpu", seed=3) is None  # one run
    monkeypatch.setattr(gpu_loops, "replayed", lambda loop, w: True)
    monkeypatch.setattr(
        gpu_loops, "run", lambda loop, d, b, B, T, H: (loop.forward if d else loop.backward)(b, B, T, H)
    )
    loop = SecondRunWrong()
    why = gpu_verify.check(loop, fwd, 31, 64, torch.bfloat16, "cpu", seed=3)
    assert loop.runs == 2 and why is not None and ("hs differs" if fwd else "dr differs") in why, why
