#!/usr/bin/env bash
# olmax on a TPU VM without internet, in two steps:
#
#   bash benchmarks/tpu.sh wheels            # on a machine with PyPI: the wheels a TPU VM lacks -> .whl-tpu/
#   bash benchmarks/tpu.sh run [OUT_DIR]     # on the TPU VM, from the checkout with .whl-tpu/ beside it
#
# `wheels` downloads, for the TPU VM's platform (CPython 3.11, manylinux x86_64), every package of olmax's
# core install and their dependencies except what a TPU VM image brings (jax, jaxlib, libtpu, numpy,
# ml-dtypes, scipy, opt-einsum, sympy, mpmath: TPU_HOST) and the two large families its own package index
# serves (matplotlib and tensorstore with their compiled dependencies: FROM_INDEX; ~38 MiB of wheels are
# left), and into .whl-tpu/maxtext/ what the `maxtext` step installs (~8 MiB). `run` makes a venv over
# the system's packages (the image's JAX stays the one imported), installs the wheels exactly as pinned
# (no resolution: --no-deps), FROM_INDEX from the host's index ($OLMAX_TPU_INDEX, default
# file:///opt/pypi/simple) and olmax itself, then runs, each step bounded and logged to OUT_DIR/<step>.log:
#   demo        `olmax demo` (the command): the README's first command, on the chip
#   tests       `pytest -m tpu tests/test_tpu.py`: the on-chip tests (docs/testing.md)
#   throughput  benchmarks/tpu_throughput.py: training throughput and MFU (docs/performance/tpu-v5e.md)
#   decode      benchmarks/tpu_decode.py: sampler tokens/s against the HBM-bandwidth bound (docs/rollout.md)
#   start       benchmarks/start_time.py: `olmax train`'s time to its first step, cold and warm (the
#               compilation cache; docs/performance/fast-start.md), by default at the 190m row's shape
#   rollout     benchmarks/rollout_efficiency.py: the continuous-batching slot engine against pure decode
#               at the same slots (docs/rollout-engine.md), by default the 190m shape (the 1B: below)
#   chat        `olmax demo chat`: SFT, DPO and RL of the tiny model on the shipped chat corpus, each
#               scored on held-out prompts (a rerun resumes it: OLMAX_TPU_RUNS on a disk that stays)
#   chat-static after chat: its RL stage again from the same DPO checkpoint with static rollouts
#               (grpo.rollout_engine=static; the continuous stage kept as rl-continuous); each of the two
#               logs its RL stage's steps and sampling seconds, slot efficiency and staleness
#   maxtext     MaxText's own trainer on the chip at the fits the throughput step chose (after it, in
#               the same call): benchmarks/tpu_maxtext.py, installed from .whl-tpu/maxtext/ (its source,
#               made Python 3.11-ready by `wheels`, and the wheels of its needs the VM's index lacks)
# OLMAX_TPU_STEPS picks steps (default "install demo tests throughput decode"). By default the two tables
# take their headline rows only (throughput: the matmul rate and one 7B layer at a fixed fit; decode: the
# 1B at 64 x 128), and each step is bounded (install 45 s, demo 65, tests 300, throughput 120, decode
# 100; the steps take about 530 s, one device call). On a v5e the whole default set took 375 s in one call
# (2026-12-06, with RoPE's rotation, docs/performance/tpu-v5e.md; install 21 s, demo 51, tests 204,
# throughput 22 with a compile cache that held its programs, where the 7B-layer row alone takes 61 s
# without one; decode 77, its parameters' init 32 s of compiling); on a fresh machine without that cache,
# 531 s (2026-12-07 21:10 UTC, the slot engine's and the decode kernel's on-chip tests included: install
# 32, demo 55, tests 275, throughput 101, decode 68). The whole
# tables take more calls: OLMAX_TPU_THROUGHPUT / OLMAX_TPU_DECODE / OLMAX_TPU_MAXTEXT replace or add those
# steps' options and OLMAX_TPU_THROUGHPUT_S / _DECODE_S / _MAXTEXT_S their bounds in seconds
# (docs/performance/tpu-v5e.md has each figure with the options that produced it).
set -uo pipefail
cd "$(dirname "$0")/.."
WHEELS=.whl-tpu
TPU_HOST=(jax jaxlib libtpu numpy ml_dtypes scipy opt_einsum sympy mpmath)
FROM_INDEX=(matplotlib contourpy fonttools kiwisolver pillow tensorstore)
KEEP_ALL=q_proj,k_proj,v_proj,attn_context,o_proj,mlp_gate,mlp_down,mlp_up  # every matmul output kept
# `olmax train` at the throughput table's 190m row (2 x 8192 tokens of the demo corpus a step), remat=auto
START_190M="--set data.paths=[demo] --set data.seq_len=8192 --set trainer.global_batch=2 --set mesh.fsdp=-1
  --set model.remat=auto --set trainer.micro_batch_size=null"
# the rollout step's runs: the slot engine at GRPO-like shapes that fit one v5e with the weights, one a
# call by default (2026-12-07 23:24 UTC, with the decode kernel: the 190m took 129 s on a fresh machine, 52 s
# of it compiling, the 1B 210 s; their compiles are kept in $RUNS/jax-cache, which a second call on the
# still-warm machine reads). The 1B:
# OLMAX_TPU_ROLLOUT=1b in a call of its own (docs/rollout-engine.md; OLMAX_TPU_ROLLOUT_S: the bound)
ROLLOUT_190M="--model 190m --slots 64 --prompt-len 128 --max-new 2048 --prompts 16 --n 8 --runs 1 --no-static"
ROLLOUT_1B="--model 1b --slots 32 --prompt-len 128 --max-new 2048 --prompts 8 --n 8 --runs 1 --no-static"
# MaxText for the side-by-side rows (benchmarks/tpu_maxtext.py): 0.2.4 names jax 0.10.2 and libtpu
# 0.0.42.1, a TPU VM's; its needs that the VM's index lacks travel as wheels, the rest come from the index
MAXTEXT=maxtext==0.2.4
MAXTEXT_CARRIED=(grain==0.2.18 array_record==0.8.6 aqtp==0.9.0 tokamax==0.0.12 pathwaysutils==0.1.13 qwix==0.1.8
  drjax==0.2.1 einshape==1.0 portpicker==1.6.0 typeguard==2.13.3)
MAXTEXT_ANTLR=antlr4-python3-runtime==4.9.3
MAXTEXT_FROM_INDEX=(flax==0.12.8 optax==0.2.8 orbax-checkpoint==0.12.4 omegaconf==2.3.1 pydantic==2.13.5
  ml-collections==1.1.0 tiktoken==0.14.0 sentencepiece==0.2.2 jaxtyping==0.3.11 transformers==5.17.0 jinja2 pillow
  sympy pyyaml tensorboardX)

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
  maxtext_wheels "$WHEELS/maxtext" || exit 1
  du -sh "$WHEELS"
  du -sh "$WHEELS/maxtext"
}

maxtext_wheels() (  # DIR: MaxText's source, Python 3.11-ready, and the wheels of its needs the VM's index lacks
  dir=$1
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT  # a subshell: its own exit
  rm -rf "$dir" && mkdir -p "$dir"
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 -d "$tmp" "$MAXTEXT" || return 1
  unzip -q "$tmp"/maxtext-*.whl 'maxtext/*' -x 'maxtext/assets/*' 'maxtext/examples/*' -d "$tmp/src" || return 1
  # Two PEP 695 aliases (`type X = ...`, Python >= 3.12) become plain assignments: all that keeps the
  # trainer's modules from Python 3.11 (found with `python3.11 -m compileall` over the package)
  sed -i -E 's/^type ([A-Za-z_]+) = /\1 = /' "$tmp"/src/maxtext/kernels/mhc/{api,common}.py || return 1
  if grep -rqE '^type [A-Za-z_]+ = ' "$tmp/src/maxtext"; then
    echo "maxtext_wheels: a 'type X = ...' alias is left in $MAXTEXT (Python 3.11 cannot import it)" >&2
    return 1
  fi
  tar czf "$dir/maxtext-src.tgz" -C "$tmp/src" maxtext || return 1
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.11 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux2014_x86_64 \
    --platform any -d "$dir" "${MAXTEXT_CARRIED[@]}" || return 1
  python3 -m pip wheel -q --no-deps -w "$dir" "$MAXTEXT_ANTLR" || return 1  # omegaconf's; PyPI has no wheel
)

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

maxtext_install() {  # VENV: MaxText's needs (carried wheels, the rest from the VM's index) and its source
  VENV=$1
  python3 -m venv --system-site-packages "$VENV" || return 1
  local pip=("$VENV/bin/python" -m pip install --isolated -q --no-compile --no-cache-dir)
  "${pip[@]}" --index-url "${OLMAX_TPU_INDEX:-file:///opt/pypi/simple}" --find-links "$WHEELS/maxtext" \
    "${MAXTEXT_CARRIED[@]}" "$MAXTEXT_ANTLR" "${MAXTEXT_FROM_INDEX[@]}" || return 1
  tar xzf "$WHEELS/maxtext/maxtext-src.tgz" -C "$VENV" || return 1
  DECOUPLE_GCLOUD=TRUE JAX_PLATFORMS=cpu PYTHONPATH="$VENV${PYTHONPATH:+:$PYTHONPATH}" "$VENV/bin/python" -c \
    'import jax, maxtext.trainers.pre_train.train as t; print("maxtext", t.__file__, "jax", jax.__version__)'
}

run() {
  OUT_DIR=$(mkdir -p "${1:-${OUT:-tpu-out}}" && cd "${1:-${OUT:-tpu-out}}" && pwd)
  VENV=${OLMAX_TPU_VENV:-/tmp/olmax-tpu}
  RUNS=${OLMAX_TPU_RUNS:-/tmp/olmax-tpu-runs}
  MT_VENV=${OLMAX_TPU_MAXTEXT_VENV:-/tmp/maxtext-tpu}
  export PYTHONUNBUFFERED=1
  local bin=$VENV/bin n_rollout=0
  for s in ${OLMAX_TPU_STEPS:-install demo tests throughput decode}; do
    case $s in
      install) step install 45 bash "$0" install "$VENV" ;;
      demo)
        step demo 65 "$bin/olmax" demo --run-dir "$RUNS/demo"
        cat "$RUNS/demo/summary.json" >>"$OUT_DIR/demo.log" 2>&1 ;;
      tests) step tests 300 "$bin/python" -m pytest -m tpu -q -s -p no:cacheprovider -rs --durations=8 tests/test_tpu.py ;;
      throughput)  # OLMAX_TPU_THROUGHPUT: the script's options (rows, a fit), e.g. "--only 190m"
        step throughput "${OLMAX_TPU_THROUGHPUT_S:-120}" "$bin/python" benchmarks/tpu_throughput.py \
          --json "$OUT_DIR/throughput.json" --compile-cache "$RUNS/jax-cache" \
          ${OLMAX_TPU_THROUGHPUT:---only matmul --only 7b-layers --fit 7b-layers:1:bfloat16:$KEEP_ALL} ;;
      decode)  # OLMAX_TPU_DECODE: the script's options, e.g. "--models 1b,190m,tiny --stop-after 400"
        step decode "${OLMAX_TPU_DECODE_S:-100}" "$bin/python" benchmarks/tpu_decode.py --json "$OUT_DIR/decode.json" \
          --compile-cache "$RUNS/jax-cache" ${OLMAX_TPU_DECODE:---models 1b --shapes b64} ;;
      maxtext)  # MaxText's trainer at the fits of this run's throughput rows; OLMAX_TPU_MAXTEXT: more options
        [ -d "$MT_VENV/maxtext" ] || step maxtext-install 150 bash "$0" maxtext-install "$MT_VENV"
        [ -d "$MT_VENV/maxtext" ] && step maxtext "${OLMAX_TPU_MAXTEXT_S:-300}" "$bin/python" benchmarks/tpu_maxtext.py --json "$OUT_DIR/maxtext.json" \
          --maxtext-python "$MT_VENV/bin/python" --maxtext-src "$MT_VENV" --olmax "$OUT_DIR/throughput.json" \
          ${OLMAX_TPU_MAXTEXT:-} ;;
      start)  # time to the first step of `olmax train`, cold and warm; OLMAX_TPU_START: the script's options
        step start "${OLMAX_TPU_START_S:-540}" "$bin/python" benchmarks/start_time.py --json "$OUT_DIR/start.json" \
          ${OLMAX_TPU_START:---recipe olmo3_7b --shape 190m --rows cold,warm --runs 1 $START_190M} ;;
      rollout)  # OLMAX_TPU_ROLLOUT: the runs' options or shape names (190m, 1b), ';'-separated, a process each
        local spec
        IFS=';' read -ra specs <<<"${OLMAX_TPU_ROLLOUT:-$ROLLOUT_190M}"
        for spec in "${specs[@]}"; do
          case $spec in 190m) spec=$ROLLOUT_190M ;; 1b) spec=$ROLLOUT_1B ;; esac
          step rollout "${OLMAX_TPU_ROLLOUT_S:-520}" "$bin/python" benchmarks/rollout_efficiency.py \
            --json "$OUT_DIR/rollout-$((++n_rollout)).json" --compile-cache "$RUNS/jax-cache" $spec
          cat "$OUT_DIR/rollout.log" >>"$OUT_DIR/rollout-all.log"
        done ;;
      chat)
        step chat 540 "$bin/olmax" demo chat --run-dir "$RUNS/chat"  # 188 s on a v5e (2026-12-07)
        cat "$RUNS/chat/summary.json" >>"$OUT_DIR/chat.log" 2>&1
        rl_stage "$bin/python" "$RUNS/chat/rl" >>"$OUT_DIR/chat.log" ;;
      chat-static)  # after chat: its RL stage again from the same DPO checkpoint, static rollouts
        rm -rf "$RUNS/chat/rl-continuous" && mv "$RUNS/chat/rl" "$RUNS/chat/rl-continuous"
        step chat-static 400 "$bin/olmax" demo chat --run-dir "$RUNS/chat" grpo.rollout_engine=static
        rl_stage "$bin/python" "$RUNS/chat/rl" >>"$OUT_DIR/chat-static.log" ;;
      *) echo "unknown step $s (install demo tests throughput decode maxtext start rollout chat chat-static)" >&2; return 2 ;;
    esac
  done
}

# PYTHON RL_RUN_DIR: an RL stage's wall time from its metrics (its steps and its sampling, summed) with
# its slot efficiency (the stage's decoding, at its last step) and staleness (the mean over the steps);
# then its first three steps alone (compiling) and the rest summed
rl_stage() {
  "$1" - "$2/metrics.jsonl" <<'EOF'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
total = lambda k: sum(r.get(k, 0.0) for r in rows)
print(f"RL stage: {len(rows)} steps, time/step summed {total('time/step'):.1f} s, rollout/sample_s summed "
      f"{total('rollout/sample_s'):.1f} s, slot efficiency {rows[-1].get('rollout/slot_efficiency_run', 0.0):.2f}, "
      f"staleness {total('rollout/staleness_mean') / len(rows):.2f}")
# where the time went: the first steps hold the compiles (the engine's programs, the train step's)
for r in rows[:3]:
    print(f"  step {r.get('step')}: time/step {r.get('time/step', 0.0):.2f} s, sample_s {r.get('rollout/sample_s', 0.0):.2f} s")
rest = rows[3:]
print(f"  steps 4-{len(rows)}: time/step summed {sum(r.get('time/step', 0.0) for r in rest):.1f} s, "
      f"sample_s summed {sum(r.get('rollout/sample_s', 0.0) for r in rest):.1f} s")
EOF
}

case ${1:-} in
  wheels) wheels ;;
  run) run "${2:-}" ;;
  install) install "$2" ;;
  maxtext-install) maxtext_install "$2" ;;
  *) echo "usage: bash benchmarks/tpu.sh wheels | run [OUT_DIR]" >&2; exit 2 ;;
esac
