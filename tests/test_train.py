"""`deepspeed app/train.py` end to end: real launcher, real processes (CPU, gloo), real data and W&B.

One reference run (P = 2, DP = 1) anchors the equivalence checks: the other layouts (and the interrupted +
resumed run of test_lifecycle.py) must reproduce its per-step losses.
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys

import pytest
from conftest import FAKE_WANDB_KEY as FAKE_KEY
from conftest import REF_STEPS as STEPS
from launcher import ROOT, metrics, train, train_losses

pytestmark = pytest.mark.slow


def test_reference_run_learns_and_writes_everything(reference_run):
    out, _ = reference_run
    losses = train_losses(out)
    assert sorted(losses) == list(range(1, 9))
    recs = metrics(out)
    sanity = next(m for m in recs if "sanity/loss" in m)["sanity/loss"]
    final = json.loads((out / "final_metrics.json").read_text())
    assert final["val/loss"] < sanity - 0.05, (sanity, final)
    assert math.isfinite(final["test/bpb"]) and final["test/bpb"] > 0
    assert all(m["train/skipped_steps"] == 0 for m in recs if "train/loss" in m)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["layout"]["stages"] == 2 and cfg["layout"]["grad_accum"] == 4
    # --partition-method time (default): measured costs, one per layer, and the split they gave
    assert len(cfg["layer_costs"]) == 4 and all(c > 0 for c in cfg["layer_costs"])
    assert cfg["partition"][0] == 0 and cfg["partition"][-1] == 4 and len(cfg["partition"]) == 3
    # keep-last 2 of saves at 3, 6 and the final 8
    tags = sorted(d.name for d in (out / "checkpoints").iterdir() if d.is_dir())
    assert tags == ["step_00000006", "step_00000008"]
    assert (out / "checkpoints" / "latest").read_text() == "step_00000008"


def test_wandb_offline_run_has_metrics_and_no_key(reference_run):
    out, _ = reference_run
    runs = list((out / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and list(runs[0].glob("*.wandb")), "no offline W&B run file"
    blob = b"".join(f.read_bytes() for f in runs[0].rglob("*.wandb"))
    assert b"train/loss" in blob and b"val/bpb" in blob
    for f in out.rglob("*"):
        if f.is_file():
            assert FAKE_KEY.encode() not in f.read_bytes(), f"API key leaked into {f}"


def test_p1_zero2_dp2_matches_p2(reference_run, prepared_dir, tmp_path):
    """P = 1 under the plain engine with ZeRO-2 and DP = 2 (grad_accum 2): same global batches, same curve."""
    cfg = json.loads((ROOT / "ds_configs" / "cpu_zero2.json").read_text())
    cfg["gradient_accumulation_steps"] = 2  # 2 x DP 2 = the reference's 4 micro-batches per step
    path = tmp_path / "zero2.json"
    path.write_text(json.dumps(cfg))
    out = tmp_path / "p1"
    train(2, prepared_dir, out, "--max-steps", STEPS, "--eval-every", "4", "--wandb-mode", "disabled",
          stages=1, config=path)  # fmt: skip
    ref, got = train_losses(reference_run[0]), train_losses(out)
    assert got.keys() == ref.keys()
    for s in ref:
        assert got[s] == pytest.approx(ref[s], rel=2e-5, abs=2e-5), s
    assert not (out / "wandb").exists()


def test_p2_dp2_matches_p2_dp1_with_double_accumulation(reference_run, pp2_dp2_run):
    """4 processes: 2 stages x 2 ZeRO-1 replicas, grad_accum 2 == 1 replica with grad_accum 4."""
    ref, got = train_losses(reference_run[0]), train_losses(pp2_dp2_run)
    assert got.keys() == ref.keys()
    for s in ref:
        assert got[s] == pytest.approx(ref[s], rel=2e-5, abs=2e-5), s
    assert json.loads((pp2_dp2_run / "config.json").read_text())["layout"]["data_parallel"] == 2


def test_tied_embeddings_p2_matches_p1_loss_and_grad_norm(prepared_dir, tmp_path):
    """The tied embedding lives on both stages at P = 2; the clipping norm must count it once, as at P = 1."""
    common = ("--max-steps", "3", "--eval-every", "0", "--wandb-mode", "disabled", "--test-eval", "false",
              "model.tie_embeddings=true", "model.embed_dim=64")  # fmt: skip
    runs = {}
    for stages in (1, 2):
        out = tmp_path / f"tied_p{stages}"
        train(stages, prepared_dir, out, *common, stages=stages)
        runs[stages] = {m["step"]: m for m in metrics(out) if "train/loss" in m}
    assert sorted(runs[2]) == [1, 2, 3]
    for s, m in runs[1].items():
        for key in ("train/loss", "train/grad_norm"):
            assert runs[2][s][key] == pytest.approx(m[key], rel=1e-5), (s, key)


def test_resume_in_another_layout_is_one_clear_line(reference_run, prepared_dir, tmp_path):
    """The reference run (P = 2) resumed at P = 1: refused before anything is touched, not a traceback."""
    out = tmp_path / "copy"
    shutil.copytree(reference_run[0], out)

    def files():  # run.lock is rewritten by every run that takes it (it names the holder)
        return {f: f.read_bytes() for f in out.rglob("*") if f.is_file() and f.name != "run.lock"}

    before = files()
    p = run_single(["--deepspeed_config", str(ROOT / "ds_configs" / "cpu_pp2_zero1.json"), "--data",
                    str(prepared_dir), "--pipeline-stages", "1", "--out", str(out), "--model-config", "debug"])  # fmt: skip
    err = [ln for ln in p.stderr.splitlines() if ln.startswith("error:")]
    assert p.returncode == 2 and len(err) == 1, p.stderr[-2000:]
    assert "'stages': 2" in err[0] and "'stages': 1" in err[0] and "resumes only in the layout" in err[0]
    assert "Traceback" not in p.stderr
    assert before == files(), "the run directory changed"


def test_non_finite_steps_are_skipped_on_every_rank_then_stop(prepared_dir, tmp_path):
    out = tmp_path / "nan"
    p = train(
        2,
        prepared_dir,
        out,
        "--max-steps",
        STEPS,
        "--max-consecutive-skips",
        "2",
        "--wandb-mode",
        "disabled",
        extra_env={"MLSTM_DS_FAULTS": "nan_step=2,nan_step=4,nan_step=5"},
        check=False,
    )
    assert p.returncode != 0
    assert "2 consecutive non-finite steps" in p.stderr
    recs = {m["step"]: m for m in metrics(out) if "train/loss" in m}
    assert [recs[s]["train/skipped_steps"] for s in (1, 2, 3, 4, 5)] == [0, 1, 1, 2, 3]
    assert math.isfinite(recs[3]["train/loss"]) and 6 not in recs
    assert "Traceback" not in p.stderr


def run_single(args: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ROOT / "app" / "train.py"), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize(
    "case, needle",
    [
        ("missing_data", "--data: "),
        ("bad_json", "invalid JSON"),
        ("stages_vs_world", "--pipeline-stages 2 does not divide the world size 1"),
        ("bad_batch", "train_batch_size 30"),
        ("bad_model", "hidden_dim"),
    ],
)
def test_bad_input_is_one_clear_line(case, needle, prepared_dir, tmp_path):
    cfg = json.loads((ROOT / "ds_configs" / "cpu_pp2_zero1.json").read_text())
    data, stages, extra = str(prepared_dir), "1", []
    if case == "missing_data":
        data = str(tmp_path / "nope")
    elif case == "bad_json":
        (tmp_path / "c.json").write_text('{\n "train_micro_batch_size_per_gpu": 8,,\n}')
    elif case == "stages_vs_world":
        stages = "2"
    elif case == "bad_batch":
        cfg["train_batch_size"] = 30
    elif case == "bad_model":
        extra = ["model.hidden_dim=0"]
    if case != "bad_json":
        (tmp_path / "c.json").write_text(json.dumps(cfg))
    p = run_single(
        [
            "--deepspeed_config",
            str(tmp_path / "c.json"),
            "--data",
            data,
            "--pipeline-stages",
            stages,
            "--out",
            str(tmp_path / "run"),
            *extra,
        ]
    )
    err = [ln for ln in p.stderr.splitlines() if ln.startswith("error:")]
    assert p.returncode == 2, p.stderr[-2000:]
    assert len(err) == 1 and needle in err[0], p.stderr[-2000:]
    assert "Traceback" not in p.stderr
