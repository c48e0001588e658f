"""Elastic resume: a run checkpointed on 8 devices continues on 2 or 4, or on another mesh shape,
with the same global batch (accumulation follows from trainer.micro_batch_size) and the losses of the
uninterrupted 8-device run; and a changed global batch is refused unless explicitly allowed."""

import shutil

import jax
import numpy as np
import pytest
from small_run import small_config

from olmax.checkpoint.store import CheckpointError, load_params
from olmax.trainer.run import train

KEYS = ["train/CE loss", "optim/total grad norm"]
RTOL = 1e-6  # float32 rounding only: different device counts sum the gradients in a different order

pytestmark = pytest.mark.slow  # ~4 min on 2 CPU cores: eight short training runs


def _cfg(tmp_path, *extra):
    return small_config(tmp_path, "trainer.micro_batch_size=1", *extra)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The uninterrupted 8-device run (fsdp=8) and a copy of the same run stopped at step 3."""
    tmp = tmp_path_factory.mktemp("elastic")
    cfg = _cfg(tmp, "mesh.data=1", "mesh.fsdp=-1")
    straight = train(cfg, tmp / "straight", progress=False)
    train(cfg, tmp / "half", stop_at=3, progress=False)
    return tmp, straight


def _resume(tmp, name, *overrides, n_devices):
    shutil.copytree(tmp / "half", tmp / name)
    return train(_cfg(tmp, *overrides), tmp / name, devices=jax.devices()[:n_devices], progress=False)


def _max_rel(a_rows, b_rows):
    return max(abs(a[k] - b[k]) / abs(a[k]) for a, b in zip(a_rows, b_rows) for k in KEYS)


@pytest.mark.parametrize(
    "n_devices, mesh",
    [
        (2, ["mesh.fsdp=-1"]),
        (4, ["mesh.fsdp=-1"]),
        (8, ["mesh.data=-1", "mesh.fsdp=1"]),
        (4, ["mesh.data=2", "mesh.fsdp=2"]),
    ],
)
def test_resume_on_another_mesh(runs, n_devices, mesh):
    tmp, straight = runs
    name = f"on{n_devices}_{'_'.join(mesh)}"
    resumed = _resume(tmp, name, *mesh, n_devices=n_devices)
    assert [r["step"] for r in resumed] == [4, 5, 6]
    rel = _max_rel(straight[3:], resumed)
    print(f"{name}: max relative |delta| of CE loss and grad norm after resume = {rel:.2e}")
    assert rel <= RTOL
    pa, _, _ = load_params(tmp / "straight" / "checkpoints")
    pb, _, _ = load_params(tmp / name / "checkpoints")
    for x, y in zip(jax.tree.leaves(pa), jax.tree.leaves(pb)):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=0, atol=1e-5)


def test_changed_global_batch_needs_the_override(runs):
    tmp, _ = runs
    shutil.copytree(tmp / "half", tmp / "gb16")
    cfg16 = _cfg(tmp, "trainer.global_batch=16")
    with pytest.raises(CheckpointError, match="trainer.global_batch 8 -> 16.*--allow-config-change"):
        train(cfg16, tmp / "gb16", progress=False)
    with pytest.warns(UserWarning, match="changed config: trainer.global_batch 8 -> 16"):
        rows = train(cfg16, tmp / "gb16", allow_config_change=True, stop_at=4, progress=False)
    assert [r["step"] for r in rows] == [4]
    assert rows[0]["throughput/total tokens"] == 4 * 16 * 64


def test_changed_model_is_refused_even_with_the_override(runs):
    tmp, _ = runs
    shutil.copytree(tmp / "half", tmp / "wide")
    with pytest.raises(CheckpointError, match="the model changed.*mlp_hidden 128 -> 256"):
        train(_cfg(tmp, "model.mlp_hidden=256"), tmp / "wide", allow_config_change=True, progress=False)
