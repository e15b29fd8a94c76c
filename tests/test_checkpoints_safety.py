"""Issue 12: run directories someone handed you never execute code, one run per directory, nothing damaged
silently, resume refuses what it should. Real DeepSpeed processes on copies of the shared reference run."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from in_process import Ran, call
from launcher import ROOT, train, train_args
from launcher import metrics as launcher_metrics
from run_files import samples

from app.checkpoints import resume as resume_check
from app.checkpoints import training as ckpt
from app.checkpoints.run_lock import acquire_run_lock
from app.checkpoints.safety import weights_only_loads
from app.common.errors import UserError
from app.train import main as train_main

LATEST = "step_00000008"
PREVIOUS = "step_00000006"


class _Payload:
    """Unpickling this runs `open(marker, "w")`: a file appears if any loader executes the pickle."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def write_payload(path: Path, marker: Path) -> None:
    torch.save({"optimizer_state_dict": _Payload(marker)}, path)


def copy_run(reference_run, dest: Path) -> Path:
    shutil.copytree(reference_run[0], dest, symlinks=True)
    return dest


def remanifest(tag_dir: Path) -> None:
    """What an attacker would do: rewrite COMPLETE so it matches the crafted files."""
    files = {
        str(p.relative_to(tag_dir)): {"size": p.stat().st_size, "sha256": ckpt.sha256_file(p)}
        for p in sorted(tag_dir.rglob("*"))
        if p.is_file() and p.name != ckpt.COMPLETE
    }
    (tag_dir / ckpt.COMPLETE).write_text(json.dumps({"files": files}))


def one_error_line(p: subprocess.CompletedProcess | Ran, needle: str) -> str:
    assert p.returncode != 0, p.stderr[-3000:]
    errors = [ln for ln in p.stderr.splitlines() if "error: " in ln]
    assert errors and needle in errors[0], p.stderr[-4000:]
    assert "Traceback" not in p.stderr, p.stderr[-4000:]
    return errors[0]


def resume(prepared_dir: Path, out: Path, *extra: str, data: Path | None = None):
    """The reference run's 2 stages on 2 ranks under the launcher, resumed to step 9."""
    return train(
        2, data or prepared_dir, out, "--max-steps", "9", "--wandb-mode", "disabled", *extra, check=False
    )


def refused(prepared_dir: Path, out: Path, capsys, *extra: str, data: Path | None = None) -> Ran:
    """The same command as one plain process, its main called in this one (tests/in_process.py): for
    refusals rank 0 makes before any stage's weights are read (the lock, the resume tag, model / tokenizer
    / data identity, the data's splits), which come before the check that the stage layout matches the
    checkpoint's."""
    argv = train_args(
        data or prepared_dir, out, "--max-steps", "9", "--wandb-mode", "disabled", *extra, stages=1
    )
    return call(train_main, argv, capsys)


# ---------------------------------------------------------------- no code execution


def test_resume_refuses_a_pickle_payload(reference_run, prepared_dir, tmp_path):
    out = copy_run(reference_run, tmp_path / "run")
    marker = tmp_path / "PWNED"
    tag = out / "checkpoints" / LATEST
    write_payload(tag / "zero_pp_rank_0_mp_rank_00_optim_states.pt", marker)
    remanifest(tag)
    p = resume(prepared_dir, out)
    one_error_line(p, "refused to load")
    assert not marker.exists(), "the checkpoint's pickle was executed"


def test_evaluate_generate_export_refuse_a_pickle_payload(reference_run, prepared_dir, tmp_path, capsys):
    out = copy_run(reference_run, tmp_path / "run")
    marker = tmp_path / "PWNED"
    tag = out / "checkpoints" / LATEST
    write_payload(tag / "layer_00-model_states.pt", marker)  # the weights these entry points read
    remanifest(tag)
    for main, extra in entry_points(prepared_dir, tmp_path):
        assert main(["--checkpoint", str(out), *extra]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "refused to load" in err[0], (main.__module__, err)
    assert not marker.exists(), "the checkpoint's pickle was executed"


def entry_points(prepared_dir: Path, tmp_path: Path) -> list:
    from app.evaluate import main as evaluate_main
    from app.export import main as export_main
    from app.generate import main as generate_main

    return [
        (evaluate_main, ["--data", str(prepared_dir)]),
        (generate_main, ["--prompt", "a", "--max-new-tokens", "2"]),
        (export_main, ["--out", str(tmp_path / "exp")]),
    ]


def test_deepspeeds_own_loads_are_forced_weights_only(tmp_path):
    """The guard around load_checkpoint: a caller asking for weights_only=False is refused all the same."""
    marker = tmp_path / "PWNED"
    write_payload(tmp_path / "evil.pt", marker)
    with weights_only_loads(), pytest.raises(UserError, match="weights-only"):
        torch.load(tmp_path / "evil.pt", weights_only=False)
    assert not marker.exists()
    assert torch.load.__module__ == "torch.serialization"  # restored after the block


def test_symlink_out_of_the_run_is_refused_everywhere(reference_run, prepared_dir, tmp_path, capsys):
    out = copy_run(reference_run, tmp_path / "run")
    secret = tmp_path / "elsewhere.model"
    shutil.copyfile(out / "checkpoints" / LATEST / "tokenizer.model", secret)
    link = out / "checkpoints" / LATEST / "tokenizer.model"
    link.unlink()
    link.symlink_to(secret)
    remanifest(link.parent)
    for main, extra in entry_points(prepared_dir, tmp_path):
        assert main(["--checkpoint", str(out), *extra]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "points outside" in err[0], (main.__module__, err)
    one_error_line(refused(prepared_dir, out, capsys), "points outside")


def test_meta_json_tokenizer_path_elsewhere_is_refused(reference_run, prepared_dir, tmp_path, capsys):
    from app.evaluate import main as evaluate_main

    data = tmp_path / "data"
    shutil.copytree(prepared_dir, data)
    meta = json.loads((data / "meta.json").read_text())
    meta["tokenizer"]["model_file"] = str(prepared_dir / "tokenizer.model")  # absolute, outside
    (data / "meta.json").write_text(json.dumps(meta))
    args = ["--checkpoint", str(reference_run[0]), "--data", str(data)]
    assert evaluate_main(args) == 2
    assert "model_file" in capsys.readouterr().err
    one_error_line(refused(prepared_dir, tmp_path / "fresh", capsys, data=data), "model_file")


def test_resume_takes_a_tag_under_out_only(reference_run, prepared_dir, tmp_path, capsys):
    out = copy_run(reference_run, tmp_path / "run")
    other = str(reference_run[0] / "checkpoints" / PREVIOUS)
    one_error_line(refused(prepared_dir, out, capsys, "--resume", other), "expected a tag under --out")


# ---------------------------------------------------------------- one run per directory


def test_second_run_fails_fast_naming_the_holder_and_a_dead_holders_lock_is_taken_over(
    prepared_dir, tmp_path, capsys
):
    out = tmp_path / "run"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys,time; from pathlib import Path; "
         "from app.checkpoints.run_lock import acquire_run_lock as a; f = a(Path(sys.argv[1])); "
         "print('held', flush=True); time.sleep(600)", str(out)],
        cwd=ROOT, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "held"
        line = one_error_line(refused(prepared_dir, out, capsys), "another run is using")
        assert f"pid {holder.pid}" in line
        os.kill(holder.pid, signal.SIGKILL)  # dies holding it: the kernel releases a flock with its owner
        holder.wait(timeout=30)
        f = acquire_run_lock(out)
        assert json.loads((out / "run.lock").read_text())["pid"] == os.getpid()
        f.close()
    finally:
        if holder.poll() is None:
            holder.kill()


# ---------------------------------------------------------------- integrity


def test_same_size_corruption_falls_back_and_is_moved_aside(reference_run, prepared_dir, tmp_path):
    out = copy_run(reference_run, tmp_path / "run")
    f = out / "checkpoints" / LATEST / "layer_01-model_states.pt"
    blob = bytearray(f.read_bytes())
    blob[len(blob) // 2] ^= 0xFF  # same size: the old size-only manifest accepted it
    f.write_bytes(bytes(blob))
    p = resume(prepared_dir, out)
    assert p.returncode == 0, p.stderr[-4000:]
    assert "is damaged" in p.stderr and "falling back" in p.stderr
    assert f"resumed from {out / 'checkpoints' / PREVIOUS}" in p.stderr
    assert (out / "checkpoints" / "damaged" / LATEST / f.name).is_file()  # kept, not deleted


def test_explicit_resume_repoints_latest_at_once(reference_run, tmp_path):
    root = copy_run(reference_run, tmp_path / "run") / "checkpoints"
    assert resume_check.pick_resume_tag(root, PREVIOUS) == PREVIOUS
    assert (root / "latest").read_text().strip() == PREVIOUS  # a crash now restarts from it


def test_prune_moves_a_damaged_checkpoint_aside_and_rewrite_invalidates_first(reference_run, tmp_path):
    root = copy_run(reference_run, tmp_path / "run") / "checkpoints"
    (root / "latest").write_text(PREVIOUS)
    with open(root / LATEST / "app_state.json", "a") as f:
        f.write(" ")  # size changes: incomplete, but it has a manifest
    assert ckpt.prune(root, keep_last=1) == []
    assert (root / "damaged" / LATEST).is_dir() and not (root / LATEST).exists()
    ckpt.invalidate(root, PREVIOUS)
    assert not ckpt.is_complete(root / PREVIOUS)


# ---------------------------------------------------------------- resume compatibility


@pytest.mark.parametrize("change", ["width", "residual", "tokenizer", "data"])
def test_resume_refuses_another_model_tokenizer_or_data(
    reference_run, prepared_dir, tmp_path, change, capsys
):
    out = copy_run(reference_run, tmp_path / "run")
    data, extra, needle = (
        prepared_dir,
        [],
        {
            "width": "model config",
            "residual": "residual",
            "tokenizer": "another tokenizer",
            "data": "other data",
        }[change],
    )
    if change in ("tokenizer", "data"):
        data = tmp_path / "data"
        shutil.copytree(prepared_dir, data)
        if change == "tokenizer":  # another valid model of the same size: an unknown protobuf field added
            with open(data / "tokenizer.model", "ab") as f:
                f.write(b"\xa0\x06\x01")
        else:
            meta = json.loads((data / "meta.json").read_text())
            meta["note"] = "re-prepared"
            (data / "meta.json").write_text(json.dumps(meta))
    elif change == "width":
        extra = ["model.hidden_dim=96"]
    else:
        extra = ["model.residual=true"]
    one_error_line(refused(prepared_dir, out, capsys, *extra, data=data), needle)


# ---------------------------------------------------------------- edges


def test_wrongly_typed_deepspeed_json_is_one_line_naming_the_key(prepared_dir, tmp_path, capsys):
    cfg = json.loads((ROOT / "ds_configs" / "cpu_pp2_zero1.json").read_text())
    cfg["bf16"] = True
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(cfg))
    argv = train_args(prepared_dir, tmp_path / "run", "--max-steps", "1", stages=1, config=path)
    one_error_line(call(train_main, argv, capsys), "`bf16` must be a JSON object")


def test_empty_validation_split_is_one_line(prepared_dir, tmp_path, capsys):
    data = tmp_path / "data"
    shutil.copytree(prepared_dir, data)
    meta = json.loads((data / "meta.json").read_text())
    meta["splits"]["validation"] = {"docs": 0, "examples": 0, "tokens": 0, "bytes": 0}
    (data / "meta.json").write_text(json.dumps(meta))
    shutil.rmtree(data / "validation")
    (data / "validation").mkdir()  # what data_prep leaves for a one-book corpus
    one_error_line(refused(prepared_dir, tmp_path / "run", capsys, data=data), "validation split is empty")


def test_resume_after_torn_metrics_line_with_redacted_secret_and_wandb_rewound(
    reference_run, prepared_dir, tmp_path
):
    """Resume at step 6 of a run that logged up to 8, with a torn last metrics line and a credential in
    the DeepSpeed JSON: the line is dropped with a warning, the secret is in no copy, W&B is rewound to 6."""
    out = copy_run(reference_run, tmp_path / "run")
    with open(out / "metrics.jsonl", "a") as f:
        f.write('{"step": 9, "train/lo')  # killed mid-write
    cfg = json.loads((ROOT / "ds_configs" / "cpu_pp2_zero1.json").read_text())
    cfg["monitor_api_key"] = "SECRET-0123456789"
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(cfg))
    p = train(
        2, prepared_dir, out, "--max-steps", "9", "--resume", PREVIOUS, "--wandb-mode", "offline",
        config=path, check=False,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr[-4000:]
    assert "dropped 1 unreadable line" in p.stderr
    newest = max((out / "wandb").glob("offline-run-*"), key=lambda d: d.stat().st_mtime)
    blob = b"".join(f.read_bytes() for f in newest.glob("*.wandb"))  # offline: config + history in here
    for text in [
        (out / "config.json").read_bytes(),
        (out / "checkpoints" / "step_00000009" / "app_state.json").read_bytes(),
        blob,
    ]:
        assert b"SECRET-0123456789" not in text and b"<redacted>" in text
    steps = [m["step"] for m in launcher_metrics(out) if "train/loss" in m]
    assert steps == sorted(steps) and steps[-3:] == [7, 8, 9]  # re-run steps replace the old ones
    assert sorted(samples(out)) == [4, 9]  # samples.jsonl cut back to step 6 as well, then step 9's
    run_id = json.loads((out / "checkpoints" / PREVIOUS / "app_state.json").read_text())["wandb_id"]
    # W&B rewound to 6 (the record's JSON spacing differs between wandb releases)
    assert re.search(rb'"branch_point":\s*\{"run_id":\s*"%s",\s*"step":\s*6\}' % run_id.encode(), blob)
    assert all(d.name.endswith(run_id) for d in (out / "wandb").glob("offline-run-*"))  # one W&B run
    for m in launcher_metrics(out):
        if m["step"] > 6 and "train/loss" in m:
            assert json.dumps(m["train/loss"]).encode() in blob, m  # W&B got the values metrics.jsonl has
