"""launch/ scripts: environment-driven, and DRY_RUN=1 prints the exact command without running anything."""

import os
import subprocess

import pytest
from launcher import ROOT, free_port


def dry(script: str, *args: str, **env) -> str:
    e = dict(os.environ, DRY_RUN="1", **env)
    p = subprocess.run(["bash", str(ROOT / "launch" / script), *args], cwd=ROOT, env=e, capture_output=True,
                       text=True, timeout=60)  # fmt: skip
    assert p.returncode == 0, p.stderr
    return p.stdout + p.stderr


def test_single_node_dry_run_uses_env():
    out = dry("train_single_node.sh", NUM_PROCS="4", STAGES="2", OUT="runs/x", MAX_STEPS="7")
    assert "deepspeed --log_level error --num_gpus 4 app/train.py" in out  # the launcher's INFO lines off
    assert "--pipeline-stages 2" in out and "--out runs/x" in out and "--max-steps 7" in out


def test_multi_node_dry_run_reads_hostfile(tmp_path):
    hf = tmp_path / "hosts"
    hf.write_text("# comment\nnodeA slots=8\nnodeB slots=8\n")
    out = dry("train_multi_node.sh", HOSTFILE=str(hf), DS_LOG_LEVEL="warning", DS_ACCELERATOR="cpu",
              MLSTM_CACHE_DIR=str(tmp_path / "cache"))  # fmt: skip
    assert f"--hostfile {hf}" in out and "--master_addr nodeA" in out
    assert out.startswith("deepspeed --log_level warning ") and "# forwarded: DS_ACCELERATOR" in out
    assert "# forwarded: MLSTM_CACHE_DIR" in out  # the matmul peak and GPU rankings: one folder on every node


def test_multi_node_missing_hostfile_is_one_line(tmp_path):
    e = dict(os.environ, DRY_RUN="1", HOSTFILE=str(tmp_path / "none"))
    p = subprocess.run(
        ["bash", str(ROOT / "launch" / "train_multi_node.sh")], env=e, capture_output=True, text=True
    )
    assert p.returncode == 2 and p.stderr.strip().startswith("error: HOSTFILE")


def test_quickstart_dry_run_lists_every_stage(tmp_path):
    out = dry("quickstart.sh", DATA=str(tmp_path / "data"))
    for needle in (  # the console scripts an install provides
        "+ mlstm-prep ",
        "+ deepspeed --log_level error --num_gpus 2 app/train.py",
        "--model-config small --time-budget 4 --test-eval false --wandb-mode ",
        "+ mlstm-eval --checkpoint runs/quickstart/best ",  # the lowest validation loss
        "+ mlstm-export --checkpoint runs/quickstart/best ",
        "+ mlstm-generate ",
    ):
        assert needle in out
    for hidden in ("--warmup-steps", "--eval-every", "--save-every"):  # the README's recipe: none of them
        assert hidden not in out


def test_quickstart_on_a_gpu_trains_one_process_in_bf16(tmp_path):
    """DEVICE=gpu is what `auto` picks where torch sees CUDA: one process, one stage, the bf16 ZeRO-2 config."""
    out = dry("quickstart.sh", DATA=str(tmp_path / "data"), DEVICE="gpu")
    assert (
        "+ deepspeed --log_level error --num_gpus 1 app/train.py --deepspeed_config ds_configs/gpu_bf16_zero2.json"
        in out
    )
    assert "--pipeline-stages 1 " in out and "[quickstart] training on gpu" in out
    e = dict(os.environ, DRY_RUN="1", DEVICE="tpu")
    p = subprocess.run(["bash", str(ROOT / "launch" / "quickstart.sh")], cwd=ROOT, env=e, capture_output=True,
                       text=True, timeout=60)  # fmt: skip
    assert p.returncode == 2 and p.stderr.strip() == "error: DEVICE must be auto, cpu or gpu, not 'tpu'"


@pytest.mark.parametrize(
    "script", [*sorted(p.name for p in (ROOT / "launch").glob("*.sh")), "slurm_train.sbatch"]
)
def test_scripts_parse_and_are_executable(script):
    path = ROOT / "launch" / script
    assert os.access(path, os.X_OK)
    assert subprocess.run(["bash", "-n", str(path)]).returncode == 0


def test_deepspeed_wrapper_passes_its_arguments_at_log_level_error():
    out = dry("deepspeed.sh", "--num_gpus", "2", "app/train.py", "--data", "d", "--launcher-log")
    assert out.startswith("deepspeed --log_level error --num_gpus 2 app/train.py --data d --launcher-log")
    out = dry("deepspeed.sh", "--launcher-log", "--num_gpus", "2", "app/train.py")  # before the script: ours
    assert out.startswith("deepspeed --log_level info --num_gpus 2 app/train.py")


def test_deepspeed_wrapper_leaves_only_the_ranks_lines_on_a_cpu(tmp_path):
    """A CPU launch through launch/deepspeed.sh: the ranks' own output, one line saying DeepSpeed runs on
    the CPU, and none of the launcher's (a plain `deepspeed` prints "Setting CUDA_VISIBLE_DEVICES=0,1" and
    "Setting accelerator to CPU" in every process here)."""
    script = tmp_path / "hello.py"
    script.write_text(
        "import os\nos.write(1, f\"rank {os.environ['RANK']} of {os.environ['WORLD_SIZE']}\\n\".encode())\n"
    )
    e = dict(os.environ, MASTER_PORT=str(free_port()))
    e.pop("DS_ACCELERATOR", None)
    cmd = ["bash", str(ROOT / "launch" / "deepspeed.sh"), "--num_gpus", "2", "--master_port", e["MASTER_PORT"],
           str(script)]  # fmt: skip
    p = subprocess.run(cmd, cwd=tmp_path, env=e, capture_output=True, text=True, timeout=240)
    assert p.returncode == 0, p.stderr
    lines = [ln for ln in (p.stdout + p.stderr).splitlines() if ln.strip()]
    assert sorted(ln for ln in lines if ln.startswith("rank")) == ["rank 0 of 2", "rank 1 of 2"]
    assert [ln for ln in lines if not ln.startswith("rank")] == [
        "[setup] no GPU or other accelerator visible to torch: DeepSpeed runs on the CPU (DS_ACCELERATOR=cpu)"
    ], lines


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="torch sees a GPU here")
def test_quickstart_asked_for_a_gpu_without_one_stops_in_one_line(tmp_path):
    """Base 2652e8d said "training on gpu", then trained, evaluated, exported and sampled on the CPU in bf16
    (rc 0). Now DEVICE=gpu with no GPU is one line saying what torch sees and how to fix it, before any step
    (auto's line saying it chose the CPU: tests/test_common_devices.py)."""
    from app.common.devices import cuda_seen

    e = dict(
        os.environ,
        MLSTM_USE_CURRENT_ENV="1",
        DEVICE="gpu",
        DATA=str(tmp_path / "data"),
        OUT=str(tmp_path / "r"),
    )
    p = subprocess.run(["bash", str(ROOT / "launch" / "quickstart.sh")], cwd=ROOT, env=e, capture_output=True,
                       text=True, timeout=120)  # fmt: skip
    ours = [ln for ln in p.stderr.splitlines() if not ln.startswith("[setup]")]
    assert p.returncode == 2 and len(ours) == 1, p.stderr
    assert ours[0].startswith(f"error: DEVICE=gpu: {cuda_seen()}; ") and ours[0].endswith(
        "run on the CPU (DEVICE=cpu, or DEVICE=auto)"
    )
    assert not (tmp_path / "data").exists() and p.stdout == ""
    out = dry("quickstart.sh", DATA=str(tmp_path / "data"), DEVICE="auto")
    assert "--num_gpus 2 app/train.py" in out  # a dry run of auto plans for the CPU torch sees
