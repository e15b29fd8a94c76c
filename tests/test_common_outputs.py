"""app/common/outputs.py: the one door every command writes through (the commands' cases: tests/test_safety.py)."""

from __future__ import annotations

import csv
import hashlib
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from app.common import outputs
from app.common.errors import UserError


def test_an_output_that_is_an_input_or_holds_one_is_refused(tmp_path):
    data = tmp_path / "shards"
    data.mkdir()
    part = data / "part-00000.csv"
    part.write_text("text\nhello\n")
    with pytest.raises(UserError, match="is the --input"):
        outputs.check([outputs.file("--output", part)], [("--input", part)])
    with pytest.raises(UserError, match="holds the --input"):
        outputs.check([outputs.folder("--work-dir", data)], [("--input", part)])
    os.link(part, tmp_path / "hard.csv")  # one inode, two names
    with pytest.raises(UserError, match="is the --input"):
        outputs.check([outputs.file("--output", tmp_path / "hard.csv")], [("--input", part)])
    (tmp_path / "link.csv").symlink_to(part)
    with pytest.raises(UserError, match="is the --input"):
        outputs.check([outputs.file("--output", tmp_path / "link.csv")], [("--input", part)])
    # an output file inside an input folder is not the input (evaluate's <run>/eval/<tag>.json)
    outputs.check([outputs.file("--out", data / "eval" / "x.json")], [("--checkpoint", data)])


def test_a_folder_where_a_file_is_meant_and_the_reverse_are_refused(tmp_path):
    (tmp_path / "labels.csv").mkdir()
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(UserError, match="is a folder"):
        outputs.check([outputs.file("--output", tmp_path / "labels.csv")])
    with pytest.raises(UserError, match="is a file, not a folder"):
        outputs.check([outputs.folder("--out", tmp_path / "notes.txt")])
    with pytest.raises(UserError, match=r"notes\.txt is a file, not a folder"):
        outputs.check([outputs.file("--output", tmp_path / "notes.txt" / "labels.csv")])
    with pytest.raises(UserError, match="name the same path"):
        outputs.check(
            [outputs.file("--output", tmp_path / "a.csv"), outputs.folder("--work-dir", tmp_path / "a.csv")]
        )


def test_new_file_is_whole_or_absent(tmp_path):
    out = tmp_path / "sub" / "labels.csv"
    with outputs.new_file(out) as tmp:
        assert tmp.suffix == ".csv" and tmp.parent == out.parent
        tmp.write_text("a\n")
        assert not out.exists()
    assert out.read_text() == "a\n"
    with pytest.raises(KeyboardInterrupt), outputs.new_file(out) as tmp:
        tmp.write_text("half")
        raise KeyboardInterrupt
    assert out.read_text() == "a\n" and sorted(p.name for p in out.parent.iterdir()) == ["labels.csv"]


def test_new_folder_replaces_only_what_its_mark_lists(tmp_path):
    final = tmp_path / "export"
    with outputs.new_folder(final, "mlstm-export", last="config.json") as stage:
        assert not final.exists()
        for name in ("model.safetensors", "tokenizer.model", "config.json"):
            (stage / name).write_text(f"v1 {name}")
    assert outputs.read_mark(final)["files"] == ["config.json", "model.safetensors", "tokenizer.model"]
    (final / "eval").mkdir()
    (final / "notes.txt").write_text("the user's")
    with outputs.new_folder(final, "mlstm-export", last="config.json") as stage:
        for name in ("model.safetensors", "config.json"):
            (stage / name).write_text(f"v2 {name}")
    names = sorted(p.name for p in final.iterdir())
    assert names == [outputs.MARK, "config.json", "eval", "model.safetensors", "notes.txt"]
    assert (final / "config.json").read_text() == "v2 config.json" and (
        final / "notes.txt"
    ).read_text() == "the user's"
    with pytest.raises(OSError), outputs.new_folder(final, "mlstm-export", last="config.json") as stage:
        (stage / "model.safetensors").write_text("v3 half")
        raise OSError(28, "No space left on device")
    assert (final / "model.safetensors").read_text() == "v2 model.safetensors"
    assert sorted(p.name for p in final.iterdir()) == names


def test_a_foreign_folder_is_used_through_a_subfolder_and_removal_takes_only_what_is_listed(tmp_path):
    mine = tmp_path / "shards"
    mine.mkdir()
    (mine / "part-00000.csv").write_text("the user's part")
    said = []
    work = outputs.claim(
        outputs.Out("--work-dir", mine, outputs.FOLDER), "mlstm-classify.parts", say=said.append
    )
    assert work == mine / "mlstm-classify.parts" and "did not write" in said[0]
    outputs.ensure_marked(work, "mlstm-classify", ["part-????????.*"])
    (work / "part-00000001.csv").write_text("ours")
    (work / "part-x.csv").write_text("not a name we write")
    outputs.remove_listed(work)
    assert sorted(p.name for p in work.iterdir()) == ["part-x.csv"]
    assert (mine / "part-00000.csv").read_text() == "the user's part"


def test_the_probe_finds_a_read_only_file_system(tmp_path):
    """os.access says yes to root on a read-only mount's folder only by luck; creating a file tells."""
    ro = tmp_path / "ro"
    ro.mkdir()
    if subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(ro)], capture_output=True
    ).returncode:
        pytest.skip("cannot mount a read-only tmpfs here (not root)")
    try:
        with pytest.raises(UserError, match="read-only"):
            outputs.check([outputs.file("--output", ro / "labels.csv")])
    finally:
        subprocess.run(["umount", "-l", str(ro)], check=False)


def test_a_dead_writers_partial_files_are_removed_by_the_next_writer(tmp_path):
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    pid = int(dead.stdout)
    out = tmp_path / "labels.csv"
    (tmp_path / f".labels{outputs.PARTIAL}{pid}.csv").write_text("half")
    stage = tmp_path / f".export{outputs.PARTIAL}{pid}"
    stage.mkdir()
    (stage / outputs.MARK).write_text(json.dumps({"format": outputs.MARK_FORMAT, "files": []}))
    with outputs.new_file(out) as tmp:
        tmp.write_text("whole")
    with outputs.new_folder(tmp_path / "export", "mlstm-export") as s:
        (s / "a").write_text("x")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["export", "labels.csv"]


# ---- every command that writes, each case: one line, exit 2, before any work, the user's files unchanged
#
# In-process (each command's main(argv)); the user's files live in a fresh folder per test and are hashed
# before and after. `World`: what the commands read, built once (a tiny random byte model's checkpoint, its
# export, the classifier app/transfer.py keeps of it, an OpenAI-layout release, prepared data, a run's
# metrics). Each case names the behaviour at 087d2a2 it replaces.


@dataclass
class World:
    run: Path  # a training run (module-layout checkpoint)
    export: Path
    classifier: Path
    openai: Path  # model/0.npy ... 14.npy
    data: Path  # prepared by data_prep (SentencePiece: a tokenizer.model)
    metrics_run: Path  # a run folder with metrics.jsonl only
    texts: Path  # a CSV of texts (id, text, label)


@pytest.fixture(scope="module")
def world(tmp_path_factory, prepared_dir) -> World:
    from test_checkpoints_consolidate import fake_checkpoint, tiny
    from test_checkpoints_import_openai import write_openai
    from test_classify import botchan_sentences, dialogue_rows, write_rows

    from app.export import export
    from app.transfer import main as transfer_main

    root = tmp_path_factory.mktemp("world")
    fake_checkpoint(root / "run", tiny(), "module")
    export(root / "run", root / "export")
    rows = dialogue_rows(botchan_sentences())
    write_rows(root / "train.csv", rows[:120])
    write_rows(root / "test.csv", rows[1000:1040])
    args = ["--checkpoint", root / "run", "--train", root / "train.csv", "--test", root / "test.csv"]
    args += ["--out", root / "transfer", "--features", "final_cell", "--finetune-epochs", "0"]
    assert transfer_main([str(a) for a in [*args, "--heatmap-texts", "0"]]) == 0
    write_openai(root / "openai", E=4, H=8)
    (root / "metrics_run").mkdir()
    step = {"train/loss": 2.0, "train/bpb": 2.9, "train/lr": 1e-3, "train/tokens_per_s": 100.0}
    step |= {"train/grad_norm": 1.0, "train/tokens": 1000, "train/bytes": 1000, "train/elapsed_s": 1.0}
    (root / "metrics_run" / "metrics.jsonl").write_text(
        "".join(json.dumps({"step": s, **step}) + "\n" for s in (1, 2))
    )
    return World(
        run=root / "run", export=root / "export", classifier=root / "transfer" / "classifier",
        openai=root / "openai", data=prepared_dir, metrics_run=root / "metrics_run", texts=root / "test.csv",
    )  # fmt: skip


def tree(root: Path) -> dict[str, str]:
    """Every file and folder under `root`: relative path -> sha256 of its bytes ("dir" for a folder)."""
    out = {}
    for p in sorted(root.rglob("*")):
        out[str(p.relative_to(root))] = "dir" if p.is_dir() else hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def command(name: str):
    """The command's main(argv)."""
    import importlib

    module = {"prep": "data_prep.cli", "import": "app.import_weights"}.get(name, f"app.{name}")
    return importlib.import_module(module).main


def one_error_line(capsys) -> str:
    """What the command printed: nothing on stdout (no work was done), one `error:` line on stderr."""
    out = capsys.readouterr()
    lines = [ln for ln in out.err.splitlines() if ln.strip() and not ln.startswith("[20")]  # DeepSpeed's log
    assert out.out == "" and len(lines) == 1 and lines[0].startswith("error: "), (
        out.out[-2000:] + out.err[-3000:]
    )
    return lines[0]


@pytest.fixture(scope="module")
def read_only(tmp_path_factory) -> Path:
    """A read-only file system (a tmpfs mounted ro: EROFS, which os.access tells root only by luck)."""
    ro = tmp_path_factory.mktemp("ro")
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(ro)]).returncode:
        pytest.skip("cannot mount a read-only tmpfs here (needs root)")
    yield ro
    subprocess.run(["umount", "-l", str(ro)], check=False)


def _user_files(u: Path, w: World) -> None:
    """The user's own folder: texts, prompts, notes, input shards, copies of the handed models and data."""
    u.mkdir()
    shutil.copyfile(w.texts, u / "texts.csv")
    (u / "prompts.txt").write_text("The \nOnce upon\n")
    (u / "notes.txt").write_text("the user's notes, which no command may touch\n")
    (u / "shards").mkdir()
    shutil.copyfile(w.texts, u / "shards" / "part-00000.csv")
    for name in ("labels.csv", "f.npy"):  # folders where a file is meant
        (u / name).mkdir()
        (u / name / "keep.txt").write_text("mine")
    (u / "models").mkdir()
    shutil.copytree(w.run, u / "models" / "run")
    shutil.copytree(w.openai, u / "weights" / "openai")
    shutil.copytree(w.data, u / "project" / "data")
    shutil.copytree(w.metrics_run, u / "run")


# case -> (command, argv: a function of (user folder, world, read-only folder)); each names what 087d2a2 did
REFUSED = {
    # an output that is an input
    "classify --output is --input": ("classify", lambda u, w, ro: [
        "--classifier", w.classifier, "--input", u / "texts.csv", "--output", u / "texts.csv"]),  # exit 0, texts replaced
    "generate --output is --prompts": ("generate", lambda u, w, ro: [
        "--checkpoint", w.run, "--prompts", u / "prompts.txt", "--output", u / "prompts.txt"]),  # prompts replaced
    "evaluate --out is a --text": ("evaluate", lambda u, w, ro: [
        "--checkpoint", w.run, "--text", u / "notes.txt", "--out", u / "notes.txt"]),  # notes replaced by JSON
    "plot --out is the run's metrics": ("plot", lambda u, w, ro: [u / "run", "--out", u / "run" / "metrics.jsonl"]),
    "export --out is --checkpoint": ("export", lambda u, w, ro: [
        "--checkpoint", u / "models" / "run", "--out", u / "models" / "run"]),  # export files into the run
    "import --out is --from": ("import", lambda u, w, ro: [
        "--from", "openai", u / "weights" / "openai", "--out", u / "weights" / "openai"]),
    "transfer --out is --checkpoint": ("transfer", lambda u, w, ro: [
        "--checkpoint", u / "models" / "run", "--train", w.texts, "--test", w.texts, "--out", u / "models" / "run"]),
    "train --out is --data": ("train", lambda u, w, ro: [
        "--data", u / "project" / "data", "--out", u / "project" / "data", *TRAIN_FLAGS]),  # a run in the data
    # an output folder that holds an input
    "classify --work-dir holds --input": ("classify", lambda u, w, ro: [
        "--classifier", w.classifier, "--input", u / "shards" / "part-00000.csv", "--work-dir", u / "shards",
        "--output", u / "out.csv"]),  # every part-* deleted, the input too, then a FileNotFoundError
    "export --out holds --checkpoint": ("export", lambda u, w, ro: [
        "--checkpoint", u / "models" / "run", "--out", u / "models"]),
    "import --out holds --from": ("import", lambda u, w, ro: [
        "--from", "openai", u / "weights" / "openai", "--out", u / "weights"]),
    "transfer --out holds --train": ("transfer", lambda u, w, ro: [
        "--checkpoint", w.run, "--train", u / "texts.csv", "--test", u / "texts.csv", "--out", u]),
    "train --out holds --data": ("train", lambda u, w, ro: [
        "--data", u / "project" / "data", "--out", u / "project", *TRAIN_FLAGS]),
    "prep --overwrite of a folder that holds --tokenizer-model": ("prep", lambda u, w, ro: [
        "--input", u / "notes.txt", "--tokenizer-model", u / "project" / "data" / "tokenizer.model",
        "--out", u / "project" / "data", "--overwrite", "--quiet"]),  # the tokenizer deleted
    # a folder where a file is meant, a file where a folder is meant
    "classify --output is a folder": ("classify", lambda u, w, ro: [
        "--classifier", w.classifier, "--input", u / "texts.csv", "--output", u / "labels.csv"]),  # IsADirectoryError
    "classify --features-out is a folder": ("classify", lambda u, w, ro: [
        "--checkpoint", w.run, "--input", u / "texts.csv", "--features-out", u / "f.npy"]),
    "generate --output is a folder": ("generate", lambda u, w, ro: [
        "--checkpoint", w.run, "--prompt", "The ", "--max-new-tokens", "4", "--output", u / "labels.csv"]),
    "evaluate --out is a folder": ("evaluate", lambda u, w, ro: [
        "--checkpoint", w.run, "--text", u / "notes.txt", "--out", u / "labels.csv"]),
    "import --out is a file": ("import", lambda u, w, ro: ["--from", "openai", w.openai, "--out", u / "notes.txt"]),
    "transfer --out is a file": ("transfer", lambda u, w, ro: [
        "--checkpoint", w.run, "--train", w.texts, "--test", w.texts, "--out", u / "notes.txt"]),
    "train --out is a file": ("train", lambda u, w, ro: ["--data", w.data, "--out", u / "notes.txt", *TRAIN_FLAGS]),
    "classify --work-dir is a file": ("classify", lambda u, w, ro: [
        "--classifier", w.classifier, "--input", u / "texts.csv", "--output", u / "o.csv", "--work-dir", u / "notes.txt"]),
    # a folder we cannot write (a read-only file system)
    "classify --output read-only": ("classify", lambda u, w, ro: [
        "--classifier", w.classifier, "--input", u / "texts.csv", "--output", ro / "labels.csv"]),  # OSError after the work
    "generate --output read-only": ("generate", lambda u, w, ro: [
        "--checkpoint", w.run, "--prompt", "The ", "--max-new-tokens", "4", "--output", ro / "g.jsonl"]),
    "evaluate --out read-only": ("evaluate", lambda u, w, ro: [
        "--checkpoint", w.run, "--text", u / "notes.txt", "--out", ro / "e.json"]),
    "export --out read-only": ("export", lambda u, w, ro: ["--checkpoint", w.run, "--out", ro / "exp"]),
    "import --out read-only": ("import", lambda u, w, ro: ["--from", "openai", w.openai, "--out", ro / "imp"]),
    "transfer --out read-only": ("transfer", lambda u, w, ro: [
        "--checkpoint", w.run, "--train", w.texts, "--test", w.texts, "--out", ro / "t"]),
    "train --out read-only": ("train", lambda u, w, ro: ["--data", w.data, "--out", ro / "r", *TRAIN_FLAGS]),
}  # fmt: skip
TRAIN_FLAGS = [
    "--deepspeed_config", str(Path(__file__).resolve().parents[1] / "ds_configs" / "cpu_pp2_zero1.json"),
    "--pipeline-stages", "1", "--model-config", "debug", "--max-steps", "1", "--eval-every", "0",
    "--wandb-mode", "disabled", "--progress", "false", "--plots", "false", "--sanity-eval-batches", "0",
]  # fmt: skip


@pytest.mark.parametrize("case", list(REFUSED))
def test_an_output_that_would_lose_data_or_cannot_be_written_is_one_line_before_any_work(
    case, world, read_only, tmp_path, capsys
):
    name, argv = REFUSED[case]
    u = tmp_path / "user"
    _user_files(u, world)
    before = tree(u)
    rc = command(name)([str(a) for a in argv(u, world, read_only)])
    line = one_error_line(capsys)
    assert rc == 2, line
    assert tree(u) == before, "the user's files changed"
    assert list(read_only.iterdir()) == []


# ---- a folder that holds files we did not write: used through a subfolder of ours, nothing of the user's
# touched; what we delete is what our mark lists


def _kept(before: dict[str, str], after: dict[str, str]) -> None:
    """Every file the user had is still there, byte for byte."""
    changed = sorted(k for k, v in before.items() if after.get(k) != v)
    assert not changed, f"the user's files changed or went: {changed}"


def test_a_work_folder_of_the_users_gets_a_subfolder_and_only_our_parts_are_deleted(world, tmp_path, capsys):
    """At 087d2a2 every part-* file in --work-dir went (the user's part-00000003.csv too)."""
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "part-00000003.csv").write_text("the user's own part file\n")
    (shared / "manifest.json").write_text('{"the user": "manifest"}')
    before = tree(shared)
    argv = ["--classifier", world.classifier, "--input", world.texts, "--output", tmp_path / "o.csv"]
    assert command("classify")([str(a) for a in [*argv, "--work-dir", shared]]) == 0
    err = capsys.readouterr().err
    assert f"writing into {shared / 'mlstm-classify.parts'} instead" in err, err
    assert tree(shared) == before  # our subfolder removed once the output was written, the user's files kept
    assert len((tmp_path / "o.csv").read_text().splitlines()) == 41


@pytest.mark.parametrize("name", ["export", "import"])
def test_an_export_into_a_folder_of_the_users_goes_to_a_subfolder(name, world, tmp_path, capsys):
    """At 087d2a2 the export's config.json and README.md replaced the user's files of those names."""
    mine = tmp_path / "models"
    mine.mkdir()
    for f in ("config.json", "README.md", "model.safetensors"):
        (mine / f).write_text(f"the user's {f}")
    before = tree(mine)
    src = ["--checkpoint", world.export] if name == "export" else ["--from", "openai", world.openai]
    assert command(name)([str(a) for a in [*src, "--out", mine]]) == 0
    assert f"writing into {mine / name} instead" in capsys.readouterr().err
    _kept(before, tree(mine))
    from app.checkpoints.loader import open_source

    assert open_source(mine / name).kind == "export"  # the export, whole, in our subfolder
    assert command(name)([str(a) for a in [*src, "--out", mine]]) == 0  # again: the same subfolder, replaced
    _kept(before, tree(mine))


def test_data_prep_overwrite_deletes_only_what_data_prep_wrote(world, tmp_path, capsys):
    """At 087d2a2 --overwrite emptied the whole folder, a file the user had put beside the data included."""
    data = tmp_path / "data"
    shutil.copytree(world.data, data)
    (data / "README.txt").write_text("where this data came from: the user's note\n")
    (data / "train" / "notes.txt").write_text("the user's")
    argv = [
        "--out",
        data,
        "--overwrite",
        "--tokenizer",
        "byte",
        "--default-max-mb",
        "0.1",
        "--max-seq-len",
        "64",
    ]
    assert command("prep")([str(a) for a in [*argv, "--num-proc", "1", "--quiet"]]) == 0
    assert (data / "README.txt").read_text() == "where this data came from: the user's note\n"
    assert (data / "train" / "notes.txt").read_text() == "the user's"
    from data_prep.format import load_prepared

    assert load_prepared(data).meta["tokenizer"]["type"] == "byte"


def test_a_run_folder_of_the_users_gets_the_run_in_a_subfolder(world, tmp_path, capsys):
    """train --out naming a folder of the user's (a config.json of theirs, which a run writes) runs in
    <out>/run (--dry-run shows the folder it would write); at 087d2a2 the run's files went into it."""
    mine = tmp_path / "project"
    mine.mkdir()
    (mine / "config.json").write_text('{"the user": "config"}')
    argv = ["--data", world.data, "--out", mine, *TRAIN_FLAGS, "--dry-run"]
    assert command("train")([str(a) for a in argv]) == 0
    out = capsys.readouterr().out
    resolved = json.loads(out[out.index("{") :])
    assert resolved["train"]["out"] == str(mine / "run"), resolved["train"]["out"]
    assert (mine / "config.json").read_text() == '{"the user": "config"}'


def test_a_run_folder_our_slurm_script_made_is_the_runs_own(world, tmp_path, capsys):
    """launch/slurm_train.sbatch writes the job's hostfile into OUT and links its log there before the run
    starts: the run is written into OUT itself (it went to OUT/run, and a requeued job's resume looked in
    OUT); a folder that holds a file of the user's beside them still gets the subfolder."""
    out = tmp_path / "slurm-run"
    out.mkdir()
    (out / "hostfile-17").write_text("localhost slots=2\n")
    (out / "slurm-17.out").symlink_to(tmp_path / "job-17.out")
    argv = ["--data", world.data, "--out", out, *TRAIN_FLAGS, "--dry-run"]
    assert command("train")([str(a) for a in argv]) == 0
    got = capsys.readouterr().out
    assert json.loads(got[got.index("{") :])["train"]["out"] == str(out)
    (out / "notes.txt").write_text("the user's\n")
    assert command("train")([str(a) for a in argv]) == 0
    got = capsys.readouterr().out
    assert json.loads(got[got.index("{") :])["train"]["out"] == str(out / "run")


# ---- a full disk mid-run: one line; what was written stays resumable or, if it is ours, is removed


@pytest.fixture
def small_disk(tmp_path):
    """A real 1 MiB file system (tmpfs) and a function that fills it to `leave` bytes free; where this
    machine does not let us mount one (not root), the test is skipped and says so."""
    mnt = tmp_path / "disk"
    mnt.mkdir()
    p = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], capture_output=True, text=True
    )
    if p.returncode:
        pytest.skip(f"cannot mount a small tmpfs here: {p.stderr.strip()}")

    def fill(leave: int) -> None:
        st = os.statvfs(mnt)
        (mnt / "filler").write_bytes(b"\0" * max(0, st.f_bavail * st.f_frsize - leave))

    yield mnt, fill
    subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_classify_onto_a_full_disk_is_one_line_and_the_rerun_resumes(world, small_disk, tmp_path, capsys):
    """The output's disk fills once every text is classified: one line naming --output and the disk, no
    half-written file under any name, the parts kept; with room, the same command resumes from them and
    writes the bytes of an uninterrupted run. At 087d2a2: an OSError traceback."""
    mnt, fill = small_disk
    from test_classify import write_rows

    with world.texts.open(newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    texts = write_rows(
        tmp_path / "texts.csv", [{**r, "id": f"{i}-{r['id']}"} for i in range(6) for r in rows]
    )
    argv = ["--classifier", world.classifier, "--input", texts, "--keep-fields", "id", "--chunk-rows", "64"]
    assert command("classify")([str(a) for a in [*argv, "--output", tmp_path / "ref.csv"]]) == 0
    capsys.readouterr()
    fill(8 << 10)
    run = [str(a) for a in [*argv, "--output", mnt / "labels.csv", "--work-dir", tmp_path / "work"]]
    assert command("classify")(run) == 2
    line = one_error_line_after_work(capsys)
    assert f"--output {mnt / 'labels.csv'}: no space left on the device" in line and "resume" in line, line
    assert sorted(p.name for p in mnt.iterdir()) == ["filler"]  # nothing half-written under any name
    assert len(list((tmp_path / "work").glob("part-*.json"))) == 4  # every chunk's part kept
    (mnt / "filler").unlink()
    assert command("classify")(run) == 0
    assert "4 of 4 chunks from an earlier run" in capsys.readouterr().out
    assert (mnt / "labels.csv").read_bytes() == (tmp_path / "ref.csv").read_bytes()


def test_features_onto_a_full_disk_are_one_line_not_a_crash(world, small_disk, tmp_path):
    """--features-out is joined through a memory map: on a full disk the pages it writes have no room, and
    at 087d2a2 the process died of SIGBUS (no line, no exit status of ours). Its room is now taken before
    the copy: one line, the parts kept. A separate process: a SIGBUS would end the test runner."""
    mnt, fill = small_disk
    fill(8 << 10)
    argv = ["--checkpoint", world.run, "--input", world.texts, "--features-out", mnt / "f.npy"]
    argv += ["--work-dir", tmp_path / "work"]
    code = "import sys; from app.classify import main; sys.exit(main(sys.argv[1:]))"
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(root), "OMP_NUM_THREADS": "1"}
    p = subprocess.run(
        [sys.executable, "-c", code, *map(str, argv)],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    errors = [ln for ln in p.stderr.splitlines() if ln.startswith("error:")]
    assert p.returncode == 2 and len(errors) == 1, (p.returncode, p.stderr[-3000:])
    assert f"--features-out {mnt / 'f.npy'}: no space left on the device" in errors[0], errors[0]
    assert sorted(q.name for q in mnt.iterdir()) == ["filler"]
    assert list((tmp_path / "work").glob("part-*.npy"))  # kept for the rerun


def test_a_feature_cache_onto_a_full_disk_leaves_nothing_behind(small_disk):
    """transfer's feature cache (app/probing/features.py) is written whole or not at all: on a full disk the
    write raises and no partial file is left in the cache folder (it left `<key>.tmp.npy` before)."""
    from app.probing.features import FeatureSets, cached_or_featurize

    mnt, fill = small_disk
    fill(16 << 10)
    feats = {"final_cell": np.ones((64, 256), dtype=np.float32)}  # 64 KiB: more than the room left
    with pytest.raises(OSError):
        cached_or_featurize(
            {"final_cell": mnt / "cache" / "k.npy"}, 64, 256, lambda: FeatureSets(feats, 64, 0.0, False)
        )
    assert [q.name for q in (mnt / "cache").iterdir()] == []


@pytest.mark.parametrize("name", ["export", "import"])
def test_an_export_onto_a_full_disk_is_one_line_and_leaves_nothing(name, world, small_disk, capsys):
    """No half-written folder under its name or any other: one line, and the disk as it was. At 087d2a2:
    an ENOSPC traceback and a half-written folder (refused by evaluate later)."""
    mnt, fill = small_disk
    fill(16 << 10)
    src = ["--checkpoint", world.export] if name == "export" else ["--from", "openai", world.openai]
    argv = [str(a) for a in [*src, "--out", mnt / "exp"]]
    assert command(name)(argv) == 2
    line = one_error_line_after_work(capsys)
    assert f"--out {mnt / 'exp'}: no space left on the device" in line, line
    assert sorted(p.name for p in mnt.iterdir()) == ["filler"]
    (mnt / "filler").unlink()
    assert command(name)(argv) == 0
    from app.checkpoints.loader import open_source

    assert open_source(mnt / "exp").kind == "export"


def one_error_line_after_work(capsys) -> str:
    """The one `error:` line of a command that failed mid-run (its progress lines aside), no traceback."""
    err = capsys.readouterr().err
    errors = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in err, err[-3000:]
    return errors[0]


# ---- handed files sized before anything is allocated (app.common.handed, app.checkpoints.loader and the
# importers): every command that reads one, one line naming the file and the field, the file unchanged


def _wide(folder: Path) -> Path:
    """`folder` (an export or a classifier) whose config.json says hidden_dim 10^9 -> that config."""
    cfg = folder / "config.json"
    obj = json.loads(cfg.read_text())
    obj["model_config"]["hidden_dim"] = 10**9
    cfg.write_text(json.dumps(obj))
    return cfg


def _npy_claim(folder: Path) -> Path:
    """7.npy (rnn/wmh) of an OpenAI-layout folder whose header claims (2^20, 2^20) float32: 4 TiB."""
    p = folder / "7.npy"
    with p.open("wb") as f:
        header = {"descr": "<f4", "fortran_order": False, "shape": (1 << 20, 1 << 20)}
        np.lib.format.write_array_header_1_0(f, header)
        f.write(b"\0" * 256)
    return p


# case -> (command, the handed file's preparation -> (argv, the file, the field named)); at 087d2a2 each was
# "Storage size calculation overflowed" (hidden_dim), a MemoryError for 4 TiB (.npy) or KeyError: 101 (.pt)
HANDED = {
    "classify --classifier config hidden_dim 1e9": ("classify", lambda h, o: (
        ["--classifier", h / "clf", "--input", h / "texts.csv", "--output", o / "l.csv"], _wide(h / "clf"),
        "model_config.hidden_dim")),
    "classify --checkpoint export hidden_dim 1e9": ("classify", lambda h, o: (
        ["--checkpoint", h / "exp", "--input", h / "texts.csv", "--features-out", o / "f.npy"], _wide(h / "exp"),
        "model_config.hidden_dim")),
    "evaluate export hidden_dim 1e9": ("evaluate", lambda h, o: (
        ["--checkpoint", h / "exp", "--text", h / "texts.csv", "--out", o / "e.json"], _wide(h / "exp"),
        "model_config.hidden_dim")),
    "evaluate classifier hidden_dim 1e9": ("evaluate", lambda h, o: (
        ["--checkpoint", h / "clf", "--text", h / "texts.csv", "--out", o / "e.json"], _wide(h / "clf"),
        "model_config.hidden_dim")),
    "generate export hidden_dim 1e9": ("generate", lambda h, o: (
        ["--checkpoint", h / "exp", "--prompt", "The ", "--max-new-tokens", "4"], _wide(h / "exp"),
        "model_config.hidden_dim")),
    "export export hidden_dim 1e9": ("export", lambda h, o: (
        ["--checkpoint", h / "exp", "--out", o / "x"], _wide(h / "exp"), "model_config.hidden_dim")),
    "transfer export hidden_dim 1e9": ("transfer", lambda h, o: (
        ["--checkpoint", h / "exp", "--train", h / "texts.csv", "--test", h / "texts.csv", "--out", o / "t"],
        _wide(h / "exp"), "model_config.hidden_dim")),
    "train --init-from export hidden_dim 1e9": ("train", lambda h, o: (
        ["--data", h / "data", "--init-from", h / "exp", "--out", o / "r", *TRAIN_FLAGS], _wide(h / "exp"),
        "model_config.hidden_dim")),
    "import openai .npy header (2^20, 2^20)": ("import", lambda h, o: (
        ["--from", "openai", h / "openai", "--out", o / "i"], _npy_claim(h / "openai"), "(1048576, 1048576)")),
    "import a 5-byte .pt": ("import", lambda h, o: (
        ["--from", "sentiment-discovery", h / "mlstm.pt", "--out", o / "i"], h / "mlstm.pt", "KeyError")),
}  # fmt: skip


@pytest.mark.parametrize("case", list(HANDED))
def test_a_handed_file_is_sized_before_anything_is_allocated(case, world, tmp_path, capsys):
    name, prepare = HANDED[case]
    h, o = tmp_path / "handed", tmp_path / "out"
    o.mkdir()
    shutil.copytree(world.export, h / "exp")
    shutil.copytree(world.classifier, h / "clf")
    shutil.copytree(world.openai, h / "openai")
    shutil.copytree(world.data, h / "data")
    shutil.copyfile(world.texts, h / "texts.csv")
    (h / "mlstm.pt").write_bytes(b"hello")
    argv, file, field = prepare(h, o)
    before = tree(h)
    rc = command(name)([str(a) for a in argv])
    line = one_error_line_after_work(capsys)  # (mlstm-import says what it reads first)
    assert rc == 2 and str(file) in line and field in line, line
    assert tree(h) == before and list(o.iterdir()) == []
