#!/usr/bin/env bash
# Sourced by setup_env.sh and deepspeed.sh (running it alone only says what it would set).
# DeepSpeed warns "Setting accelerator to CPU" in every process it starts (runner, per-node launcher, each
# rank) when it finds no accelerator. Decided once here instead, with the same test DeepSpeed makes (torch
# sees no CUDA/XPU/MPS device and no vendor plugin is installed), and said once. Set DS_ACCELERATOR to choose.
# The interpreter: $VENV/bin/python where setup_env.sh set VENV, else the `python` on PATH.
if [ -z "${DS_ACCELERATOR:-}" ] && "${VENV:+$VENV/bin/}python" - <<'PY' 2>/dev/null
import importlib.util, sys, torch
plugins = ("torch_npu", "torch_sdaa", "habana_frameworks", "torch_mlu", "torch_supa", "torch_xmlir")
sys.exit(1 if torch.accelerator.is_available() or any(importlib.util.find_spec(p) for p in plugins) else 0)
PY
then
  export DS_ACCELERATOR=cpu
  echo "[setup] no GPU or other accelerator visible to torch: DeepSpeed runs on the CPU (DS_ACCELERATOR=cpu)" >&2
fi
