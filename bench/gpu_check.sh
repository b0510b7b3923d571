#!/usr/bin/env bash
# One prepared GPU check (<= 8 minutes on one CUDA GPU; CI never runs it): the delta-rule op
# against fla's kernel, and each method one step at the full Qwen2.5-0.5B shape in bf16, with
# peak GPU memory. Uses the python that holds a CUDA torch ($PYTHON, else python3) and this
# checkout's src/ (nothing installed). Wheels in $WHEELS (a folder), if given, are installed
# to a scratch folder first: fla-core, liger-kernel, a matching transformers.
#   bash bench/gpu_check.sh [--out FILE.json]
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ -n "${WHEELS:-}" ]; then
    site=$(mktemp -d)
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$site" "$WHEELS"/*.whl
    export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
exec timeout 480 "$PY" bench/gpu_check.py "$@"
