"""Start-up precision check: bf16 on a CPU that only emulates it is flagged."""

from __future__ import annotations

import logging

from app.model.matmul import bf16_is_native
from app.parallel.precision import check_precision


def test_bf16_flagged_exactly_when_emulated(caplog):
    log = logging.getLogger("test_precision")
    with caplog.at_level(logging.WARNING, logger="test_precision"):
        assert check_precision("fp32", "cpu", "cfg.json", log)
        assert check_precision("bf16", "cuda", "cfg.json", log)
        assert not caplog.records
        sound = check_precision("bf16", "cpu", "cfg.json", log)
    native = bf16_is_native()  # measured: bf16 product faster than fp32 on this CPU
    assert sound == native
    assert bool(caplog.records) == (not native)
    if not native:
        assert "cfg.json enables bf16, but this CPU has no native bf16" in caplog.records[0].getMessage()


# ---- a non-finite step is skipped (what app/model/gpu_health.py's poisoned outputs rely on)

_SKIP_PROBE = """
import json, sys
import torch, deepspeed
cases = json.loads(sys.argv[1])
out = {}
for name, extra in cases.items():
    cfg = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "gradient_clipping": 1.0,
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "torch_adam": True}}, **extra}
    model = torch.nn.Linear(8, 8)
    eng, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    steps = []
    for nan in (False, True, False):
        before = [p.detach().clone() for p in eng.module.parameters()]
        x = torch.randn(2, 8, dtype=next(eng.module.parameters()).dtype)
        loss = eng(x).float().pow(2).mean() * (float("nan") if nan else 1.0)
        eng.backward(loss)
        eng.step()
        steps.append({"applied": eng.was_step_applied(),
                      "changed": any(not torch.equal(a, b) for a, b in zip(before, eng.module.parameters())),
                      "finite": all(bool(torch.isfinite(p).all()) for p in eng.module.parameters()),
                      "optimizer": type(eng.optimizer).__name__})
    out[name] = steps
print(json.dumps(out))
"""
_FP32_ACC = {"data_types": {"grad_accum_dtype": "fp32"}}
SKIP_CASES = {  # name: (the JSON's precision and ZeRO sections, the optimizer DeepSpeed builds for them)
    "bf16 ZeRO-1, fp32 accumulation (the pipeline configs)": (
        {"bf16": {"enabled": True}, **_FP32_ACC, "zero_optimization": {"stage": 1}}, "BF16_Optimizer"),
    "bf16 ZeRO-1": ({"bf16": {"enabled": True}, "zero_optimization": {"stage": 1}}, "DeepSpeedZeroOptimizer"),
    "bf16 ZeRO-2, fp32 accumulation (gpu_bf16_zero2.json)": (
        {"bf16": {"enabled": True}, **_FP32_ACC, "zero_optimization": {"stage": 2}}, "DeepSpeedZeroOptimizer"),
    "fp16 ZeRO-1": ({"fp16": {"enabled": True, "initial_scale_power": 4}, "zero_optimization": {"stage": 1}},
                    "DeepSpeedZeroOptimizer"),
    "fp16 ZeRO-2": ({"fp16": {"enabled": True, "initial_scale_power": 4}, "zero_optimization": {"stage": 2}},
                    "DeepSpeedZeroOptimizer"),
    # what app/parallel/precision.non_finite_update refuses: the step IS applied (and the weights lost)
    "bf16 ZeRO-2 without check_grad_overflow": (
        {"bf16": {"enabled": True, "check_grad_overflow": False}, **_FP32_ACC, "zero_optimization": {"stage": 2}},
        "DeepSpeedZeroOptimizer"),
}  # fmt: skip


def test_deepspeeds_bf16_and_fp16_optimizers_skip_a_non_finite_step_at_zero_1_and_2(tmp_path):
    """The real engine, one process on the CPU: a finite step, a step whose gradients are NaN, a finite step.
    Every optimizer the shipped configs and their bf16/fp16 ZeRO-1/2 variants build skips the NaN one
    (was_step_applied false, the weights untouched and finite after) and applies the others; the one setting
    under which it is applied is what start-up refuses."""
    import json
    import os
    import subprocess
    import sys

    from launcher import ROOT, free_port

    from app.parallel.precision import non_finite_update

    env = dict(os.environ, RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(free_port()), DS_ACCELERATOR="cpu", PYTHONPATH=str(ROOT))  # fmt: skip
    cases = {name: extra for name, (extra, _) in SKIP_CASES.items()}
    p = subprocess.run([sys.executable, "-c", _SKIP_PROBE, json.dumps(cases)], env=env, capture_output=True,
                       text=True, timeout=600)  # fmt: skip
    assert p.returncode == 0, p.stderr[-3000:]
    got = json.loads(p.stdout.strip().splitlines()[-1])
    for name, (extra, optimizer) in SKIP_CASES.items():
        good, nan, after = got[name]
        assert {good["optimizer"], nan["optimizer"]} == {optimizer}, (name, good)
        assert good["applied"] and good["changed"] and after["applied"], (name, got[name])
        precision = "bf16" if "bf16" in extra else "fp16"
        refused = non_finite_update(extra, precision)
        if refused is None:
            assert not nan["applied"] and not nan["changed"] and after["finite"], (name, nan, after)
        else:
            assert nan["changed"] and not after["finite"], (name, nan, after)
            assert "check_grad_overflow" in refused


def test_a_json_under_which_deepspeed_applies_a_non_finite_step_is_named():
    from app.parallel.precision import non_finite_update

    assert non_finite_update({"bf16": {"enabled": True}}, "bf16") is None
    assert non_finite_update({"bf16": {"enabled": True, "check_grad_overflow": True}}, "bf16") is None
    assert "check_grad_overflow" in non_finite_update({"bf16": {"check_grad_overflow": False}}, "bf16")
    assert non_finite_update({"fp16": {"enabled": True}, "zero_optimization": {"compute_grad_norm": False}},
                             "fp16") is None  # fmt: skip
    assert "compute_grad_norm" in non_finite_update(
        {"zero_optimization": {"compute_grad_norm": False}}, "fp32"
    )
