#!/usr/bin/env bash
# One short, prepared GPU run: olmax's train step on ONE H100/H200, s/step, tokens/s, TFLOP/s and MFU
# (benchmarks/gpu_mfu.py says what each row is), with the chip's GPU profile from olmax.fit.chips (XLA
# flags, memory fraction, NCCL variables). Made for a GPU lent for ~15 minutes in all: after the
# install, the run is mostly XLA compiling four steps (each step takes about a second or less).
#
#   bash benchmarks/gpu_mfu.sh                      # venv .venv-gpu (python3.11), pip install -e .[gpu], run
#   bash benchmarks/gpu_mfu.sh --dry-run            # the same path on CPU at a tiny size
#   OLMAX_VENV=.venv bash benchmarks/gpu_mfu.sh --dry-run      # use an existing venv as it is
#   OLMAX_PYTHON=python3 OLMAX_WHEELS=.whl bash benchmarks/gpu_mfu.sh   # a host without network whose
#       python already has jax with CUDA (olmax from src/, missing pure-Python wheels from OLMAX_WHEELS)
#
# Arguments go to gpu_mfu.py (--rows, --steps, --warmup, --chip, --set, --json). Unless given, --json goes
# to $OUT/gpu_mfu.json when $OUT is set, else /tmp/gpu_mfu.json.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

if [[ -n "${OLMAX_PYTHON:-}" ]]; then
    py="$OLMAX_PYTHON"
    if [[ -n "${OLMAX_WHEELS:-}" ]]; then
        # e.g. omegaconf==2.4.0, the one olmax.step.train_step import a CUDA image may lack
        "$py" -m pip install -q --no-index --no-deps --target /tmp/olmax-site "$OLMAX_WHEELS"/*.whl
        export PYTHONPATH="/tmp/olmax-site${PYTHONPATH:+:$PYTHONPATH}"
    fi
    export PYTHONPATH="$repo/src${PYTHONPATH:+:$PYTHONPATH}"
else
    venv="${OLMAX_VENV:-$repo/.venv-gpu}"
    if [[ ! -x "$venv/bin/python" ]]; then
        echo "gpu_mfu.sh: creating $venv and installing olmax[gpu] (jax[cuda12]==0.10.2)"
        python3.11 -m venv "$venv"
        "$venv/bin/pip" install -q --upgrade pip
        "$venv/bin/pip" install -q -e "$repo[gpu]"
    fi
    py="$venv/bin/python"
fi

args=("$@")
if [[ " $* " != *" --json "* ]]; then
    args+=(--json "${OUT:-/tmp}/gpu_mfu.json")
fi
if [[ " $* " != *" --dry-run "* ]] && command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader || true
fi
PYTHONUNBUFFERED=1 exec "$py" "$repo/benchmarks/gpu_mfu.py" "${args[@]}"
