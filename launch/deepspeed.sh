#!/usr/bin/env bash
# DeepSpeed's `deepspeed` launcher without its start-up chatter; the same arguments:
#   launch/deepspeed.sh --num_gpus 2 app/train.py --deepspeed_config ds_configs/cpu_pp2_zero1.json ...
# Run directly, `deepspeed` prints about a dozen lines of its own before the first of ours (the hostfile it
# did not find, "Setting CUDA_VISIBLE_DEVICES=0,1" on a machine with no GPU, each spawned command) and, with
# no accelerator, "Setting accelerator to CPU" in every process. Here it runs at --log_level error, with
# DS_ACCELERATOR=cpu set once where torch sees no accelerator (ds_accelerator.sh, said in one line).
#   --launcher-log  (before the script) show DeepSpeed's launcher lines again, at --log_level info
#   DS_LOG_LEVEL    the launcher's log level (default: error)
#   DRY_RUN=1       print the command instead of running it
# It runs the `deepspeed` on PATH: activate the environment first (source .venv/bin/activate).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
level="${DS_LOG_LEVEL:-error}"
args=()
script_seen=""
for a in "$@"; do
  if [ -z "$script_seen" ] && [ "$a" = --launcher-log ]; then
    level=info
    continue
  fi
  case "$a" in *.py | --module) script_seen=1 ;; esac
  args+=("$a")
done
cmd=(deepspeed --log_level "$level" "${args[@]}")
if [ "${DRY_RUN:-0}" = 1 ]; then printf '%q ' "${cmd[@]}"; echo; exit 0; fi
[ "$level" = info ] || source "$ROOT/launch/ds_accelerator.sh"
exec "${cmd[@]}"
