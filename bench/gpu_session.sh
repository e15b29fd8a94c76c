#!/usr/bin/env bash
# One command for a GPU machine, from a bare one (torch, triton and nvcc there; no network):
#   bench/gpu_session.sh OUTDIR            run the session, planned for at most 11 minutes (SESSION_BUDGET_S=660)
#   bench/gpu_session.sh OUTDIR --dry-run  print the plan (commands, time limits), check the wheels, run nothing
# Where one command may run 10 minutes at most (the device tool), as two calls on the same machine, back to back
# (WORK's caches kept between them; each call's OUTDIR brought back):
#   SESSION_STEPS=install,warm,layer,tuner bash bench/gpu_session.sh OUTDIR       345 s of limits
#   SESSION_STEPS=install,train,overlap,memory bash bench/gpu_session.sh OUTDIR   315 s (install: a no-op there)
# Steps, each under its own time limit, in this order (a step that would start past SESSION_BUDGET_S is skipped
# and said so; later steps never wait on an earlier one's failure). Nothing compiles beside a timed benchmark:
# `warm` compiles and ranks every shape the timed steps meet first, the data is prepared during it, and no
# compiler runs after it (the kernel report is an opt-in step of its own, last).
#   install   the wheels in $WHEELS (default .whl/, made by bench/gpu_wheels.sh) into the current python, and the
#             project itself (editable, no dependencies)
#   warm      bench/warm_gpu.py: the layer's and the training runs' shapes dispatched once (Triton's kernels into
#             TRITON_CACHE_DIR, the rankings into MLSTM_CACHE_DIR: every candidate of both tilings compiled);
#             beside it, the GPU tests of the poisoned barrier, the overlapped weight gradients and the op's CUDA
#             graphs, and (niced)
#             the training data
#   layer     bench/mlstm_layer.py --device cuda at B16 H256, B64 H1024 and B128 H4096: the Triton core's loops,
#             the reference core, cuDNN's LSTM, each beside its roofline, and the old host wait on and off
#   tuner     bench/gpu_tiles.py at B128 and B256 H4096: every candidate, today's tiles and the l2 ones side by
#             side (GPU_TILES, passed on as MLSTM_GPU_TILES: both, or old / new for an A/B of separate runs),
#             timed afresh as the layer runs it, alone, and by the traffic model
#   train     bench/train_gpu.py: large_b128, large_b256 and small (its first step with a warm cache, its
#             timestamps), through the real entry point; then the two large steps split into their phases,
#             plain and under DeepSpeed, with the DeepSpeed step's costliest kernels
#   overlap   bench/wgrad_overlap.py: the layer's step at B128 and B256 H4096, weight gradients overlapped or not
#   memory    bench/memory.py --device cuda --quick: each GPU estimate against torch's CUDA allocator, first
#             call included
# Opt-in steps (SESSION_STEPS): tests (the kernels' gpu tests), gputests (every other `gpu` test), quickstart
# (launch/quickstart.sh with a MINUTES budget), report (bench/kernel_report.py --save on the machine's cores).
# OUTDIR gets at most 8 files: summary.md, logs.tar.gz, results.jsonl (every benchmark's JSON line, with device,
# driver, torch, Triton and commit: `python bench/gpu_tables.py --add OUTDIR/results.jsonl` files them in
# bench/results/ and rewrites bench/README.md's tables), and kernel_report.json where `report` ran.
# Environment: WHEELS, SESSION_BUDGET_S (660), MLSTM_GIT_COMMIT (recorded in the JSON lines where the tree has
# no .git), WORK (scratch, default /tmp/mlstm-gpu-session), SESSION_STEPS (comma-separated; default
# install,warm,layer,tuner,train,overlap,memory), GPU_TILES (the 4096-wide loops' tilings the tuner offers,
# MLSTM_GPU_TILES for every step: both (default), old or new), MINUTES (the quickstart's budget), MEMORY_ARGS
# (bench/memory.py's, default --quick).
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${1:?usage: bench/gpu_session.sh OUTDIR [--dry-run]}"
DRY=0
[ "${2:-}" = --dry-run ] && DRY=1
WHEELS="${WHEELS:-$ROOT/.whl}"
WORK="${WORK:-/tmp/mlstm-gpu-session}"
BUDGET="${SESSION_BUDGET_S:-660}"
ALL_STEPS="install warm layer tuner train overlap memory tests gputests quickstart report"
SESSION_STEPS=",${SESSION_STEPS:-install,warm,layer,tuner,train,overlap,memory},"
GPU_TILES="${GPU_TILES:-both}"
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
export MLSTM_GPU_TILES="$GPU_TILES"  # the tilings the tuner offers (app/model/gpu_tiles.py)

elapsed() { echo $(($(date +%s) - START)); }
wanted() { [[ "$SESSION_STEPS" == *",$1,"* ]]; }
for s in $(echo "$SESSION_STEPS" | tr ',' ' '); do
  if [[ " $ALL_STEPS " != *" $s "* ]]; then
    echo "error: SESSION_STEPS: no step '$s' ($(echo $ALL_STEPS | sed 's/ /, /g'))" >&2
    exit 2
  fi
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
    say "| $name | limit ${limit}s | \`$(echo "$*" | tr '\n' ' ' | tr -s ' ')\` |"
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


: >"$SUMMARY"
say "# GPU session $(date -u +%FT%TZ)"
say ""
say "commit ${MLSTM_GIT_COMMIT:-unknown}; $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || echo 'no nvidia-smi')"
say "$(python -c 'import sys, torch, triton; print("python", sys.version.split()[0], "| torch", torch.__version__, "| triton", triton.__version__)' 2>&1 | tail -n 1)"
say "budget ${BUDGET}s; tilings offered: MLSTM_GPU_TILES=$GPU_TILES"
say ""
say "| step | result | seconds | last line |"
say "|---|---|---|---|"

if [ "$DRY" = 1 ]; then
  n=$(ls "$WHEELS"/*.whl 2>/dev/null | wc -l)
  [ "$n" -gt 0 ] || { echo "error: no wheels in $WHEELS (bench/gpu_wheels.sh makes them)" >&2; exit 2; }
  say "| wheels | $n in $WHEELS | $(du -sh "$WHEELS" | cut -f1) | $(ls "$WHEELS" | sed 's/-[0-9].*//' | tr '\n' ' ') |"
fi

step install 45 30 bash -c "python -m pip install -q --no-index --no-deps --no-compile --upgrade '$WHEELS'/*.whl &&
  python -m pip install -q --no-index --no-deps --no-build-isolation -e '$ROOT'"

PREP_CMD="nice -n 19 python -m data_prep --out $WORK/data_spm --max-seq-len 256 --quiet &&
  nice -n 19 python -m data_prep --out $WORK/data_byte --max-seq-len 256 --tokenizer byte --quiet"
GPU_TESTS="python -m pytest -q -p no:cacheprovider -m gpu -k 'barrier or overlap or poison or op_graph'
  tests/test_model_triton_core.py tests/test_model_wgrad_overlap.py tests/test_model_op_graph.py"
# the data and the new kernels' gpu tests beside the warm-up (nothing of them timed)
step warm 105 60 bash -c "($PREP_CMD) >'$LOGS/prep.log' 2>&1 & prep=\$!
  ($GPU_TESTS) >'$LOGS/gpu_tests.log' 2>&1 & tests=\$!
  python bench/warm_gpu.py --shapes layer,train; rc=\$?
  wait \$tests; echo \"gpu tests: rc \$? (\$(tail -n 1 '$LOGS/gpu_tests.log'))\"; wait \$prep; exit \$rc"

step layer 120 90 python bench/mlstm_layer.py --device cuda --sizes small,large,field --budget-s 10 --reps-small 4 \
  --reps-large 3 --save
step tuner 75 40 python bench/gpu_tiles.py --shapes 128x4096,256x4096 --save
step train 170 120 python bench/train_gpu.py --runs large_b128,large_b256,small_warm --steps 16 --skip 6 \
  --phase-split large_b128,large_b256 --profile --data-spm "$WORK/data_spm" --data-byte "$WORK/data_byte" \
  --keep "$WORK/train" --timeout-s 75 --save
step overlap 45 30 python bench/wgrad_overlap.py --shapes 128x4096,256x4096 --reps 5 --save
step memory 100 60 python bench/memory.py --device cuda ${MEMORY_ARGS---quick} --save

# opt-in steps
step tests 150 60 python -m pytest -q -p no:cacheprovider -n 2 --dist loadfile -k "cuda or pipeline or verify" \
  tests/test_model_triton_core.py tests/test_parallel_pipeline.py tests/test_model_gpu_verify.py
step gputests 120 60 python -m pytest -q -p no:cacheprovider -m gpu tests/test_common_devices.py \
  tests/test_common_resources.py tests/test_classify.py tests/test_model_gpu_health.py
step quickstart 200 150 env -u STEPS MLSTM_USE_CURRENT_ENV=1 MINUTES="${MINUTES:-1}" DATA="$WORK/data_qs" OUT="$WORK/qs" \
  ./launch/quickstart.sh
step report 300 60 python bench/kernel_report.py --save --jobs "${REPORT_JOBS:-12}"

if [ "$DRY" = 0 ]; then
  cat "$WORK"/results/*.json >"$OUT/results.jsonl" 2>/dev/null
  say ""
  say "JSON lines: $(wc -l <"$OUT/results.jsonl" 2>/dev/null || echo 0) in results.jsonl (bench/gpu_tables.py --add)"
  wanted report && cp bench/results/kernel_report.json "$OUT/kernel_report.json" 2>/dev/null
  grep -h -E "mLSTM core on|optimizer:|first step|grid barrier|gpu tests|samples @|CUDA graphs" "$LOGS"/*.log "$WORK"/train/*.log 2>/dev/null \
    | cut -c1-400 | sort -u >"$LOGS/highlights.txt"
  tar -czf "$OUT/logs.tar.gz" -C "$WORK" logs $(cd "$WORK" && ls -d train/*.log qs/metrics.jsonl qs/*.json 2>/dev/null)
fi
say ""
say "total $(elapsed)s"
