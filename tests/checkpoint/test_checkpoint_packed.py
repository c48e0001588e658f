"""Exact resume and elastic resize with packed documents: the small run on the demo corpus with
`data.packing=obfd` and `data.doc_masking=true` (OLMo-core's NumpyPackedFSLDataset with
generate_doc_lengths, as AI2's stage 3 ran it: padded instances, the padding out of the loss, attention
within documents). A run checkpointed at step 3 on 8 devices and continued logs what the uninterrupted
8-device run logs: bit for bit on the same 8 devices, within float32 rounding on 4 devices (another
summation order of the same batches)."""

import shutil

import jax
import numpy as np
import pytest
from small_run import small_config

from olmax.checkpoint.store import load_params
from olmax.data.loader import make_loader
from olmax.trainer.run import train

PACKED = ["data.packing=obfd", "data.doc_masking=true", "trainer.micro_batch_size=1"]
KEYS = ["train/CE loss", "train/Z loss", "optim/total grad norm", "optim/LR", "data/instances"]
RTOL = 1e-6  # as tests/checkpoint/test_checkpoint_elastic.py: float32 rounding of another device count

pytestmark = pytest.mark.slow  # ~5 min on the 2 shared CPU cores: five short training runs


def _cfg(tmp, *extra):
    return small_config(tmp, *PACKED, *extra)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The uninterrupted 8-device run and a copy of it stopped after step 3."""
    tmp = tmp_path_factory.mktemp("packed")
    cfg = _cfg(tmp, "mesh.data=1", "mesh.fsdp=-1")
    straight = train(cfg, tmp / "straight", progress=False)
    train(cfg, tmp / "half", stop_at=3, progress=False)
    return tmp, cfg, straight


def _resume(tmp, name, *overrides, n_devices):
    shutil.copytree(tmp / "half", tmp / name)
    return train(_cfg(tmp, *overrides), tmp / name, devices=jax.devices()[:n_devices], progress=False)


def _params(run_dir):
    return jax.tree.leaves(load_params(run_dir / "checkpoints")[0])


def test_the_batches_are_packed_and_padded(runs):
    """What the runs train on: whole demo documents, padded, with their doc_lens (so the resumes
    below carry the packed order and the padding's masking across the checkpoint)."""
    tmp, cfg, _ = runs
    it = iter(make_loader(cfg.data, cfg.trainer.global_batch))
    batches = [next(it) for _ in range(cfg.trainer.max_steps)]
    pads = sum(int((b["input_ids"] == cfg.data.pad_token_id).sum()) for b in batches)
    assert pads > 0, "no padding in the first batches: the test would not exercise it"
    assert all(b["doc_lens"].shape == b["input_ids"].shape for b in batches)
    assert all((b["doc_lens"].sum(axis=1) == cfg.data.seq_len).all() for b in batches)


def test_resume_with_packing_is_exact(runs):
    tmp, _, straight = runs
    resumed = _resume(tmp, "same8", "mesh.data=1", "mesh.fsdp=-1", n_devices=8)
    assert [r["step"] for r in resumed] == [4, 5, 6]
    for a, b in zip(straight[3:], resumed):
        assert {k: a[k] for k in KEYS} == {k: b[k] for k in KEYS}, a["step"]
    for x, y in zip(_params(tmp / "straight"), _params(tmp / "same8"), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.mark.parametrize("mesh", [["mesh.data=1", "mesh.fsdp=-1"], ["mesh.data=2", "mesh.fsdp=2"]])
def test_resume_with_packing_on_4_devices(runs, mesh):
    tmp, _, straight = runs
    name = "on4_" + "_".join(mesh)
    resumed = _resume(tmp, name, *mesh, n_devices=4)
    assert [r["step"] for r in resumed] == [4, 5, 6]
    assert [r["data/instances"] for r in resumed] == [r["data/instances"] for r in straight[3:]]
    rel = max(abs(a[k] - b[k]) / abs(a[k]) for a, b in zip(straight[3:], resumed) for k in KEYS[:3])
    print(f"{name}: max relative |delta| of CE, z-loss and grad norm after resume = {rel:.2e}")
    assert rel <= RTOL
    for x, y in zip(_params(tmp / "straight"), _params(tmp / name), strict=True):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=0, atol=1e-5)
