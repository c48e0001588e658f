#!/usr/bin/env bash
# A Python >= 3.12 venv with MaxText 0.2.5 for the `maxtext` row of train_throughput.py and the MaxText
# rows of `compile.py --remat-sweep` (libtpu: its TPU compiler, which runs on a host without a TPU;
# 0.0.51, not jax's pinned 0.0.50.1, which refuses the splash kernels jax 0.12.0.1 builds).
# `pip install maxtext` declares no dependencies; this is the CPU subset of its requirements that
# its pre-training entry point imports (found by running it: `python -m maxtext.trainers.pre_train.train`).
#   bash benchmarks/maxtext_venv.sh [VENV_DIR]      (default ../maxtext-venv)
#   MAXTEXT_PYTHON=VENV_DIR/bin/python python benchmarks/train_throughput.py --only maxtext
set -euo pipefail
venv=${1:-../maxtext-venv}
python=${PYTHON312:-}
if [ -z "$python" ]; then
  for candidate in python3.12 python3.13 "$(pyenv root 2>/dev/null)"/versions/3.1[23]*/bin/python3; do
    if "$candidate" -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null; then python=$candidate; break; fi
  done
fi
if [ -z "$python" ]; then
  echo "no Python >= 3.12 found (MaxText 0.2.5 needs it); set PYTHON312 to one" >&2
  exit 2
fi
"$python" -m venv "$venv"
"$venv/bin/pip" install -q maxtext==0.2.5 jax==0.12.0.1 jaxlib==0.12.0.1 libtpu==0.0.51 flax==0.12.12 optax==0.2.8 \
  orbax-checkpoint==0.12.8 grain==0.2.18 numpy==2.5.5 omegaconf==2.4.0 absl-py==2.5.1 ml-collections==1.1.0 \
  pydantic==2.14.4 tiktoken==0.14.0 sentencepiece==0.2.3 tensorboardX==2.6.5 jsonlines==4.0.0 jaxtyping==0.3.11 \
  aqtp==0.9.0 qwix==0.1.8 tokamax==0.0.17 transformers==4.57.6 huggingface-hub==0.36.0 datasets==5.0.1 \
  pillow==13.0.0 protobuf==7.36.2 tensorflow-cpu==2.21.0 pathwaysutils==0.1.13 cloud-tpu-diagnostics==0.1.5 \
  cloud-accelerator-diagnostics==0.1.1 google-cloud-monitoring==2.32.0 Jinja2==3.1.6 drjax==0.2.1 sympy==1.14.0 \
  ml-goodput-measurement==0.2.3
echo "MAXTEXT_PYTHON=$venv/bin/python"
