"""app.parallel.optimizer: no compile at start on CUDA (torch's fused AdamW unless FusedAdam is prebuilt or the
config asks for it), and a FusedAdam build that fails falls back with one line."""

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from app.parallel.layout import load_ds_json
from app.parallel.optimizer import build_fused_adam, choose_adam

GPU_JSON = "ds_configs/gpu_bf16_pp2_zero1.json"
ROOT = Path(__file__).resolve().parents[1]


def _no_build():
    raise AssertionError("the default must not build anything")


def test_cpu_runs_and_offload_keep_their_adam_and_prebuild_its_op():
    """The JSON's Adam is kept on the CPU and under offload; the C++ op it loads is built first (under our
    build lock: test_a_cpu_adam_op_is_built_under_our_lock_past_a_killed_builds_lock)."""
    cfg, built = load_ds_json(GPU_JSON), []
    assert choose_adam(cfg, "cpu", False, prebuild=built.append) == (
        cfg,
        "optimizer: DeepSpeed FusedAdam (AdamW, its CPU build)",
    )
    assert (
        choose_adam(cfg, "cuda", True, prebuild=built.append)[1]
        == "optimizer: DeepSpeedCPUAdam (ZeRO CPU offload)"
    )
    assert built == ["FusedAdamBuilder", "CPUAdamBuilder"]


_KILLED_BUILD = """
import json
from app.common.logs import setup_logging
from app.common.toolchain import build_directory, use_own_extensions_dir
from app.parallel.optimizer import prebuild_cpu_op
setup_logging()
use_own_extensions_dir()
folder = build_directory("cpu_adam")
folder.mkdir(parents=True, exist_ok=True)
(folder / "lock").write_text("")  # what a build killed mid-way leaves: torch's loader waits on it for ever
prebuild_cpu_op("CPUAdamBuilder")
from deepspeed.ops.adam import DeepSpeedCPUAdam
import torch
p = torch.nn.Parameter(torch.ones(4))
opt = DeepSpeedCPUAdam([p], lr=0.1)
p.grad = torch.ones(4)
opt.step()
print(json.dumps({"p": p.detach().tolist(), "lock_left": (folder / "lock").exists()}))
"""


@pytest.mark.long  # a C++ build of a minute or more on 2 cores: `--all`
def test_a_cpu_adam_op_is_built_under_our_lock_past_a_killed_builds_lock(tmp_path):
    """DeepSpeedCPUAdam's op (ZeRO CPU offload) is built in our folder under our build lock: a `lock` file a
    killed build left is removed with one warning, where torch's loader would have waited on it for ever."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), MLSTM_CACHE_DIR=str(tmp_path))
    p = subprocess.run([sys.executable, "-c", _KILLED_BUILD], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=900)  # fmt: skip
    assert p.returncode == 0, p.stderr[-3000:]
    got = json.loads(p.stdout.strip().splitlines()[-1])
    assert got["lock_left"] is False
    assert all(abs(v - 0.9) < 1e-6 for v in got["p"]), got  # one Adam step of lr 0.1 from 1.0: 0.9
    assert p.stderr.count("left by a build that was killed") == 1, p.stderr[-3000:]


def test_a_cpu_config_asking_for_torch_adam_is_named_as_torch_adamw():
    """ds_configs/cpu_*.json set torch_adam: DeepSpeed builds torch.optim.AdamW there, and the line says so
    (it said DeepSpeed's FusedAdam)."""
    for name in ("ds_configs/cpu_pp2_zero1.json", "ds_configs/cpu_zero2.json"):
        cfg = load_ds_json(name)
        assert choose_adam(cfg, "cpu", False, build=_no_build) == (
            cfg,
            "optimizer: torch.optim.AdamW (torch_adam set in the DeepSpeed config)",
        ), name
    offloaded = {"optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}}}
    assert choose_adam(offloaded, "cuda", True, build=_no_build) == (
        offloaded,
        "optimizer: torch.optim.AdamW (torch_adam set in the DeepSpeed config; ZeRO CPU offload)",
    )


def test_cuda_default_is_torch_fused_adamw_and_builds_nothing(monkeypatch, tmp_path):
    """The image that crashed: nvcc on PATH and TORCH_CUDA_ARCH_LIST=9.0a (DeepSpeed cannot parse the 'a')."""
    nvcc = shutil.which("nvcc")
    if nvcc is None:  # a stand-in: the choice must not depend on whether a compiler is there
        nvcc = tmp_path / "nvcc"
        nvcc.write_text("#!/bin/sh\necho 'Cuda compilation tools, release 13.0'\n")
        nvcc.chmod(0o755)
        monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "9.0a")
    cfg = load_ds_json(GPU_JSON)
    out, why = choose_adam(cfg, "cuda", False, build=_no_build)
    assert out["optimizer"]["params"] == {**cfg["optimizer"]["params"], "torch_adam": True, "fused": True}
    assert "torch_adam" not in cfg["optimizer"]["params"]  # the caller's dict is not changed
    assert why.startswith("optimizer: torch.optim.AdamW (fused; no compile at start")


def test_a_fusedadam_build_that_fails_falls_back_in_one_line(monkeypatch, tmp_path):
    """torch_adam false asks for DeepSpeed's FusedAdam: its real builder, under TORCH_CUDA_ARCH_LIST=9.0a, raises
    (DeepSpeed's ValueError on '0a', or no CUDA toolkit where there is none); torch's fused AdamW runs instead."""
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "9.0a")
    monkeypatch.setenv(
        "MLSTM_CACHE_DIR", str(tmp_path)
    )  # our build folder, empty: nothing cached can mask it
    monkeypatch.delenv("TORCH_EXTENSIONS_DIR", raising=False)  # the build points it at ours: restored after
    why = build_fused_adam()
    assert why is not None and "\n" not in why
    cfg = load_ds_json(GPU_JSON)
    asked = {**cfg, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": False}}}
    out, line = choose_adam(asked, "cuda", False, build=build_fused_adam)
    assert out["optimizer"]["params"] == {"lr": 1e-3, "torch_adam": True, "fused": True}
    assert line == f"optimizer: torch.optim.AdamW (fused): DeepSpeed's FusedAdam did not build ({why})"


def test_every_rank_must_have_built_fusedadam():
    cfg = {"optimizer": {"type": "Adam", "params": {"lr": 1e-3, "torch_adam": False, "adam_w_mode": False}}}
    out, line = choose_adam(cfg, "cuda", False, agree=lambda ok: False, build=lambda: None)
    assert out["optimizer"]["params"]["torch_adam"] is True
    assert line.endswith("did not build (another rank's build failed)") and "torch.optim.Adam " in line
    same, line = choose_adam(cfg, "cuda", False, build=lambda: None)
    assert same is cfg and line.startswith("optimizer: DeepSpeed FusedAdam")


def test_a_stated_torch_adam_keeps_what_the_json_says():
    stated = {"optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True, "foreach": True}}}
    out, line = choose_adam(stated, "cuda", False, build=_no_build)
    assert out["optimizer"]["params"] == stated["optimizer"]["params"] and "as the JSON sets it" in line
    bare = {"optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}}}
    assert choose_adam(bare, "cuda", False, build=_no_build)[0]["optimizer"]["params"]["fused"] is True


def test_deepspeed_passes_fused_through_to_torch(tmp_path):
    """The config we hand DeepSpeed builds torch.optim.AdamW(fused=True) (torch's fused kernel also runs on
    the CPU, so the real engine is checked here, one process)."""
    cfg = _torch_fused_config()
    script = tmp_path / "init.py"
    script.write_text(
        textwrap.dedent(f"""
        import json, deepspeed, torch
        engine, opt, *_ = deepspeed.initialize(model=torch.nn.Linear(8, 8), model_parameters=
            torch.nn.Linear(8, 8).parameters(), config={cfg!r})
        base = getattr(opt, "optimizer", opt)
        print(json.dumps([type(base).__module__ + "." + type(base).__name__, base.defaults.get("fused")]))
    """)
    )
    env = dict(os.environ, RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(29400 + os.getpid() % 500), DS_ACCELERATOR="cpu", PYTHONPATH=str(ROOT))  # fmt: skip
    p = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    assert json.loads(p.stdout.strip().splitlines()[-1]) == ["torch.optim.adamw.AdamW", True]


def _torch_fused_config() -> dict:
    cfg = load_ds_json("ds_configs/cpu_zero2.json")
    cfg = {k: v for k, v in cfg.items() if k not in ("zero_optimization",)}
    cfg["train_batch_size"], cfg["train_micro_batch_size_per_gpu"] = 1, 1
    cfg.pop("gradient_accumulation_steps", None)
    out, _ = choose_adam(
        {**cfg, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}}, "cuda", False, build=_no_build
    )
    return out
