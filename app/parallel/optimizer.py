"""Which Adam DeepSpeed builds from the JSON's `optimizer` section on a GPU, chosen and said once.

DeepSpeed turns "Adam"/"AdamW" into its FusedAdam, a CUDA op it JIT-compiles with nvcc at start-up unless the
wheel was built with it (DS_BUILD_FUSED_ADAM=1). A start-up compile costs tens of seconds, fails on machines
without nvcc, and fails on common images with nvcc: DeepSpeed cannot parse an arch list with a suffix
(`TORCH_CUDA_ARCH_LIST=9.0a`, `10.0a`, `+PTX`). An optimizer must never need a compiler to start. So on CUDA:

- by default, DeepSpeed's FusedAdam where the deepspeed install has it prebuilt, else torch's fused AdamW
  (DeepSpeed's own `torch_adam: true` switch, with `fused: true`: one multi-tensor kernel, no build; the
  same update rule and hyperparameters);
- `torch_adam: false` in the JSON asks for DeepSpeed's FusedAdam: it is built here, before DeepSpeed sees the
  config, and a failed build falls back to torch's fused AdamW with one line saying why (all ranks agree);
- `torch_adam: true` is kept; `fused: true` is added unless the JSON sets `fused` or `foreach`.

Every non-Adam optimizer, CPU offload (DeepSpeedCPUAdam) and CPU runs keep what the JSON says: on the CPU
DeepSpeed builds torch's AdamW where the JSON sets `torch_adam: true` (ds_configs/cpu_*.json), else its CPU
FusedAdam (built with the C++ compiler the fused core already needs); the line says which. The C++ op such a
run needs (DeepSpeedCPUAdam's `cpu_adam`, the CPU FusedAdam's `fused_adam`) is built here first, in our folder
and under our build lock (`prebuild_cpu_op`, app/common/toolchain.py): a build killed earlier cannot leave a
`lock` file that every later start waits on.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

from app.common.toolchain import prebuild_deepspeed_op


def prebuild_cpu_op(builder_name: str) -> None:
    """Build (or load) DeepSpeed's C++ op `builder_name` ("CPUAdamBuilder", "FusedAdamBuilder" of the CPU
    accelerator) under our build lock, before DeepSpeed loads it. Where the op does not apply here nothing is
    built; a failed build raises here, as DeepSpeed's own load would (never built twice)."""
    import deepspeed.ops
    from deepspeed.accelerator import get_accelerator

    builder = get_accelerator().create_op_builder(builder_name)
    if builder is None or not deepspeed.ops.__compatible_ops__.get(builder.NAME, False):
        return
    prebuild_deepspeed_op(builder)


def _prebuilt() -> bool:
    try:
        from deepspeed.git_version_info import installed_ops
    except ImportError:
        return False
    return bool(installed_ops.get("fused_adam"))


def build_fused_adam() -> str | None:
    """Build (or load the cached build of) DeepSpeed's CUDA FusedAdam; None when it loads, else why not."""
    try:
        from deepspeed.ops.op_builder.fused_adam import FusedAdamBuilder

        prebuild_deepspeed_op(
            FusedAdamBuilder()
        )  # in our folder, under our build lock (app/common/toolchain)
    except Exception as e:  # any build failure: no nvcc, an arch list it cannot parse, a compiler error
        lines = str(e).strip().splitlines()
        return f"{type(e).__name__}: {lines[-1][:200] if lines else ''}".rstrip(": ")
    return None


def _torch_fused(ds_config: dict) -> dict:
    out = copy.deepcopy(ds_config)
    params = out["optimizer"].setdefault("params", {})
    params["torch_adam"] = True
    if "fused" not in params and "foreach" not in params:
        params["fused"] = True
    return out


def choose_adam(
    ds_config: dict,
    device_type: str,
    offload: bool,
    agree: Callable[[bool], bool] = lambda ok: ok,
    build: Callable[[], str | None] = build_fused_adam,
    prebuild: Callable[[str], None] = prebuild_cpu_op,
) -> tuple[dict, str]:
    """(the DeepSpeed config to build with, one line saying which Adam runs and why). `agree(ok)`: whether
    every rank's build succeeded (a collective under the launcher); `build`: builds FusedAdam or says why not;
    `prebuild(name)`: builds the C++ op an offloaded or CPU DeepSpeed Adam loads."""
    opt = ds_config.get("optimizer") or {}
    kind = str(opt.get("type", "")).lower()
    if kind not in ("adam", "adamw"):
        return ds_config, f"optimizer: {opt.get('type')} (DeepSpeed's)"
    params = opt.get("params", {})
    adamw = kind == "adamw" or params.get("adam_w_mode", True)  # DeepSpeed's rule
    torch_name = f"torch.optim.{'AdamW' if adamw else 'Adam'}"
    # offload and the CPU: left alone (DeepSpeed builds torch's Adam wherever the JSON sets torch_adam)
    if offload or device_type != "cuda":
        where = "; ZeRO CPU offload" if offload else ""
        if params.get("torch_adam") is True:
            return ds_config, f"optimizer: {torch_name} (torch_adam set in the DeepSpeed config{where})"
        if offload:
            prebuild("CPUAdamBuilder")
            return ds_config, "optimizer: DeepSpeedCPUAdam (ZeRO CPU offload)"
        prebuild("FusedAdamBuilder")
        return ds_config, f"optimizer: DeepSpeed FusedAdam ({opt['type']}, its CPU build)"
    if params.get("torch_adam") is True:
        out = _torch_fused(ds_config)
        how = "fused" if out["optimizer"]["params"].get("fused") else "as the JSON sets it"
        return out, f"optimizer: {torch_name} ({how}; torch_adam set in the DeepSpeed config)"
    if params.get("torch_adam") is False:  # the JSON asks for DeepSpeed's FusedAdam: build it now
        why = build()
        if agree(why is None):
            return (
                ds_config,
                f"optimizer: DeepSpeed FusedAdam ({opt['type']}; torch_adam false in the DeepSpeed config)",
            )
        why = why or "another rank's build failed"
        return _torch_fused(
            ds_config
        ), f"optimizer: {torch_name} (fused): DeepSpeed's FusedAdam did not build ({why})"
    if _prebuilt():
        return ds_config, f"optimizer: DeepSpeed FusedAdam ({opt['type']}; prebuilt in the deepspeed install)"
    return _torch_fused(ds_config), (
        f"optimizer: {torch_name} (fused; no compile at start: DeepSpeed's FusedAdam is not prebuilt here, "
        "set torch_adam false in the DeepSpeed config to build it)"
    )
