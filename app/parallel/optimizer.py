"""Which Adam DeepSpeed builds from the JSON's `optimizer` section on a GPU, chosen and said once.

DeepSpeed turns "Adam"/"AdamW" into its FusedAdam, a CUDA op that it JIT-compiles with nvcc at start-up
unless the wheel was built with it (DS_BUILD_FUSED_ADAM=1). On a machine with CUDA torch but no nvcc
(a plain `pip install` of torch's CUDA wheels ships none) that build fails at start-up. So on CUDA:
FusedAdam where it is prebuilt or nvcc is there to build it, else torch's AdamW (DeepSpeed's own
`torch_adam: true` switch; same update rule and hyperparameters). A `torch_adam` the JSON states is left
alone, as is every non-Adam optimizer, CPU offload (DeepSpeedCPUAdam) and CPU runs (DeepSpeed's CPU
FusedAdam builds with the C++ compiler the fused core already needs).
"""

from __future__ import annotations

import copy
import logging
import os
import shutil

log = logging.getLogger(__name__)


def _fused_adam_available() -> tuple[bool, str]:
    try:
        from deepspeed.git_version_info import installed_ops

        if installed_ops.get("fused_adam"):
            return True, "prebuilt in the deepspeed install"
    except ImportError:
        pass
    from torch.utils.cpp_extension import CUDA_HOME

    nvcc = os.path.join(CUDA_HOME, "bin", "nvcc") if CUDA_HOME else shutil.which("nvcc")
    if nvcc and os.path.exists(nvcc):
        return True, f"JIT-built once with {nvcc}, cached under TORCH_EXTENSIONS_DIR"
    return False, "FusedAdam needs nvcc to build and none was found (no CUDA_HOME, no nvcc on PATH)"


def choose_adam(ds_config: dict, device_type: str, offload: bool) -> tuple[dict, str]:
    """(the DeepSpeed config to build with, one line saying which Adam runs and why)."""
    opt = ds_config.get("optimizer") or {}
    kind = str(opt.get("type", "")).lower()
    if kind not in ("adam", "adamw"):
        return ds_config, f"optimizer: {opt.get('type')} (DeepSpeed's)"
    params = opt.get("params", {})
    if "torch_adam" in params:
        which = "torch.optim" if params["torch_adam"] else "DeepSpeed FusedAdam"
        return ds_config, f"optimizer: {which} {opt['type']} (torch_adam set in the DeepSpeed config)"
    if offload:
        return ds_config, "optimizer: DeepSpeedCPUAdam (ZeRO CPU offload)"
    if device_type != "cuda":
        return ds_config, f"optimizer: DeepSpeed FusedAdam ({opt['type']}, its CPU build)"
    ok, why = _fused_adam_available()
    if ok:
        return ds_config, f"optimizer: DeepSpeed FusedAdam ({opt['type']}; {why})"
    out = copy.deepcopy(ds_config)
    out["optimizer"]["params"]["torch_adam"] = True
    adamw = kind == "adamw" or params.get("adam_w_mode", True)  # DeepSpeed's rule
    return out, f"optimizer: torch.optim.{'AdamW' if adamw else 'Adam'} (foreach): {why}"
