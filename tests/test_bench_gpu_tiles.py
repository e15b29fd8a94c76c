"""bench/gpu_tiles.py: the tuner's ranking with today's and the l2 tilings side by side (a GPU session's step),
run here in Triton's interpreter at a tiny shape."""

import json
import os
import subprocess
import sys

import pytest
from launcher import ROOT

sys.path.append(str(ROOT / "bench"))  # after the root: bench/data_prep.py must not hide the package
import gpu_tiles  # bench/gpu_tiles.py


def test_old_over_new_is_the_best_of_todays_persistent_tilings_over_the_l2_one():
    times = {"fwd/persistent": 9.0, "fwd/persistent-l2": 6.0, "bwd/persistent": 12.0, "bwd/splitk": 8.0,
             "bwd/persistent-l2": 6.4, "loop/fwd/persistent": 6.0, "loop/fwd/persistent-l2": 4.0,
             "bwd/cublas": 1.0, "loop/bwd/splitk": "RuntimeError: no"}  # fmt: skip
    assert gpu_tiles.ratios(times) == {"op/fwd": 1.5, "op/bwd": 1.25, "loop/fwd": 1.5}
    assert gpu_tiles.ratios({"fwd/persistent": 1.0}) == {}  # no l2 candidate at this shape


@pytest.mark.long
def test_the_interpreter_run_ranks_both_tilings_and_prints_a_json_line(tmp_path):
    env = dict(os.environ, TRITON_INTERPRET="1", MLSTM_MATMUL="mm", TRITON_CACHE_DIR=str(tmp_path / "triton"),
               PYTHONPATH=str(ROOT))  # fmt: skip
    p = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_tiles.py"), "--device", "cpu", "--shapes", "16x20",
                        "--steps", "2", "--reps", "1"], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=600)  # fmt: skip
    assert p.returncode == 0, p.stderr[-3000:]
    out = json.loads(p.stdout.strip().splitlines()[-1])
    (row,) = out["shapes"]
    assert {"persistent", "persistent-l2"} <= set(row["fwd"]) and "splitk" in row["bwd"], row
    assert set(row["old_over_new"]) == {"op/fwd", "op/bwd", "loop/fwd", "loop/bwd"}, row
    assert "ranked the mLSTM core's GPU loops for B16 H20 bfloat16 (ms for T=2: whole op" in p.stdout
    assert out["device"] == "triton interpreter" and out["bench"] == "gpu_tiles"


def test_a_cpu_run_outside_the_interpreter_is_refused_in_one_line():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    p = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_tiles.py"), "--device", "cpu"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=120)  # fmt: skip
    assert (
        p.returncode == 2
        and "--device cpu runs only in Triton's interpreter" in p.stderr.strip().splitlines()[-1]
    )
