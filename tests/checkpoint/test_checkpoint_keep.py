"""Landmark checkpoints: checkpoint.keep_every and checkpoint.keep_steps are kept for good on top of
the newest checkpoint.keep, saved even off the checkpoint.every grid, and honoured across resumes
(each attempt of resume-until-done prunes the directory with the same policy)."""

import datetime
from types import SimpleNamespace

import pytest
from small_run import small_config

from olmax.checkpoint.store import complete_steps, keep_policy
from olmax.config.io import apply_overrides
from olmax.config.recipes import get_recipe
from olmax.errors import ConfigError
from olmax.trainer.run import train


def _kept(steps, *overrides):
    cfg = apply_overrides(get_recipe("tiny"), list(overrides))
    now = datetime.datetime.now()
    infos = [SimpleNamespace(step=s, time=now, metrics=None) for s in steps]
    decisions = keep_policy(cfg.checkpoint).should_preserve(infos, context=None)
    return [s for s, keep in zip(steps, decisions) if keep]


def test_the_policy_keeps_newest_and_landmarks():
    steps = list(range(100, 2100, 100))
    assert _kept(steps, "checkpoint.keep=2") == [1900, 2000]
    assert _kept(steps, "checkpoint.keep=2", "checkpoint.keep_every=500") == [500, 1000, 1500, 1900, 2000]
    assert _kept(steps, "checkpoint.keep=1", "checkpoint.keep_steps=[300,1234,700]") == [300, 700, 2000]
    with pytest.raises(ConfigError, match="checkpoint.keep_every must be >= 0"):
        apply_overrides(get_recipe("tiny"), ["checkpoint.keep_every=-5"])
    with pytest.raises(ConfigError, match=r"checkpoint.keep_steps must be positive steps, got \[0\]"):
        apply_overrides(get_recipe("tiny"), ["checkpoint.keep_steps=[0]"])


@pytest.mark.slow  # ~30-60 s: a trainer run
def test_training_keeps_landmarks_and_prunes_the_rest(tmp_path):
    cfg = small_config(
        tmp_path,
        "checkpoint.every=1",
        "checkpoint.keep=1",
        "checkpoint.keep_every=4",
        "checkpoint.keep_steps=[3]",
        "eval.every=0",
    )
    train(cfg, tmp_path / "run", stop_at=5, progress=False)
    assert complete_steps(tmp_path / "run" / "checkpoints") == [3, 4, 5]


@pytest.mark.slow  # two trainer runs
def test_landmarks_off_the_grid_are_saved_and_survive_resumes(tmp_path):
    """A resumed run (what each resume-until-done attempt is) prunes with the same policy: the first
    run's landmarks stay, its newest checkpoint goes once a newer one exists; keep_steps off the
    checkpoint.every grid are saved too."""
    run = tmp_path / "run"
    overrides = [
        "checkpoint.every=5",
        "checkpoint.keep=1",
        "checkpoint.keep_every=4",
        "checkpoint.keep_steps=[3,6]",
        "trainer.max_steps=7",
        "eval.every=0",
    ]
    train(small_config(tmp_path, *overrides), run, stop_at=5, progress=False)
    assert complete_steps(run / "checkpoints") == [3, 4, 5]
    train(small_config(tmp_path, *overrides), run, progress=False)
    assert complete_steps(run / "checkpoints") == [3, 4, 6, 7]
