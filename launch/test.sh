#!/usr/bin/env bash
# Set up the environment (if needed) and run the test suite. Extra arguments go to pytest.
#   launch/test.sh --compat oldest|newest [pytest args]: the version-sensitive tests in their own
#   environment at the declared lower bounds or the newest releases (launch/compat.sh)
# The tests run in MLSTM_TEST_WORKERS pytest-xdist workers (default: the cores, at most 4), one test file
# per worker at a time (--dist loadfile: a file's fixtures are built once). Most tests start real
# `deepspeed` launches, whose runner and per-node launcher start one after the other on one core: two
# workers keep both cores of a 2-core machine busy (README, Development). `-n 0` (or
# MLSTM_TEST_WORKERS=1) runs everything in this process, e.g. for --pdb.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
compat=()
if [ "${1:-}" = --compat ]; then
  compat=("$1" "${2:-}")
  shift 2 || shift $#
fi
workers="${MLSTM_TEST_WORKERS:-$(( $(nproc) < 4 ? $(nproc) : 4 ))}"
xdist=()
case " $* " in
  *" -n "* | *" -n"[0-9]* | *" --numprocesses"* | *" -p no:xdist "* | *" --pdb "*) ;;
  *) [ "$workers" -le 1 ] || xdist=(-n "$workers" --dist loadfile) ;;
esac
if [ ${#compat[@]} -gt 0 ]; then
  exec "$ROOT/launch/compat.sh" "${compat[1]}" "${xdist[@]}" "$@"
fi
source "$ROOT/launch/setup_env.sh"
cd "$ROOT"
exec python -m pytest "${xdist[@]}" "$@"  # testpaths in pyproject.toml: tests/
