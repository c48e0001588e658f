"""The training loop end to end on the embedded demo corpus: metrics, checkpoints, exact resume."""

import json
import shutil

import jax
import numpy as np
import pytest
from small_run import EXACT_KEYS, small_config

from olmax.checkpoint.store import CheckpointError, load_params
from olmax.errors import ConfigError
from olmax.trainer.run import train


def _rows(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


# 4 steps, checkpointed every 2: a resume from a checkpoint inside the run, then its end
STEPS = ["trainer.max_steps=4", "checkpoint.every=2"]


@pytest.fixture(scope="module")
def stopped(tmp_path_factory):
    """A run stopped at its step-2 checkpoint, and its rows: the tests resume copies of it."""
    tmp = tmp_path_factory.mktemp("stopped")
    rows = train(small_config(tmp, *STEPS), tmp / "run", stop_at=2, progress=False)
    return tmp / "run", rows


def _copy(stopped, to):
    shutil.copytree(stopped[0], to)
    return stopped[1]


def test_resume_continues_exactly(tmp_path, stopped):
    cfg = small_config(tmp_path, *STEPS)
    straight = train(cfg, tmp_path / "a", progress=False)
    assert [r["step"] for r in straight] == [1, 2, 3, 4]
    first = _copy(stopped, tmp_path / "b")
    assert [r["step"] for r in first] == [1, 2]
    # as an attempt that logged step 3 and was killed (mid-line) before its step-4 checkpoint: the
    # resume drops those rows, so metrics.jsonl reads like one run
    with open(tmp_path / "b" / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"step": 3, "train/CE loss": 99.0}) + "\n" + '{"step": 4, "train/CE lo')
    second = train(cfg, tmp_path / "b", progress=False)
    assert [r["step"] for r in second] == [3, 4]
    keys = EXACT_KEYS
    resumed = first + second
    for a, b in zip(straight, resumed):
        assert {k: a[k] for k in keys} == {k: b[k] for k in keys}, (a["step"], a, b)  # bit for bit
    pa, _, _ = load_params(tmp_path / "a" / "checkpoints")
    pb, _, _ = load_params(tmp_path / "b" / "checkpoints")
    for x, y in zip(jax.tree.leaves(pa), jax.tree.leaves(pb)):
        np.testing.assert_array_equal(x, y)
    assert _rows(tmp_path / "b") == first + second
    assert straight[-1]["train/CE loss"] < straight[0]["train/CE loss"]
    assert train(cfg, tmp_path / "a", progress=False) == []  # already done


def test_resume_refuses_a_changed_run(tmp_path, stopped):
    _copy(stopped, tmp_path / "r")
    with pytest.raises(CheckpointError, match="trainer.global_batch 8 -> 16"):
        train(small_config(tmp_path, *STEPS, "trainer.global_batch=16"), tmp_path / "r", progress=False)


def test_one_trainer_per_run_directory(tmp_path):
    import fcntl

    run = tmp_path / "run"
    run.mkdir()
    with open(run / "train.lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)  # as a running trainer holds it
        with pytest.raises(ConfigError, match=f"another olmax train is running in {run}"):
            train(small_config(tmp_path), run, progress=False)
