"""app.parallel.optimizer: FusedAdam where it builds, torch's AdamW on a CUDA machine without nvcc."""

import shutil

import pytest
from torch.utils.cpp_extension import CUDA_HOME

from app.parallel.layout import load_ds_json
from app.parallel.optimizer import choose_adam

GPU_JSON = "ds_configs/gpu_bf16_pp2_zero1.json"


def test_cpu_runs_and_stated_choices_are_left_alone():
    cfg = load_ds_json(GPU_JSON)
    assert choose_adam(cfg, "cpu", False) == (cfg, "optimizer: DeepSpeed FusedAdam (AdamW, its CPU build)")
    assert choose_adam(cfg, "cuda", True)[1] == "optimizer: DeepSpeedCPUAdam (ZeRO CPU offload)"
    stated = {**cfg, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": False}}}
    assert choose_adam(stated, "cuda", False)[0] is stated


@pytest.mark.skipif(bool(CUDA_HOME or shutil.which("nvcc")), reason="nvcc is here: FusedAdam builds")
def test_cuda_without_nvcc_takes_torch_adamw_and_says_why():
    cfg = load_ds_json(GPU_JSON)
    out, why = choose_adam(cfg, "cuda", False)
    assert out["optimizer"]["params"]["torch_adam"] is True and "torch_adam" not in cfg["optimizer"]["params"]
    assert why == (
        "optimizer: torch.optim.AdamW (foreach): FusedAdam needs nvcc to build and none was found "
        "(no CUDA_HOME, no nvcc on PATH)"
    )
