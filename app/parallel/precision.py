"""Precision sanity at start-up: the DS JSON picks the training precision; this checks it suits the machine.

bf16 pays only where the hardware runs it natively (AVX512-BF16 / AMX, or a GPU). On a CPU without it,
oneDNN emulates bf16 products several times slower than fp32, so asking for bf16 there is almost surely
a mistake: we warn once (rank 0) rather than refuse, since the run is still correct. The shipped CPU
configs (ds_configs/cpu_*.json) are fp32, so the default never lands on emulated bf16.
"""

from __future__ import annotations

import logging

from app.model.matmul import bf16_is_native


def check_precision(precision: str, device_type: str, source: str, log: logging.Logger) -> bool:
    """Warn when `precision` is bf16 on a CPU that emulates it; returns whether the setting is sound."""
    if precision != "bf16" or device_type != "cpu" or bf16_is_native():
        return True
    log.warning(
        "%s enables bf16, but this CPU has no native bf16 (oneDNN emulates it, measured slower than fp32): training will be "
        "slow; use an fp32 config such as ds_configs/cpu_pp2_zero1.json",
        source,
    )
    return False


def non_finite_update(ds_json: dict, precision: str) -> str | None:
    """Why DeepSpeed would APPLY an optimizer step whose gradients are not finite under this JSON, or None.

    Read from DeepSpeed 0.19's source and checked by tests/test_parallel_precision.py on the real engine:
    BF16_Optimizer (bf16 at ZeRO-1 with fp32 gradient accumulation) skips a step whose global gradient norm is
    not finite whatever the JSON says (runtime/bf16_optimizer.py:402-407); the ZeRO-1/2 optimizer
    (runtime/zero/stage_1_and_2.py:3029-3065) skips one where it checks for overflow: always under fp16, under
    bf16 only with `bf16.check_grad_overflow` (default true: runtime/precision_config.py:56, engine.py:2638-2643),
    under fp32 through the gradient norm (`zero_optimization.compute_grad_norm`, default true). A GPU loop whose barrier gave up leaves NaN in its
    step (app/model/gpu_health.py): the run relies on that skip."""
    if precision == "bf16" and (ds_json.get("bf16") or {}).get("check_grad_overflow", True) is False:
        return "bf16.check_grad_overflow is false: DeepSpeed's ZeRO optimizer then applies a non-finite step"
    zero = ds_json.get("zero_optimization") or {}
    if precision == "fp32" and zero.get("compute_grad_norm", True) is False:
        return (
            "zero_optimization.compute_grad_norm is false in fp32: DeepSpeed then checks no gradient for "
            "non-finite values and applies a non-finite step"
        )
    return None
