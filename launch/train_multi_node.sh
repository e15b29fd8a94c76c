#!/usr/bin/env bash
# Train across machines with DeepSpeed's multi-node launcher (pdsh/ssh by default).
# Run on the first host; every host needs the same checkout and venv at the same path, and the run
# directory (OUT) must be on a filesystem all hosts share (checkpoints are written by every rank).
#   HOSTFILE     "hostname slots=N" per line (default: launch/hostfile.example — edit it)
#   MASTER_ADDR  address of the first host reachable by all (default: first host in HOSTFILE)
#   MASTER_PORT  default 29500
#   LAUNCHER     pdsh | openmpi | mvapich | slurm (default: pdsh)
#   DS_CONFIG, STAGES, DATA, OUT, MAX_STEPS, MODEL as in train_single_node.sh
#   DRY_RUN=1    print the command instead of running it
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
[ "${DRY_RUN:-0}" = 1 ] || source "$ROOT/launch/setup_env.sh"
HOSTFILE="${HOSTFILE:-launch/hostfile.example}"
[ -f "$HOSTFILE" ] || { echo "error: HOSTFILE $HOSTFILE not found" >&2; exit 2; }
MASTER_ADDR="${MASTER_ADDR:-$(awk 'NF && $1 !~ /^#/ {print $1; exit}' "$HOSTFILE")}"
cmd=(deepspeed --hostfile "$HOSTFILE" --master_addr "$MASTER_ADDR" --master_port "${MASTER_PORT:-29500}"
  --launcher "${LAUNCHER:-pdsh}"
  app/train.py
  --deepspeed_config "${DS_CONFIG:-ds_configs/gpu_bf16_pp4_zero1.json}"
  --data "${DATA:-data/default}"
  --pipeline-stages "${STAGES:-4}"
  --out "${OUT:-runs/multi_node}"
  --max-steps "${MAX_STEPS:-100000}"
  --model-config "${MODEL:-large}"
  "$@")
if [ "${DRY_RUN:-0}" = 1 ]; then printf '%q ' "${cmd[@]}"; echo; exit 0; fi
exec "${cmd[@]}"
