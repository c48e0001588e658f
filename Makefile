# The two commands of the README: `make demo` (set up, then train the tiny model on the embedded
# corpus on CPU) and `make test` (set up with the reference implementations, lm-eval, wandb, libtpu
# and the CUDA plugin with cuDNN (the TPU and GPU compilers, for compile-check on TPU topologies and
# GPU clusters without a TPU or GPU), then the test suite).
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
# cuDNN for compiling its fused attention (gpu-compile extra, pyproject.toml): the library alone, without
# the CUDA libraries its wheel declares (cuBLAS and more: compiling loads none of them). With the plugin about
# 0.9 GB of wheels; the full jax[cuda12] would be 3.2 GB.
CUDNN := nvidia-cudnn-cu12==9.28.0.42

.PHONY: setup setup-test demo test test-slow lint clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# Stamps keep a second `make` from reinstalling; they are redone when pyproject.toml changes.
$(VENV)/.core: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e .
	touch $@

$(VENV)/.test: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e '.[parity,eval,wandb,parquet,dev,tpu,gpu-compile]'
	$(BIN)/pip install -q --no-deps '$(CUDNN)'
	touch $@ $(VENV)/.core

setup: $(VENV)/.core

setup-test: $(VENV)/.test

demo: setup
	$(BIN)/olmax demo --run-dir runs/demo

# worksteal: an idle worker takes tests queued for the other, so the run does not end on one busy core;
# the 25 slowest tests are listed at the end, where the 10-minute budget goes (docs/testing.md)
test: setup-test
	$(BIN)/python -m pytest -q -n 2 --dist worksteal --durations=25 tests

# ruff (configured in pyproject.toml): lint and formatting, checked, not rewritten; import-linter: the
# packages' layers and the other import contracts of pyproject.toml (docs/architecture.md)
lint: setup-test
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports --no-cache

test-slow: setup-test
	$(BIN)/python -m pytest -q -n 2 --dist worksteal -m slow tests

clean:
	rm -rf $(VENV)
