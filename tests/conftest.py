"""Tests see 8 simulated CPU devices, so sharding and mesh tests run anywhere. Tests marked `parity`
compare against torch, transformers, ai2-olmo-core or lm-eval (the `parity` and `eval` extras) and
are skipped, with the reason, where those are not installed."""

import importlib.util
import os

import pytest

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

REFERENCES = ("torch", "transformers", "olmo_core")


def pytest_collection_modifyitems(config, items):
    missing = [name for name in REFERENCES if importlib.util.find_spec(name) is None]
    if not missing:
        return
    skip = pytest.mark.skip(reason=f"needs the `parity` extra ({', '.join(missing)} not installed)")
    for item in items:
        if "parity" in item.keywords:
            item.add_marker(skip)
