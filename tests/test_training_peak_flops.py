"""app.training.peak_flops: MFU divides by the GPU's datasheet dense peak (timed peak beside it), or on a
CPU / an unknown GPU by the timed product's rate."""

import json
import re

import pytest
import torch
from launcher import metrics

from app.training.peak_flops import cache_path, datasheet_peak, device_name, mfu_peak


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


def test_a_cpu_peak_is_measured_once_per_machine_and_threads(monkeypatch, tmp_path):
    """Two runs on one machine divide by one figure: the first measures and caches it, the next reads it
    (the very same number: a second measurement would differ in its last digits); another thread count is
    another peak."""
    monkeypatch.setenv("MLSTM_CACHE_DIR", str(tmp_path))
    cpu = torch.device("cpu")
    first, line = mfu_peak(torch.float32, cpu)
    again, line2 = mfu_peak(torch.float32, cpu)
    n = torch.get_num_threads()
    name = device_name(cpu)
    want = f"{first / 1e12:.3g} TFLOP/s per rank ({name}, {n} thread{'s' if n != 1 else ''}; "
    assert (
        line
        == f"MFU against this machine's float32 1024^3 product peak: {want}measured now, cached in {cache_path()})"
    )
    assert again == first > 1e8 and "; cached 20" in line2, line2
    cached = json.loads(cache_path().read_text())
    assert list(cached) == [f"{name} | {n} thread{'s' if n != 1 else ''} | float32"]
    try:
        torch.set_num_threads(n + 1)
        _, line3 = mfu_peak(torch.float32, cpu)
    finally:
        torch.set_num_threads(n)
    assert "measured now" in line3 and len(json.loads(cache_path().read_text())) == 2


def test_mfu_counts_every_rank_and_never_reads_above_one(runs):
    """2 ranks, 1 thread each (the case that logged mfu 141%): the peak is every rank's timed product summed
    (the throughput is the world's), and a peak timed low (here divided by 10^5, as a product timed while the
    core was busy reads low) is raised to the fastest step's rate, said once: MFU stays at or under 100%.
    The run: tests/runs.py's "tied_p2" (3 steps, P = 2), whose ranks time their peak that low."""
    run = runs.get("tied_p2")
    out, p = run.dir, run.proc
    assert p.returncode == 0, p.stderr[-3000:]
    line = next(ln for ln in p.stderr.splitlines() if "MFU against this machine's float32" in ln)
    m = re.search(
        r"product peak: ([\d.e+-]+) TFLOP/s per rank .*for the 2 ranks together: ([\d.e+-]+) TFLOP/s", line
    )
    assert m and float(m[2]) > float(m[1]), line  # rank 1's peak counted too
    mfu = [r["train/mfu"] for r in metrics(out) if "train/mfu" in r]
    assert len(mfu) == 3 and max(mfu) <= 1.0 and max(mfu) == pytest.approx(1.0), mfu
    assert p.stderr.count("above the machine's peak") == 1, p.stderr[-3000:]
    assert all(float(x) <= 100.0 for x in re.findall(r"mfu ([\d.]+)%", p.stderr)), p.stderr[-3000:]
