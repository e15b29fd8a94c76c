#!/usr/bin/env bash
# The version-sensitive tests at one end of the declared dependency ranges, each end in its own
# pip-resolved environment (called by `launch/test.sh --compat oldest|newest`; extra arguments go to pytest):
#   oldest  every dependency in pyproject.toml at its lower bound's release series (launch/compat_pins.py),
#           whatever pip resolves beneath them; torch at TORCH_SPEC (default torch==2.6.0, the floor)
#   newest  the newest releases pip resolves within the declared ranges; torch at TORCH_SPEC (default torch)
# Environment:
#   COMPAT_VENV      the environment (default <repo>/.venv-compat-<end>; reused, re-resolved when pyproject
#                    or the torch spec changed)
#   TORCH_SPEC       pip requirement for torch (see above)
#   TORCH_INDEX_URL  the index torch comes from (default https://download.pytorch.org/whl/cpu, the CPU
#                    builds; empty: pip's own configuration)
#   COMPAT_TESTS     the tests run (default below: exported models under transformers, DeepSpeed's
#                    checkpoint and pipeline internals, Arrow data prep, checkpoints of older trees,
#                    W&B's offline run files and rewind)
#   DRY_RUN=1        print the commands only
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
END="${1:-}"
if [ -z "$END" ] && [ "${DRY_RUN:-0}" = 1 ]; then  # `DRY_RUN=1 launch/compat.sh`: both ends' commands
  for end in oldest newest; do bash "${BASH_SOURCE[0]}" "$end" "$@"; done
  exit 0
fi
case "$END" in
  oldest) default_torch="torch==2.6.0" ;;
  newest) default_torch="torch" ;;
  *) echo "error: --compat takes oldest or newest, not '${END}'" >&2; exit 2 ;;
esac
shift
VENV="${COMPAT_VENV:-$ROOT/.venv-compat-$END}"
TORCH_SPEC="${TORCH_SPEC:-$default_torch}"
TORCH_INDEX_URL="${TORCH_INDEX_URL-https://download.pytorch.org/whl/cpu}"
read -r -a tests <<< "${COMPAT_TESTS:-tests/test_export_hf.py tests/test_checkpoints_consolidate.py tests/test_checkpoints_safety.py tests/test_parallel_pipeline.py tests/test_data_prep_formats.py tests/test_training_tracking.py tests/test_compat_main.py tests/test_fast_start.py}"
pins="$VENV/compat-pins.txt"
torch_index=()
[ -z "$TORCH_INDEX_URL" ] || torch_index=(--index-url "$TORCH_INDEX_URL")

run() {
  echo "+ $*" >&2
  [ "${DRY_RUN:-0}" = 1 ] || "$@"
}

if [ "${DRY_RUN:-0}" != 1 ] && [ ! -x "$VENV/bin/python" ]; then
  echo "[compat] creating $VENV"
  "${PYTHON:-python3}" -m venv "$VENV"
fi
stamp="$VENV/.mlstm-ds-compat"
want="$( (cat "$ROOT/pyproject.toml"; echo "$END $TORCH_SPEC $TORCH_INDEX_URL") | sha256sum | cut -d' ' -f1)"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "[compat] resolving the $END end: $TORCH_SPEC, then the project with its dev extras" >&2
  extras=dev
  if [ "${DRY_RUN:-0}" != 1 ]; then python3 "$ROOT/launch/compat_pins.py" "$END" > "$pins"; fi
  run "$VENV/bin/python" -m pip install --quiet --upgrade "${torch_index[@]}" "$TORCH_SPEC"
  if [ "${DRY_RUN:-0}" != 1 ]; then  # keep that build: an eager upgrade would take PyPI's (CUDA) torch
    # the installed distribution's version: PyPI's CUDA builds say 2.6.0 there but 2.6.0+cu124 in __version__
    echo "torch==$("$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("torch"))')" >> "$pins"
    # a CUDA build pins its own triton (PyPI's torch 2.6.0: triton==3.2.0), which wins over the gpu extra's
    # floor: the Triton core's tests then skip, naming the version (tests/test_model_triton_core.py)
    own="$("$VENV/bin/python" -c 'import importlib.metadata as m, re
print(next((re.sub(r"[ ()]", "", r.split(";")[0]) for r in m.requires("torch") or [] if re.match(r"triton\W", r)), ""))')"
    if [ -n "$own" ]; then
      grep -v '^triton==' "$pins" > "$pins.tmp" || true
      echo "$own" >> "$pins.tmp" && mv "$pins.tmp" "$pins"
      extras=test  # the gpu extra's floor is above it: the suite without that extra, triton as torch has it
    fi
  fi
  run "$VENV/bin/python" -m pip install --quiet --upgrade --upgrade-strategy eager -c "$pins" -e "$ROOT[$extras]"
  [ "${DRY_RUN:-0}" = 1 ] || echo "$want" > "$stamp"
fi
if [ "${DRY_RUN:-0}" != 1 ]; then
  echo "[compat] $END:" $("$VENV/bin/python" -m pip list --format freeze 2>/dev/null |
    grep -iE '^(torch|deepspeed|transformers|huggingface.hub|tokenizers|datasets|pyarrow|numpy|wandb)==' | tr '\n' ' ')
fi
export PATH="$VENV/bin:$PATH" WANDB_SILENT="${WANDB_SILENT:-true}" TOKENIZERS_PARALLELISM=false
# The launch scripts some tests run (sbatch, hostfile launches) source launch/setup_env.sh: point it at this
# environment, marked up to date, or it would reinstall <repo>/.venv with this end's TORCH_SPEC (seen here)
export VENV TORCH_SPEC
[ "${DRY_RUN:-0}" = 1 ] || (cat "$ROOT/pyproject.toml"; echo "$TORCH_SPEC") | sha256sum | cut -d' ' -f1 \
  > "$VENV/.mlstm-ds-installed"
export DS_ACCELERATOR="${DS_ACCELERATOR:-$("$VENV/bin/python" -c 'import torch; print("" if torch.accelerator.is_available() else "cpu")' 2>/dev/null || echo cpu)}"
[ -n "$DS_ACCELERATOR" ] || unset DS_ACCELERATOR
cd "$ROOT"
run "$VENV/bin/python" -m pytest "${tests[@]}" "$@"
