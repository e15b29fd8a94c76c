#!/usr/bin/env bash
# Set up the environment (if needed) and run the test suite. Extra arguments go to pytest.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/launch/setup_env.sh"
cd "$ROOT"
exec python -m pytest "$@"  # testpaths in pyproject.toml: tests/
