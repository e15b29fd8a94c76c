"""`deepspeed app/train.py` end to end: real launcher, real processes (CPU, gloo), real data and W&B.

One reference run (P = 2, DP = 1) anchors the equivalence checks: the other layouts (and the interrupted +
resumed run of test_lifecycle.py) must reproduce its per-step losses.
"""

from __future__ import annotations

import importlib.metadata
import json
import math
import re
import shutil

import pytest
import torch
from conftest import FAKE_WANDB_KEY as FAKE_KEY
from conftest import REF_STEPS as STEPS
from in_process import call
from launcher import ROOT, metrics, train, train_losses
from run_files import (
    check_samples,
    check_staged,
    sample_tables,
    samples,
    wandb_artifacts,
    wandb_config,
    wandb_records,
)

import app
from app.train import main as train_main

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
    # a save records the validation loss of its step over the periodic evaluations' batches (the final
    # one's first batch here: --eval-max-batches 1); step 6 had no validation; the lowest is the best
    saved = {t: json.loads((out / "checkpoints" / t / "app_state.json").read_text()) for t in tags}
    assert "validation" not in saved["step_00000006"]
    v8 = saved["step_00000008"]["validation"]
    assert v8["max_batches"] == 1 and math.isfinite(v8["loss"]) and v8["loss"] > 0
    assert final["best_checkpoint"] == {"tag": "step_00000008", "val_loss": v8["loss"]}


def test_runs_record_the_code_version(runs):
    """config.json (also the W&B config), the checkpoints' app state and final_metrics.json name the
    release and, in a git checkout, its commit: the one checked out when the run was launched (tests/runs.py
    notes it: a run kept from an earlier session of the same tree ran at an earlier commit)."""
    run = runs.get("ref")
    out = run.dir
    want = {"version": app.__version__, "git_commit": run.commit}
    assert want["version"] == importlib.metadata.version("mlstm-ds")
    cfg = json.loads((out / "config.json").read_text())
    final = json.loads((out / "final_metrics.json").read_text())
    state = json.loads((out / "checkpoints" / "step_00000008" / "app_state.json").read_text())
    for code in (cfg["code"], final["code"], state["config"]["code"]):
        assert {k: code[k] for k in want} == want


# torch's own line, once per process, where a CUDA build of torch (PyPI's default) runs on a machine with
# nvcc or CUDA_HOME but no GPU: torch.utils.cpp_extension prints it on import (DeepSpeed imports that)
TORCH_CUDA_PROBE = re.compile(
    r"^No CUDA runtime is found, using CUDA_HOME="
    if torch.version.cuda and not torch.cuda.is_available()
    else r"(?!)"
)
OUR_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \[rank \d+\] (DEBUG|INFO|WARNING|ERROR) ")


def test_reference_run_log_is_quiet_and_ours_carry_time_and_rank(reference_run):
    """The log of a real launch (`deepspeed --module app.train`, progress bar left on, stderr a pipe): no
    launcher INFO lines, no per-process accelerator warning, no DeepSpeed start-up prints, no progress-bar
    redraws; every line is ours, with time and rank; the metrics line comes every step (--log-every 1)."""
    _, p = reference_run
    log = p.stdout + p.stderr
    assert "\r" not in log, "progress-bar redraws in a log that is not a terminal"
    for noise in ("[INFO]", "Setting accelerator", "SEED_LAYERS", "Using topology", "built successfully"):
        assert noise not in log, f"{noise!r} in the log:\n{log[-3000:]}"
    lines = [ln for ln in log.splitlines() if ln.strip() and not TORCH_CUDA_PROBE.match(ln)]
    assert lines and all(OUR_LINE.match(ln) for ln in lines), [ln for ln in lines if not OUR_LINE.match(ln)]
    steps = [ln for ln in lines if re.search(r"\[rank 0\] INFO step \d+/8 \| loss", ln)]
    assert len(steps) == int(STEPS), steps
    # the choices a user needs to know about, said once each: which Adam, which time loop
    assert sum("INFO optimizer: torch.optim.AdamW (torch_adam" in ln for ln in lines) == 1, lines
    assert any("INFO mLSTM core on cpu float32: " in ln for ln in lines), lines


def test_wandb_offline_run_has_metrics_and_no_key(reference_run):
    out, p = reference_run
    runs = list((out / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and list(runs[0].glob("*.wandb")), "no offline W&B run file"
    # its last lines say how to upload it
    assert f"W&B run saved offline; to upload it: wandb sync {runs[0]}" in p.stderr, p.stderr[-2000:]
    blob = b"".join(f.read_bytes() for f in runs[0].rglob("*.wandb"))
    assert b"train/loss" in blob and b"val/bpb" in blob
    for f in out.rglob("*"):
        if f.is_file():
            assert FAKE_KEY.encode() not in f.read_bytes(), f"API key leaked into {f}"


def check_wandb_run(out, steps: list[int], scratch, saved: tuple[int, ...] = ()) -> None:
    """The offline W&B run holds config.json as its config, a samples table per validation (the rows of
    samples.jsonl), and model artifacts (a version per save in `saved`, else the final one only): each an
    export of its checkpoint, staged under the run; the last one's weights are the final checkpoint's."""
    from app.checkpoints.export_format import read_export_config, read_weights
    from app.checkpoints.loader import open_source
    from app.checkpoints.training import best_tag, tag_for

    records = wandb_records(out)
    assert wandb_config(records) == json.loads((out / "config.json").read_text())
    tables, local = sample_tables(out), samples(out)
    assert sorted(tables) == steps
    for step in steps:
        assert [(r["prompt"], r["text"], r["stop"]) for r in tables[step]] == [
            (r["prompt"], r["text"], r["stop"]) for r in local[step]
        ]
    *earlier, art = wandb_artifacts(records, "model")
    run_id = next(r.run.run_id for r in records if r.WhichOneof("record_type") == "run")
    assert art.name == f"model-{run_id}" and set(art.aliases) >= {"final", f"step-{steps[-1]}", "latest"}
    # "best": the version whose checkpoint has the lowest validation loss (W&B moves it to the newest given)
    assert ("best" in art.aliases) == (best_tag(out / "checkpoints") == tag_for(steps[-1]))
    assert [set(a.aliases) - {"latest", "best"} for a in earlier] == [{f"step-{s}"} for s in saved[:-1]]
    assert all(
        a.name == art.name and {e.path for e in a.manifest.contents} >= {"model.safetensors"} for a in earlier
    )
    staged = {e.path: check_staged(e) for e in art.manifest.contents}
    assert set(staged) >= {"model.safetensors", "config.json"}
    for path in staged.values():
        assert path.is_relative_to(out / "wandb"), f"{path}: staged outside the run"
    export = scratch / "artifact"  # the staged files laid out as the artifact's folder
    export.mkdir()
    for name, path in staged.items():
        (export / name).write_bytes(path.read_bytes())
    src = open_source(out)
    meta = read_export_config(export)
    assert meta["step"] == steps[-1] == src.step and not meta["source"].startswith("/")
    want, got = src.state_dict(), read_weights(export, src.model_cfg)
    assert want.keys() == got.keys() and all(bool((want[k] == got[k]).all()) for k in want)
    assert not list(out.glob(".artifact-*")), "the temporary export was left behind"


def test_wandb_offline_run_has_config_samples_table_and_model_artifact(reference_run, tmp_path):
    check_wandb_run(reference_run[0], [4, 8], tmp_path)


def test_p1_zero2_dp2_matches_p2(reference_run, runs, tmp_path):
    """P = 1 under the plain engine with ZeRO-2 and DP = 2 (grad_accum 2): same global batches, same curve.

    The DeepSpeed JSON and the accumulation come from a YAML --config file (the stock cpu_zero2.json has a
    different accumulation), so the equal losses show the file's settings reached DeepSpeed (tests/runs.py's
    "p1_zero2_dp2" against "ref")."""
    assert (
        json.loads((ROOT / "ds_configs" / "cpu_zero2.json").read_text())["gradient_accumulation_steps"] != 2
    )
    out = runs.get("p1_zero2_dp2").dir
    recorded = json.loads((out / "config.json").read_text())
    assert recorded["deepspeed"]["gradient_accumulation_steps"] == recorded["train"]["grad_accum"] == 2
    ref, got = train_losses(reference_run[0]), train_losses(out)
    assert got.keys() == ref.keys()
    for s in ref:
        assert got[s] == pytest.approx(ref[s], rel=2e-5, abs=2e-5), s
    check_samples(out, [4, 8])  # P = 1: the samples are rank 0's own replica's
    check_wandb_run(out, [4, 8], tmp_path, saved=(4, 8))


def test_p2_dp2_matches_p2_dp1_with_double_accumulation(reference_run, pp2_dp2_run):
    """4 processes: 2 stages x 2 ZeRO-1 replicas, grad_accum 2 == 1 replica with grad_accum 4."""
    ref, got = train_losses(reference_run[0]), train_losses(pp2_dp2_run)
    assert got.keys() == ref.keys()
    for s in ref:
        assert got[s] == pytest.approx(ref[s], rel=2e-5, abs=2e-5), s
    assert json.loads((pp2_dp2_run / "config.json").read_text())["layout"]["data_parallel"] == 2


def test_tied_embeddings_p2_matches_p1_loss_and_grad_norm(runs):
    """The tied embedding lives on both stages at P = 2; the clipping norm must count it once, as at P = 1
    (tests/runs.py's "tied_p1", a plain single-process run, against "tied_p2")."""
    tied = {}
    for stages in (1, 2):
        out = runs.get(f"tied_p{stages}").dir
        tied[stages] = {m["step"]: m for m in metrics(out) if "train/loss" in m}
        assert not (out / "wandb").exists() and not (out / "plots").exists()  # W&B disabled, --plots false
    assert sorted(tied[2]) == [1, 2, 3]
    for s, m in tied[1].items():
        for key in ("train/loss", "train/grad_norm"):
            assert tied[2][s][key] == pytest.approx(m[key], rel=1e-5), (s, key)


def test_resume_in_another_precision_is_one_clear_line(reference_run, prepared_dir, tmp_path, capsys):
    """The reference run (fp32) resumed in bf16: refused before anything is touched, not a traceback.
    (Another P, DP or ZeRO stage resumes: tests/test_checkpoints_universal.py.)"""
    out = tmp_path / "copy"
    shutil.copytree(reference_run[0], out)

    def files():  # run.lock is rewritten by every run that takes it (it names the holder), and a refused
        # run leaves its traceback in logs/rank<R>.log (the line names it): neither is the run's work
        return {
            f: f.read_bytes()
            for f in out.rglob("*")
            if f.is_file() and f.name != "run.lock" and f.parent != out / "logs"
        }

    before = files()
    ran = call(train_main, ["--deepspeed_config", ROOT / "ds_configs" / "cpu_pp2_zero1.json", "--data",
                            prepared_dir, "--pipeline-stages", "1", "--out", out, "--model-config", "debug",
                            "--precision", "bf16"], capsys)  # fmt: skip
    err = ran.error_line("resumes only in the precision")
    assert "'fp32'" in err and "'bf16'" in err, err
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
def test_bad_input_is_one_clear_line(case, needle, prepared_dir, tmp_path, capsys):
    """`app/train.py`'s main in this process (tests/in_process.py): one `error:` line, exit status 2."""
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
    argv = ["--deepspeed_config", tmp_path / "c.json", "--data", data, "--pipeline-stages", stages,
            "--out", tmp_path / "run", *extra]  # fmt: skip
    call(train_main, argv, capsys).error_line(needle)
