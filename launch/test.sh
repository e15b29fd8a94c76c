#!/usr/bin/env bash
# Set up the environment (if needed) and run the test suite. Extra arguments go to pytest.
#   launch/test.sh --compat oldest|newest [pytest args]: the version-sensitive tests in their own
#   environment at the declared lower bounds or the newest releases (launch/compat.sh)
# The tests run in MLSTM_TEST_WORKERS pytest-xdist workers (default: the cores, at most 4), one test file
# per worker at a time, the longest files first (--dist loadfile --no-loadscope-reorder, and the order
# tests/tiers.py takes from tests/durations.json). The launched runs many tests read (tests/runs.py) are
# built once, shared by the workers, and kept for the next run of the same tree (docs/development.md, Tests).
# `-n 0`, `-p no:xdist`, --pdb or --trace (or MLSTM_TEST_WORKERS=1) run everything in this process; `-n N`
# sets the workers.
#   launch/test.sh --all [pytest args]: every test (CI's run, .ci/run), the `long` and `cluster` tiers too
#   (pyproject.toml's markers: minutes for a case the default run covers in part; real sshd/pdsh and Slurm
#   clusters, runs driven by real clocks and signals), which the default run (the README's) leaves out and
#   counts (docs/development.md, Tests). `--all` may come anywhere.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
args=()
for a in "$@"; do
  if [ "$a" = --all ]; then export MLSTM_TEST_ALL=1; else args+=("$a"); fi
done
set -- ${args[@]+"${args[@]}"}
compat=()
if [ "${1:-}" = --compat ]; then
  compat=("$1" "${2:-}")
  shift 2 || shift $#
fi
workers="${MLSTM_TEST_WORKERS:-$(( $(nproc) < 4 ? $(nproc) : 4 ))}"
if ! [[ "$workers" =~ ^[0-9]+$ ]]; then
  echo "error: MLSTM_TEST_WORKERS must be a whole number, not '$workers'" >&2
  exit 2
fi
given_n="" given_dist="" one_process=""
prev=""
for a in "$@"; do
  case "$a" in
    -n0 | --numprocesses=0 | -pno:xdist | --pdb | --trace) one_process=1 ;;
    -n?* | --numprocesses=*) given_n=1 ;;
    -n | --numprocesses) given_n=1 ;;
    --dist | --dist=* | -d) given_dist=1 ;;
  esac
  case "$prev $a" in
    "-n 0" | "--numprocesses 0" | "-p no:xdist") one_process=1 ;;
  esac
  prev="$a"
done
xdist=()
if [ -z "$one_process" ] && { [ -n "$given_n" ] || [ "$workers" -gt 1 ]; }; then
  [ -n "$given_n" ] || xdist=(-n "$workers")
  # a file's tests stay in one worker: the Slurm and sshd clusters start once, job logs do not collide
  [ -n "$given_dist" ] || xdist+=(--dist loadfile --no-loadscope-reorder)
fi
if [ ${#compat[@]} -gt 0 ]; then
  exec "$ROOT/launch/compat.sh" "${compat[1]}" "${xdist[@]}" "$@"
fi
source "$ROOT/launch/setup_env.sh"
cd "$ROOT"
# the suite starts hundreds of Python processes that import the project: let them keep its bytecode
# (some environments set PYTHONDONTWRITEBYTECODE, and every process then compiles app/ afresh)
unset PYTHONDONTWRITEBYTECODE
exec python -m pytest "${xdist[@]}" "$@"  # testpaths in pyproject.toml: tests/
