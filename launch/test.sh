#!/usr/bin/env bash
# Set up the environment (if needed) and run the test suite. Extra arguments go to pytest.
#   launch/test.sh --compat oldest|newest [pytest args]: the version-sensitive tests in their own
#   environment at the declared lower bounds or the newest releases (launch/compat.sh)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [ "${1:-}" = --compat ]; then
  shift
  exec "$ROOT/launch/compat.sh" "$@"
fi
source "$ROOT/launch/setup_env.sh"
cd "$ROOT"
exec python -m pytest "$@"  # testpaths in pyproject.toml: tests/
