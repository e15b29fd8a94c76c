#!/usr/bin/env bash
# One command for a GPU machine, from a bare one (torch, triton and nvcc there; no network):
#   bench/gpu_session.sh OUTDIR            run it all, planned for about 9 minutes on one H100 or H200 (run 2 took
#                                          507 s; run 3 drops the optimizer step, measured in run 2, for the field size)
#   bench/gpu_session.sh OUTDIR --dry-run  print the plan (commands, time limits), check the wheels, run nothing
# Steps, each with its own time limit, in this order (a step that would start past SESSION_BUDGET_S is skipped
# and said so; later steps never wait on an earlier one's failure):
#   install   the wheels in $WHEELS (default .whl/: deepspeed, datasets, pydantic, ... see bench/README.md, GPU)
#             into the current python, and the project itself (editable, no dependencies)
#   (background, niced) data prep for the train benchmark and the quickstart; bench/kernel_report.py --save on
#             the machine's spare cores (every kernel configuration built for sm_90/89/80: registers, spills,
#             wgmma; it writes bench/results/kernel_report.json, copied to OUTDIR as it stands at the end)
#   layer     bench/mlstm_layer.py --device cuda: the Triton core's loops, the reference core, cuDNN's LSTM, at
#             B16 H256, B64 H1024 and the field's B128 H4096, each beside its roofline (bench/roofline.py)
#   tests     the gpu tests (a barrier that really times out, the fallback from one), the float64 check's own
#             tests, and a 2-rank CPU test beside them (the suite's launches must not take the GPU)
#   train     bench/train_gpu.py: large_b128, large_b256, small, then small again with its choices cached (the
#             first step's time), through the real entry point; one large_b128 step split into its phases
#   gputests  every `gpu`-marked test outside the kernels' files: devices, free memory, transfer and classify
#             on the GPU (one launched rank) against the CPU
#   memory    bench/memory.py --device cuda: each memory estimate of the works the app runs on a GPU against
#             what torch's CUDA allocator hands out
#   quickstart launch/quickstart.sh on the GPU with a MINUTES-minute budget (default 1: train, evaluate,
#             export, generate)
# OUTDIR gets at most 8 files: summary.md, logs.tar.gz, and each benchmark's JSON line (*.json).
# Environment: WHEELS, SESSION_BUDGET_S (default 540), MLSTM_GIT_COMMIT (recorded in the JSON lines where the
# tree has no .git), WORK (scratch, default /tmp/mlstm-gpu-session), SESSION_STEPS (the steps to run, comma-separated;
# default all: install,layer,tests,gputests,train,memory,quickstart; the background work runs with the steps
# that need it), MINUTES (the quickstart's budget), REPORT (0: no kernel report beside the layer and training
# steps, whose launch-bound contenders its compilers slow), MEMORY_ARGS (bench/memory.py's, default --quick:
# the first size of each work, run twice; the whole table twice over does not fit the step's limit).
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${1:?usage: bench/gpu_session.sh OUTDIR [--dry-run]}"
DRY=0
[ "${2:-}" = --dry-run ] && DRY=1
WHEELS="${WHEELS:-$ROOT/.whl}"
WORK="${WORK:-/tmp/mlstm-gpu-session}"
BUDGET="${SESSION_BUDGET_S:-540}"
SESSION_STEPS=",${SESSION_STEPS:-install,layer,tests,gputests,train,memory,quickstart},"
LOGS="$WORK/logs"
START=$(date +%s)
mkdir -p "$OUT" "$LOGS"
SUMMARY="$OUT/summary.md"
cd "$ROOT"
# `python` is the interpreter that holds torch (images often name only python3), its scripts' folder on PATH
PY="$(command -v python3 || command -v python)"
mkdir -p "$WORK/bin"
printf '#!/bin/sh\nexec "%s" "$@"\n' "$PY" >"$WORK/bin/python"
chmod +x "$WORK/bin/python"
export PATH="$WORK/bin:$(dirname "$PY"):$PATH"
export PYTHONUNBUFFERED=1 WANDB_MODE=disabled TOKENIZERS_PARALLELISM=false BENCH_RESULTS_DIR="$WORK/results"
export MLSTM_CACHE_DIR="$WORK/cache" TRITON_CACHE_DIR="$WORK/triton" TORCH_EXTENSIONS_DIR="$WORK/torch_ext"

elapsed() { echo $(($(date +%s) - START)); }
wanted() { [[ "$SESSION_STEPS" == *",$1,"* ]]; }
for s in $(echo "$SESSION_STEPS" | tr ',' ' '); do
  case "$s" in
    install | layer | tests | gputests | train | memory | quickstart) ;;
    *) echo "error: SESSION_STEPS: no step '$s' (install, layer, tests, gputests, train, memory, quickstart)" >&2
       exit 2 ;;
  esac
done
say() { echo "$*" | tee -a "$SUMMARY"; }

# step NAME LIMIT_S MIN_LEFT_S CMD...: run CMD under a time limit, its output in $LOGS/NAME.log, a summary row
step() {
  local name=$1 limit=$2 need=$3
  shift 3
  if ! wanted "$name"; then
    say "| $name | not in SESSION_STEPS | | |"
    return 0
  fi
  if [ "$DRY" = 1 ]; then
    say "| $name | limit ${limit}s | \`$*\` |"
    return 0
  fi
  if [ $(($(elapsed) + need)) -gt "$BUDGET" ]; then
    say "| $name | skipped | $(elapsed)s into the session: under ${need}s left of SESSION_BUDGET_S=$BUDGET |"
    return 0
  fi
  local t0 rc
  t0=$(date +%s)
  timeout --signal=TERM --kill-after=15 "$limit" "$@" >"$LOGS/$name.log" 2>&1
  rc=$?
  local verdict=ok
  [ "$rc" = 0 ] || verdict="rc $rc$([ "$rc" = 124 ] && echo ", stopped at its ${limit}s limit")"
  say "| $name | $verdict | $(($(date +%s) - t0))s | $(tail -n 1 "$LOGS/$name.log" | cut -c1-160 | tr '|' '/') |"
}

last_json() { grep -E '^\{' "$LOGS/$1.log" 2>/dev/null | tail -n 1 >"$OUT/$1.json" || true; }

: >"$SUMMARY"
say "# GPU session $(date -u +%FT%TZ)"
say ""
say "commit ${MLSTM_GIT_COMMIT:-unknown}; $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || echo 'no nvidia-smi')"
say "$(python -c 'import sys, torch, triton; print("python", sys.version.split()[0], "| torch", torch.__version__, "| triton", triton.__version__)' 2>&1 | tail -n 1)"
say ""
say "| step | result | seconds | last line |"
say "|---|---|---|---|"

if [ "$DRY" = 1 ]; then
  n=$(ls "$WHEELS"/*.whl 2>/dev/null | wc -l)
  [ "$n" -gt 0 ] || { echo "error: no wheels in $WHEELS (bench/README.md, GPU, says which)" >&2; exit 2; }
  say "| wheels | $n in $WHEELS | $(du -sh "$WHEELS" | cut -f1) | $(ls "$WHEELS" | sed 's/-[0-9].*//' | tr '\n' ' ') |"
fi

step install 120 60 bash -c "python -m pip install -q --no-index --no-deps --no-compile --upgrade '$WHEELS'/*.whl &&
  python -m pip install -q --no-index --no-deps --no-build-isolation -e '$ROOT'"

# CPU work in the background, niced, while the GPU steps run: every kernel built for three architectures on
# the spare cores (no GPU needed), and data for the benchmarks
KREPORT="" PREP=""
if [ "$DRY" = 0 ]; then
  if [ "${REPORT:-1}" = 1 ] && { wanted layer || wanted train; }; then  # REPORT=0: no compilers beside them
    (nice -n 19 python bench/kernel_report.py --save --jobs "${REPORT_JOBS:-10}" >"$LOGS/kernel_report.log" 2>&1) &
    KREPORT=$!
  fi
  (if wanted train; then
     nice -n 19 python -m data_prep --out "$WORK/data_spm" --max-seq-len 256 --quiet >"$LOGS/prep_spm.log" 2>&1
     nice -n 19 python -m data_prep --out "$WORK/data_byte" --max-seq-len 256 --tokenizer byte --quiet >"$LOGS/prep_byte.log" 2>&1
   fi
   if wanted quickstart; then
     nice -n 19 python -m data_prep --out "$WORK/data_qs" --max-seq-len 128 >"$LOGS/prep_qs.log" 2>&1
   fi) &
  PREP=$!
else
  say "| (background) | kernel report (${REPORT_JOBS:-10} compilers) with layer or train, data prep for train and quickstart | niced | |"
fi

step layer 200 120 python bench/mlstm_layer.py --device cuda --sizes small,large,field --budget-s 15 --reps-small 5 \
  --reps-large 3 --save
wanted layer && [ "$DRY" = 0 ] && last_json layer
# the gpu tests, and beside them (a worker of its own) a 2-rank CPU launch, which must keep off the GPU
step tests 150 60 python -m pytest -q -p no:cacheprovider -n 2 --dist loadfile -k "cuda or pipeline or verify" \
  tests/test_model_triton_core.py tests/test_parallel_pipeline.py tests/test_model_gpu_verify.py
step gputests 120 60 python -m pytest -q -p no:cacheprovider -m gpu tests/test_common_devices.py \
  tests/test_common_resources.py tests/test_classify.py
if [ "$DRY" = 0 ]; then  # the background data prep, bounded: a step never waits without end
  for _ in $(seq 240); do kill -0 "$PREP" 2>/dev/null || break; sleep 1; done
  kill "$PREP" 2>/dev/null && say "| (background) | data prep still running after 240 s: stopped |"
fi
step train 260 150 python bench/train_gpu.py --runs large_b128,large_b256,small,small_warm --steps 20 --skip 6 \
  --phase-split large_b128 --data-spm "$WORK/data_spm" --data-byte "$WORK/data_byte" --keep "$WORK/train" \
  --timeout-s 90 --save
wanted train && [ "$DRY" = 0 ] && last_json train
step memory 200 60 python bench/memory.py --device cuda ${MEMORY_ARGS---quick}
wanted memory && [ "$DRY" = 0 ] && last_json memory
# 1 minute of training, plus start-up, the final evaluation, samples, evaluate, export, generate: ~3 minutes
step quickstart 200 150 env -u STEPS MLSTM_USE_CURRENT_ENV=1 MINUTES="${MINUTES:-1}" DATA="$WORK/data_qs" OUT="$WORK/qs" \
  ./launch/quickstart.sh

if [ "$DRY" = 0 ]; then
  # the kernel report, given what is left of the budget to finish; it saves as it goes, so a stop keeps its builds
  while [ -n "$KREPORT" ] && kill -0 "$KREPORT" 2>/dev/null && [ "$(elapsed)" -lt "$BUDGET" ]; do sleep 2; done
  if [ -n "$KREPORT" ] && kill -0 "$KREPORT" 2>/dev/null; then
    pkill -f "bench/kernel_report.py"
    say "| (background) | kernel report stopped at the budget: $(grep built "$LOGS/kernel_report.log" | tail -n 1) |"
  fi
  [ -z "$KREPORT" ] || cp bench/results/kernel_report.json "$OUT/kernel_report.json" 2>/dev/null
  jobs -p | xargs -r kill 2>/dev/null  # background work still going
  grep -h -E "mLSTM core on|optimizer:|resumed|test split|first step|samples @" "$LOGS"/*.log "$WORK"/train/*.log 2>/dev/null \
    | cut -c1-400 | sort -u >"$LOGS/highlights.txt"
  cp -r "$WORK/results" "$LOGS/results" 2>/dev/null
  tar -czf "$OUT/logs.tar.gz" -C "$WORK" logs $(cd "$WORK" && ls -d train/*.log qs/metrics.jsonl qs/*.json 2>/dev/null)
fi
say ""
say "total $(elapsed)s"
