"""bench/train_gpu.py and bench/step_phases.py at a tiny size on the CPU: a step split into its phases as a
plain loop and under the app's DeepSpeed engine, side by side, with DeepSpeed's extra time per phase and the
step's costliest operators; the first-step line of a run log read into its phases."""

import json
import subprocess
import sys

from launcher import ROOT, env

sys.path.append(str(ROOT / "bench"))  # after the root: bench/data_prep.py must not hide the package
import step_phases
import train_gpu

from app.common.phase_clock import ORDER


def test_the_phase_split_runs_on_the_cpu_plain_and_under_deepspeed_side_by_side():
    cmd = [sys.executable, "bench/train_gpu.py", "--runs", "", "--phase-split", "debug", "--device", "cpu",
           "--seq-len", "16", "--profile"]  # fmt: skip
    p = subprocess.run(
        cmd, cwd=ROOT, env=env(PYTHONPATH=str(ROOT)), capture_output=True, text=True, timeout=600
    )
    assert p.returncode == 0, p.stderr[-3000:]
    got = json.loads(p.stdout.strip().splitlines()[-1])["phase_split"]["debug"]
    assert (got["batch"], got["seq_len"], got["device"]) == (4, 16, "cpu")
    for way in ("plain", "deepspeed"):
        ms = got[way]["ms"]
        assert list(ms) == list(step_phases.NAMES) and all(v >= 0 for v in ms.values()), ms
        assert got[way]["step_ms"] == round(sum(ms.values()), 3) and ms["backward"] > 0
    extra = got["deepspeed_extra_ms"]
    assert all(
        extra[n] == round(got["deepspeed"]["ms"][n] - got["plain"]["ms"][n], 3) for n in step_phases.NAMES
    )
    assert got["deepspeed"]["top_kernels_us"] and all(
        v > 0 for v in got["deepspeed"]["top_kernels_us"].values()
    )


def test_an_unknown_run_is_one_line():
    p = subprocess.run([sys.executable, "bench/train_gpu.py", "--phase-split", "huge", "--dry-run"], cwd=ROOT,
                       env=env(PYTHONPATH=str(ROOT)), capture_output=True, text=True, timeout=120)  # fmt: skip
    assert p.returncode != 0 and "unknown ['huge']" in p.stderr.strip().splitlines()[-1]


def test_a_run_logs_first_step_line_is_read_into_its_phases():
    log = (
        "2026-11-28 10:00:00 [rank 0] INFO mLSTM core on cpu float32: cpu-fused\n"
        "2026-11-28 10:00:01 [rank 0] INFO first step 20.5 s after launch: imports 6.0 s, plan 1.0 s, "
        "deepspeed initialised 9.0 s, data ready 0.5 s, first forward 3.0 s, first step 1.0 s\n"
    )
    got = train_gpu._first_step_phases(log)
    assert got["first_step_s"] == 20.5 and list(got["phases"]) == list(ORDER[1:])
    assert got["phases"]["deepspeed initialised"] == 9.0
    assert train_gpu._first_step_phases("no such line") is None
