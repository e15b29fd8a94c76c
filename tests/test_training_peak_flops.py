"""app.training.peak_flops: MFU divides by the GPU's datasheet dense peak (timed peak beside it), or on a
CPU / an unknown GPU by the timed product's rate."""

import pytest
import torch

from app.training.peak_flops import datasheet_peak, mfu_peak


@pytest.mark.parametrize(
    "name, dtype, tflops",
    [
        ("NVIDIA H100 80GB HBM3", torch.bfloat16, 989.4),  # SXM5
        ("NVIDIA H100 PCIe", torch.bfloat16, 756.5),
        ("NVIDIA H100 NVL", torch.float16, 835.5),
        ("NVIDIA H200", torch.bfloat16, 989.4),
        ("NVIDIA A100-SXM4-80GB", torch.bfloat16, 312.0),
        ("NVIDIA A100 80GB PCIe", torch.float32, 19.5),
        ("NVIDIA L40S", torch.bfloat16, 362.1),  # not L4's row
        ("Tesla V100-SXM2-16GB", torch.bfloat16, None),
        ("Some Future GPU", torch.bfloat16, None),
    ],
)
def test_datasheet_table(name, dtype, tflops):
    got = datasheet_peak(name, dtype)
    assert got == (None if tflops is None else pytest.approx(tflops * 1e12))


def test_cpu_mfu_uses_the_timed_product():
    peak, line = mfu_peak(torch.float32, torch.device("cpu"))
    assert peak > 1e8
    assert line == f"MFU against the timed float32 1024^3 product: {peak / 1e12:.2f} TFLOP/s (cpu)"
