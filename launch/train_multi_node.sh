#!/usr/bin/env bash
# Train across machines with DeepSpeed's multi-node launcher (pdsh/ssh by default).
# Run on the first host; every host needs the same checkout and venv at the same path, and the run
# directory (OUT) must be on a filesystem all hosts share (checkpoints are written by every rank).
#   HOSTFILE     "hostname slots=N" per line (default: launch/hostfile.example — edit it)
#   MASTER_ADDR  address of the first host reachable by all (default: first host in HOSTFILE)
#   MASTER_PORT  default 29500
#   LAUNCHER     pdsh | openmpi | mvapich | slurm (default: pdsh)
#   DS_CONFIG, STAGES, DATA, OUT, MAX_STEPS, MODEL as in train_single_node.sh
#   FORWARD      variables sent to every rank (default: OMP_NUM_THREADS and W&B/HF settings below)
#   SECRET_DIR   where the 0600 secrets file goes, same path on every host (default: ~/.cache/mlstm-ds)
#   DS_LOG_LEVEL DeepSpeed runner's log level (default: error; its INFO lines are start-up noise). Its pdsh
#                runner does not pass it on to the per-node launchers, which still log a few INFO lines.
#   DRY_RUN=1    print the command instead of running it
# Credentials (WANDB_API_KEY, HF_TOKEN, and *KEY*/*TOKEN*/*SECRET*/*PASSWORD* lines of .deepspeed_env)
# never go on a command line: DeepSpeed's runner logs its command with every forwarded value, so they are
# written to a 0600 file in SECRET_DIR whose path alone is forwarded (through the .deepspeed_env mechanism,
# DS_ENV_FILE); each rank reads it at start-up. The file is removed when this script ends.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
[ "${DRY_RUN:-0}" = 1 ] || source "$ROOT/launch/setup_env.sh"
HOSTFILE="${HOSTFILE:-launch/hostfile.example}"
[ -f "$HOSTFILE" ] || { echo "error: HOSTFILE $HOSTFILE not found" >&2; exit 2; }
MASTER_ADDR="${MASTER_ADDR:-$(awk 'NF && $1 !~ /^#/ {print $1; exit}' "$HOSTFILE")}"
MASTER_PORT="${MASTER_PORT:-29500}"
LAUNCHER="${LAUNCHER:-pdsh}"
export MASTER_ADDR MASTER_PORT  # srun (LAUNCHER=slurm) hands the ranks the environment, not --master_port
launcher_args=()
# Under Slurm: srun even for a one-node allocation (else DeepSpeed falls back to a local launch), and no
# ssh check (srun, not ssh, reaches the nodes).
[ "$LAUNCHER" = slurm ] && launcher_args=(--force_multi --no_ssh_check)
cmd=(deepspeed --log_level "${DS_LOG_LEVEL:-error}"
  --hostfile "$HOSTFILE" --master_addr "$MASTER_ADDR" --master_port "$MASTER_PORT"
  --launcher "$LAUNCHER" "${launcher_args[@]}"
  app/train.py  # a file, not --module app.train: DeepSpeed's Slurm runner ignores --module
  --deepspeed_config "${DS_CONFIG:-ds_configs/gpu_bf16_pp2_zero1.json}"
  --data "${DATA:-data/default}"
  --pipeline-stages "${STAGES:-2}"
  --out "${OUT:-runs/multi_node}"
  --max-steps "${MAX_STEPS:-100000}"
  --model-config "${MODEL:-medium}"
  "$@")
FORWARD="${FORWARD:-OMP_NUM_THREADS DS_ACCELERATOR WANDB_MODE WANDB_PROJECT WANDB_ENTITY WANDB_BASE_URL \
WANDB_SILENT HF_HOME HF_HUB_OFFLINE MLSTM_CACHE_DIR MLSTM_MATMUL MLSTM_DS_FAULTS}"
SECRETS="WANDB_API_KEY HF_TOKEN"
if [ "${DRY_RUN:-0}" = 1 ]; then
  printf '%q ' "${cmd[@]}"; echo
  for v in $FORWARD; do [ -n "${!v:-}" ] && echo "# forwarded: $v"; done
  for v in $SECRETS; do [ -n "${!v:-}" ] && echo "# forwarded through the secrets file: $v"; done
  exit 0
fi

SECRET_DIR="${SECRET_DIR:-$HOME/.cache/mlstm-ds}"
mkdir -p "$SECRET_DIR"
chmod 700 "$SECRET_DIR"
secrets="$(umask 077; mktemp "$SECRET_DIR/secrets.XXXXXX")"
env_file="$(mktemp "$SECRET_DIR/deepspeed_env.XXXXXX")"
trap 'rm -f "$secrets" "$env_file"' EXIT
for v in $SECRETS; do [ -n "${!v:-}" ] && printf '%s=%s\n' "$v" "${!v}" >> "$secrets"; done
for v in $FORWARD; do [ -n "${!v:-}" ] && printf '%s=%s\n' "$v" "${!v}" >> "$env_file"; done
# The user's own .deepspeed_env files (DS_ENV_FILE replaces them): credentials to the secrets file.
for f in "$HOME/.deepspeed_env" ./.deepspeed_env; do
  [ -f "$f" ] || continue
  while IFS= read -r line || [ -n "$line" ]; do
    case "$line" in ''|'#'*) continue ;; esac
    name="${line%%=*}"
    if [[ "$name" =~ (KEY|TOKEN|SECRET|PASSWORD) ]]; then echo "$line" >> "$secrets"; else echo "$line" >> "$env_file"; fi
  done < "$f"
done
echo "MLSTM_DS_SECRETS_FILE=$secrets" >> "$env_file"
export DS_ENV_FILE="$env_file"  # an absolute path: DeepSpeed's runner reads exactly this file
"${cmd[@]}"
