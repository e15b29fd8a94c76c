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
