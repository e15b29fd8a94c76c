"""PipelineModule (P=4 tied; P=2 x dp=2 untied, changing lengths) vs the sequential module.

One deepspeed launch of 4 CPU processes runs tests/dist/model_pipe_parity.py; this reads its per-rank
JSON results. Everything else about the model is tested in-process in test_model.py.
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from launcher import ROOT, deepspeed_cmd

WORLD = 4
# `long`: a launch of 4 ranks; the named runs compare pipelined with plain training end to end (tests/runs.py:
# tied_p1 with tied_p2, ref with p1_zero2_dp2 and dp2, their losses and clipping norms); what only this file runs
# is every parameter's gradient at P = 4 (tied) and P = 2 x DP = 2 against the sequential module, and the
# checkpoint layout of a tied embedding
pytestmark = pytest.mark.long


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> list[list[dict]]:
    out = tmp_path_factory.mktemp("pipe")
    env = dict(os.environ, PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1")
    # a free port, registered so the session's end unlinks DeepSpeed's /dev/shm buffers of killed ranks
    cmd = deepspeed_cmd(WORLD, "tests/dist/model_pipe_parity.py", ["--out_dir", str(out)])
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(WORLD)]


@pytest.mark.slow
@pytest.mark.parametrize("phase", [0, 1], ids=["p4_tied", "p2_dp2_untied"])
def test_pipeline_matches_sequential(results, phase):
    ranks = [r[phase] for r in results]
    stages = {r["stage"] for r in ranks}
    assert stages == set(range(len(ranks[0]["parts"]) - 1)), "every stage ran"
    for r in ranks:
        assert r["weights_match"], f"rank {r['rank']}: pipeline weights differ from sequential (seeding)"
        assert r["n_params"] > 0
        for s in r["steps"]:
            assert abs(s["ds_loss"] - s["ref_loss"]) < 1e-5 * abs(s["ref_loss"]), (r["rank"], s)
            assert s["grad_scale"] > 0
            assert s["grad_err"] <= 1e-4 * s["grad_scale"], (r["rank"], s)


@pytest.mark.slow
def test_pipeline_partitions_and_checkpoint_layout(results):
    p4, p2 = results[0][0], results[0][1]
    assert p4["parts"] == [0, 1, 2, 3, 4]  # 4 layers on 4 stages
    # cost partition of [embed, 3 mLSTM, head]: embedding + first two mLSTMs | third mLSTM + head
    assert p2["parts"] == [0, 3, 5]
    # Tied embedding: stored once, as layer_00 (the head slot runs a function of it and has no file).
    assert p4["ckpt"] == {
        "layer_00-model_states.pt": ["weight"],
        "layer_01-model_states.pt": [
            "bias",
            "gain_in",
            "gain_m",
            "gain_mh",
            "weight_in",
            "weight_m",
            "weight_mh",
        ],
        "layer_02-model_states.pt": [
            "bias",
            "gain_in",
            "gain_m",
            "gain_mh",
            "weight_in",
            "weight_m",
            "weight_mh",
        ],
    }
