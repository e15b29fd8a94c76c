#!/usr/bin/env bash
# The wheels a GPU machine's image lacks (its Python 3.12, no network there), fetched here into DEST (default
# .whl/, which .git/info/exclude should list) for bench/gpu_session.sh's install step to take along:
#   bench/gpu_wheels.sh [DEST]
# deepspeed has no wheel on PyPI: it is built here from its source (`pip wheel --no-deps`, no ops compiled:
# DS_BUILD_OPS=0; the app uses torch's fused AdamW). The others are downloaded for CPython 3.12 on
# manylinux x86-64. Each is named with its version: the install step refuses two versions of one package.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEST="${1:-$ROOT/.whl}"
PY="${PYTHON:-python3}"
mkdir -p "$DEST"
PURE="hjson==3.1.0 pydantic==2.14.4 annotated-types==0.8.0 typing-inspection==0.4.5 typing_extensions==4.16.0
  datasets==5.2.0 dill==0.4.1 setuptools==80.9.0"
BINARY="pydantic-core==2.50.5 multiprocess==0.70.19 zstandard==0.25.0"
PLATFORMS="--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64"
# shellcheck disable=SC2086
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp $PLATFORMS \
  -d "$DEST" $PURE $BINARY
if ! ls "$DEST"/deepspeed-0.19.8-*.whl >/dev/null 2>&1; then
  DS_BUILD_OPS=0 "$PY" -m pip wheel -q --no-deps --no-build-isolation -w "$DEST" deepspeed==0.19.8
fi
ls "$DEST"
du -sh "$DEST"
