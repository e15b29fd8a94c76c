#!/usr/bin/env bash
# The main job, end to end on the embedded default corpus (CPython's docs + stdlib sources; no download):
#   1. set up .venv   2. prepare data   3. train: on a CPU machine 2 processes (2 pipeline stages, ZeRO-1, fp32);
#      where torch sees a CUDA GPU, 1 process on it (1 stage, ZeRO-2, bf16)
#   4. evaluate on the test split (+ gzip/bzip2/xz reference)   5. export   6. print a sample
# Environment: MINUTES (training time budget, default 4: the whole script takes about 5-6 minutes on 2 cores),
# STEPS (train this many steps instead of MINUTES), DEVICE (auto, cpu or gpu), NUM_PROCS (2 on CPU, 1 on a
# GPU), STAGES (2 on CPU, 1 on a GPU), MODEL (small), OUT (runs/quickstart), DATA (data/default), DS_CONFIG
# (ds_configs/cpu_pp2_zero1.json on CPU, ds_configs/gpu_bf16_zero2.json on a GPU), DS_LOG_LEVEL (DeepSpeed
# launcher's log level, default error: its INFO lines are start-up noise), DRY_RUN=1 prints the commands only.
# Rerunning resumes OUT: with a larger MINUTES (or STEPS) it trains on to the new total.
# The steps use the console scripts the install provides (mlstm-prep, mlstm-eval, ...; see README).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
[ "${DRY_RUN:-0}" = 1 ] || source "$ROOT/launch/setup_env.sh"

DATA="${DATA:-data/default}"
OUT="${OUT:-runs/quickstart}"
DEVICE="${DEVICE:-auto}"
if [ "$DEVICE" = auto ]; then
  DEVICE=cpu
  if python -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then DEVICE=gpu; fi
fi
case "$DEVICE" in
  gpu) NUM_PROCS="${NUM_PROCS:-1}" STAGES="${STAGES:-1}" DS_CONFIG="${DS_CONFIG:-ds_configs/gpu_bf16_zero2.json}" ;;
  cpu) NUM_PROCS="${NUM_PROCS:-2}" STAGES="${STAGES:-2}" DS_CONFIG="${DS_CONFIG:-ds_configs/cpu_pp2_zero1.json}" ;;
  *) echo "error: DEVICE must be auto, cpu or gpu, not '$DEVICE'" >&2; exit 2 ;;
esac
echo "[quickstart] training on $DEVICE: $NUM_PROCS process(es), $STAGES pipeline stage(s), $DS_CONFIG" >&2
if [ -n "${STEPS:-}" ]; then length=(--max-steps "$STEPS"); else length=(--time-budget "${MINUTES:-4}"); fi

run() {
  echo "+ $*" >&2
  [ "${DRY_RUN:-0}" = 1 ] || "$@"
}

if [ -f "$DATA/meta.json" ]; then
  echo "[quickstart] reusing prepared data in $DATA (delete it to prepare again)"
else
  run mlstm-prep --out "$DATA" --max-seq-len 128  # SentencePiece sized from the corpus (the default)
fi
run deepspeed --log_level "${DS_LOG_LEVEL:-error}" --num_gpus "$NUM_PROCS" app/train.py \
  --deepspeed_config "$DS_CONFIG" \
  --data "$DATA" --pipeline-stages "$STAGES" --out "$OUT" --model-config "${MODEL:-small}" \
  "${length[@]}" --test-eval false --wandb-mode "${WANDB_MODE:-offline}"  # the test split is evaluated next
# (no step flags: warmup, validations and saves follow the budget, and the run logs the schedule it keeps)
# "$OUT/best": the checkpoint with the lowest validation loss (the last one unless the run overfits)
run mlstm-eval --checkpoint "$OUT/best" --data "$DATA" --split test --text README.md
run mlstm-export --checkpoint "$OUT/best" --out "$OUT/export"
run mlstm-generate --checkpoint "$OUT/export" --prompt "def " --max-new-tokens 200 \
  --temperature 0.8 --top-k 40 --seed 0
