"""Exact resume: 8 steps + resume + 12 steps, with 2 Grain data-loader worker
processes, log what 20 steps straight with none log, bit for bit, and end with identical parameters."""

import json

import jax
import numpy as np
import pytest
from small_run import EXACT_KEYS
from small_run import SMALL as BASE

from olmax.checkpoint.store import load_params
from olmax.config.io import apply_overrides
from olmax.config.recipes import get_recipe
from olmax.trainer.run import train

SMALL = BASE + ["trainer.max_steps=20", "checkpoint.every=4"]
KEYS = EXACT_KEYS


@pytest.mark.slow  # ~2 min on 2 cores: three short runs, two with worker processes
def test_resume_with_loader_workers_is_exact(tmp_path):
    cfg = lambda *extra: apply_overrides(get_recipe("tiny"), SMALL + [f"data.work_dir={tmp_path / 'cache'}", *extra])
    straight = train(cfg("data.num_workers=0"), tmp_path / "a", progress=False)
    first = train(cfg("data.num_workers=2"), tmp_path / "b", stop_at=8, progress=False)
    second = train(cfg("data.num_workers=2"), tmp_path / "b", progress=False)
    resumed = first + second
    assert [r["step"] for r in resumed] == list(range(1, 21))
    for a, b in zip(straight, resumed):
        assert {k: a[k] for k in KEYS} == {k: b[k] for k in KEYS}, a["step"]
    assert json.loads((tmp_path / "b" / "metrics.jsonl").read_text().splitlines()[-1])["step"] == 20
    pa, pb = load_params(tmp_path / "a" / "checkpoints")[0], load_params(tmp_path / "b" / "checkpoints")[0]
    for x, y in zip(jax.tree.leaves(pa), jax.tree.leaves(pb)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
