#!/usr/bin/env bash
# olmax on a TPU VM without internet, in two steps:
#
#   bash benchmarks/tpu.sh wheels            # on a machine with PyPI: the wheels a TPU VM lacks -> .whl-tpu/
#   bash benchmarks/tpu.sh run [OUT_DIR]     # on the TPU VM, from the checkout with .whl-tpu/ beside it
#
# `wheels` downloads, for the TPU VM's platform (CPython 3.11, manylinux x86_64), every package of olmax's
# core install and their dependencies except what a TPU VM image brings (jax, jaxlib, libtpu, numpy,
# ml-dtypes, scipy, opt-einsum, sympy, mpmath: TPU_HOST) and the two large families its own package index
# serves (matplotlib and tensorstore with their compiled dependencies: FROM_INDEX; ~30 MiB of wheels are
# left). `run` makes a venv over the system's packages (the image's JAX stays the one imported), installs
# the wheels exactly as pinned (no resolution: --no-deps), FROM_INDEX from the host's index
# ($OLMAX_TPU_INDEX, default file:///opt/pypi/simple) and olmax itself, then runs, each step bounded and
# logged to OUT_DIR/<step>.log:
#   demo        `olmax demo` (the command): the README's first command, on the chip
#   tests       `pytest -m tpu tests/test_tpu.py`: the on-chip tests (docs/testing.md)
#   throughput  benchmarks/tpu_throughput.py: training throughput and MFU (docs/performance.md)
#   decode      benchmarks/tpu_decode.py: sampler tokens/s against the HBM-bandwidth bound (docs/rollout.md)
#   chat        `olmax demo chat`: SFT, DPO and RL of the tiny model on the shipped chat corpus, each
#               scored on held-out prompts (a rerun resumes it: OLMAX_TPU_RUNS on a disk that stays)
# OLMAX_TPU_STEPS picks steps (default "install demo tests throughput decode"). By default the two tables
# take their headline rows only (throughput: the matmul rate and one 7B layer at a fixed fit; decode: the
# 1B at 64 x 128), and each step is bounded (install 60 s, demo 75, tests 245, throughput 100, decode 120:
# at most 600 s, one device call; on a v5e install took 35 s, demo 51, tests 236, the 1B decode row
# 103, the 7B-layer row's compile alone 53; the default set was not run in one call). The whole tables take
# more calls: OLMAX_TPU_THROUGHPUT / OLMAX_TPU_DECODE replace those rows' options and OLMAX_TPU_THROUGHPUT_S /
# OLMAX_TPU_DECODE_S their steps' bounds in seconds (docs/performance.md).
set -uo pipefail
cd "$(dirname "$0")/.."
WHEELS=.whl-tpu
TPU_HOST=(jax jaxlib libtpu numpy ml_dtypes scipy opt_einsum sympy mpmath)
FROM_INDEX=(matplotlib contourpy fonttools kiwisolver pillow tensorstore)
KEEP_ALL=q_proj,k_proj,v_proj,attn_context,o_proj,mlp_gate,mlp_down,mlp_up  # every matmul output kept

wheels() {
  local reqs
  reqs=$(mktemp)
  python3 - "$reqs" "${TPU_HOST[@]}" <<'EOF'
import sys, tomllib
skip = {n.replace("_", "-") for n in sys.argv[2:]}
deps = tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]
open(sys.argv[1], "w").write("\n".join(d for d in deps if d.split("==")[0] not in skip) + "\n")
EOF
  rm -rf "$WHEELS" && mkdir -p "$WHEELS"
  python3 -m pip download -q --only-binary=:all: --python-version 3.11 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any \
    -d "$WHEELS" -r "$reqs" jax==0.10.2 setuptools==80.9.0 wheel==0.45.1 || exit 1
  for name in "${TPU_HOST[@]}" "${FROM_INDEX[@]}"; do rm -f "$WHEELS/$name"-[0-9]*.whl; done
  du -sh "$WHEELS"
}

step() {  # step NAME SECONDS COMMAND...: run it bounded, logged, timed
  local name=$1 seconds=$2 start=$SECONDS
  shift 2
  echo "== $name (at most ${seconds}s): $*" | tee -a "$OUT_DIR/steps.txt"
  timeout "$seconds" "$@" >"$OUT_DIR/$name.log" 2>&1
  local rc=$?
  echo "== $name rc=$rc in $((SECONDS - start))s" | tee -a "$OUT_DIR/steps.txt"
}

install() {
  VENV=$1
  python3 -m venv --system-site-packages "$VENV" || return 1
  local pip=("$VENV/bin/python" -m pip install --isolated -q --no-compile --no-cache-dir)
  "${pip[@]}" --no-index --no-deps "$WHEELS"/*.whl || return 1
  "${pip[@]}" --index-url "${OLMAX_TPU_INDEX:-file:///opt/pypi/simple}" matplotlib==3.11.2 tensorstore ||
    "${pip[@]}" --index-url "${OLMAX_TPU_INDEX:-file:///opt/pypi/simple}" matplotlib tensorstore || return 1
  "${pip[@]}" --no-index --no-deps --no-build-isolation -e . || return 1
  "$VENV/bin/python" -m pip list 2>/dev/null | grep -i -E "^(jax|jaxlib|libtpu|numpy|matplotlib|tensorstore|orbax)"
  "$VENV/bin/python" -c 'import jax, olmax; print("olmax", olmax.__file__, "jax", jax.__version__)'
}

run() {
  OUT_DIR=$(mkdir -p "${1:-${OUT:-tpu-out}}" && cd "${1:-${OUT:-tpu-out}}" && pwd)
  VENV=${OLMAX_TPU_VENV:-/tmp/olmax-tpu}
  RUNS=${OLMAX_TPU_RUNS:-/tmp/olmax-tpu-runs}
  export PYTHONUNBUFFERED=1
  local bin=$VENV/bin
  for s in ${OLMAX_TPU_STEPS:-install demo tests throughput decode}; do
    case $s in
      install) step install 60 bash "$0" install "$VENV" ;;
      demo)
        step demo 75 "$bin/olmax" demo --run-dir "$RUNS/demo"
        cat "$RUNS/demo/summary.json" >>"$OUT_DIR/demo.log" 2>&1 ;;
      tests) step tests 245 "$bin/python" -m pytest -m tpu -q -s -p no:cacheprovider -rs tests/test_tpu.py ;;
      throughput)  # OLMAX_TPU_THROUGHPUT: the script's options (rows, a fit), e.g. "--only 190m"
        step throughput "${OLMAX_TPU_THROUGHPUT_S:-100}" "$bin/python" benchmarks/tpu_throughput.py \
          --json "$OUT_DIR/throughput.json" --compile-cache "$RUNS/jax-cache" \
          ${OLMAX_TPU_THROUGHPUT:---only matmul --only 7b-layers --layers 1 --param-dtype bfloat16 --remat $KEEP_ALL} ;;
      decode)  # OLMAX_TPU_DECODE: the script's options, e.g. "--models 1b,190m,tiny --stop-after 400"
        step decode "${OLMAX_TPU_DECODE_S:-120}" "$bin/python" benchmarks/tpu_decode.py --json "$OUT_DIR/decode.json" \
          --compile-cache "$RUNS/jax-cache" ${OLMAX_TPU_DECODE:---models 1b --shapes b64} ;;
      chat)
        step chat 540 "$bin/olmax" demo chat --run-dir "$RUNS/chat"  # 230 s on a v5e
        cat "$RUNS/chat/summary.json" >>"$OUT_DIR/chat.log" 2>&1 ;;
      *) echo "unknown step $s (install demo tests throughput decode chat)" >&2; return 2 ;;
    esac
  done
}

case ${1:-} in
  wheels) wheels ;;
  run) run "${2:-}" ;;
  install) install "$2" ;;
  *) echo "usage: bash benchmarks/tpu.sh wheels | run [OUT_DIR]" >&2; exit 2 ;;
esac
