#!/usr/bin/env bash
# Train on one machine with the deepspeed launcher. Everything is an environment variable with a default;
# extra arguments go to app/train.py (e.g. model.hidden_dim=512 --eval-every 500).
#   NUM_PROCS   processes (default: number of GPUs, or 2 on a CPU-only machine)
#   DS_CONFIG   DeepSpeed JSON        (default: ds_configs/cpu_pp2_zero1.json on CPU, gpu_bf16_pp2_zero1.json on GPU)
#   STAGES      pipeline stages       (default: 2)
#   DATA        data_prep output dir  (default: data/default)
#   OUT         run directory         (default: runs/single_node)
#   MAX_STEPS   optimizer steps       (default: 1000)
#   MODEL       preset or JSON        (default: small)
#   DS_LOG_LEVEL  DeepSpeed launcher's log level (default: error; its INFO lines are start-up noise)
#   DRY_RUN=1   print the command instead of running it
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
[ "${DRY_RUN:-0}" = 1 ] || source "$ROOT/launch/setup_env.sh"

if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  gpus=$(nvidia-smi -L | wc -l); default_cfg=ds_configs/gpu_bf16_pp2_zero1.json
else
  gpus=0; default_cfg=ds_configs/cpu_pp2_zero1.json
fi
NUM_PROCS="${NUM_PROCS:-$([ "$gpus" -gt 0 ] && echo "$gpus" || echo 2)}"
cmd=(deepspeed --log_level "${DS_LOG_LEVEL:-error}" --num_gpus "$NUM_PROCS" app/train.py
  --deepspeed_config "${DS_CONFIG:-$default_cfg}"
  --data "${DATA:-data/default}"
  --pipeline-stages "${STAGES:-2}"
  --out "${OUT:-runs/single_node}"
  --max-steps "${MAX_STEPS:-1000}"
  --model-config "${MODEL:-small}"
  "$@")
if [ "${DRY_RUN:-0}" = 1 ]; then printf '%q ' "${cmd[@]}"; echo; exit 0; fi
exec "${cmd[@]}"
