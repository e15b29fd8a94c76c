#!/usr/bin/env bash
# Creates .venv (if missing) and installs the project into it. Sourced by the other launch scripts.
#   TORCH_SPEC  pip requirement for torch (default: torch==2.13.0, the CPU build on this kind of
#               machine). On GPU machines set e.g. TORCH_SPEC="torch==2.5.1" with PIP_INDEX_URL/
#               PIP_EXTRA_INDEX_URL pointing at the CUDA wheel index you use.
#   VENV        where the virtual environment lives (default: <repo>/.venv)
#   PYTHON      interpreter used to create it (default: python3)
#   MLSTM_USE_CURRENT_ENV=1  use the `python` already on PATH as it is, installing nothing (an image or a
#               cluster module that already holds torch, deepspeed and the project: bench/gpu_session.sh)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VENV:-$ROOT/.venv}"
PYTHON="${PYTHON:-python3}"
TORCH_SPEC="${TORCH_SPEC:-torch==2.13.0}"

if [ "${MLSTM_USE_CURRENT_ENV:-0}" = 1 ]; then
  VENV="$(dirname "$(dirname "$(command -v python)")")"
  echo "[setup] MLSTM_USE_CURRENT_ENV=1: using $(command -v python) as it is" >&2
elif [ ! -x "$VENV/bin/python" ]; then
  echo "[setup] creating $VENV"
  "$PYTHON" -m venv "$VENV"
  "$VENV/bin/python" -m pip install --quiet --upgrade pip
fi

# Re-install only when the dependency list or torch spec changed: a stamp holds their hash.
stamp="$VENV/.mlstm-ds-installed"
want="$( (cat "$ROOT/pyproject.toml"; echo "$TORCH_SPEC") | sha256sum | cut -d' ' -f1)"
if [ "${MLSTM_USE_CURRENT_ENV:-0}" != 1 ] && [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "[setup] installing $TORCH_SPEC and the project (editable, with dev extras)"
  # torch first and explicitly: an unpinned torch pulled in by deepspeed would be a multi-GB CUDA build.
  "$VENV/bin/python" -m pip install --quiet "$TORCH_SPEC"
  "$VENV/bin/python" -m pip install --quiet -e "$ROOT[dev]"
  echo "$want" > "$stamp"
fi

export PATH="$VENV/bin:$PATH"
# Keep library chatter out of the terminal. Progress bars need no setting: ours and data prep's show only
# when stderr is a terminal (a user's HF_DATASETS_DISABLE_PROGRESS_BARS still wins in data prep).
export WANDB_SILENT="${WANDB_SILENT:-true}"
export TOKENIZERS_PARALLELISM=false
source "$ROOT/launch/ds_accelerator.sh"
