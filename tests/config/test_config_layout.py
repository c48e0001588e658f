"""The global batch on a mesh (olmax.config.layout.split_batch): items per device and micro-batches, and a
micro-batch larger than the per-device batch run as the per-device batch, said once in a warning."""

import logging

import pytest

from olmax.config import layout as layout_module
from olmax.config.experiment import ExperimentConfig
from olmax.config.layout import split_batch
from olmax.config.trainer import TrainerConfig
from olmax.errors import ConfigError

SHAPE = {"data": 2, "fsdp": 4, "context": 1, "tensor": 1}


def layout(global_batch, micro=None):
    cfg = ExperimentConfig(trainer=TrainerConfig(global_batch=global_batch, micro_batch_size=micro))
    return split_batch(cfg, SHAPE)


def test_a_micro_batch_above_the_per_device_batch_is_said(caplog):
    layout_module._warn_clamped.cache_clear()  # another test in this process may have said it already
    with caplog.at_level(logging.WARNING, logger="olmax.config.layout"):
        assert tuple(layout(32, micro=2)) == (8, 4, 2, 2)
        assert not caplog.records
        assert tuple(layout(16, micro=4)) == (8, 2, 2, 1)
        layout(16, micro=4)  # asked again (the fit, the trainer): said once
    (record,) = caplog.records
    assert record.getMessage() == (
        "trainer.micro_batch_size=4 is more than the per-device batch of 2 items (trainer.global_batch=16 over "
        "8 batch shards): each device runs its 2 at once, with no accumulation"
    )


def test_a_batch_the_mesh_cannot_split_names_the_knob():
    with pytest.raises(ConfigError, match=r"trainer.global_batch=12 is not divisible by the data x fsdp devices"):
        layout(12)
    with pytest.raises(ConfigError, match="trainer.micro_batch_size=3 does not divide the per-device batch of 4"):
        layout(32, micro=3)
