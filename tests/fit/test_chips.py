"""The chip table (olmax.fit.chips) is one entry a chip: names, aliases, Cloud TPU's type names and their
slices come from the entry, and a TPU or GPU the table does not know is an error naming its kind, not a
run without a memory bound."""

from types import SimpleNamespace

import pytest

from olmax.errors import ConfigError
from olmax.fit import chips


def test_every_name_comes_from_the_entries():
    assert chips.get_chip("Ironwood") is chips.CHIPS["tpu7x"] and chips.get_chip("v5litepod") is chips.CHIPS["v5e"]
    assert set(chips.chip_names()) == {*chips.CHIPS, "ironwood", "v5litepod"}
    with pytest.raises(ConfigError, match="unknown chip 'v9'; known: h100, h200, b200, v5p, v5e, v6e, tpu7x"):
        chips.get_chip("v9")
    # a type's number counts TensorCores on v5p (2 a chip, one device) and devices elsewhere
    assert chips.libtpu_topology("v5p-128") == "v5p:4x4x4" and chips.tpu_type("v5p:4x4x4") == "v5p-128"
    assert chips.libtpu_topology("v5litepod-16") == "v5e:4x4" and chips.tpu_type("v5e:4x4") == "v5litepod-16"
    assert chips.libtpu_topology("tpu7x-128") == "tpu7x:4x4x4" and chips.tpu_type("tpu7x:2x2x1") == "tpu7x-8"


def test_a_device_the_table_does_not_know():
    assert chips.chip_of_device(SimpleNamespace(platform="cpu", device_kind="cpu")) is None
    assert chips.chip_of_device(SimpleNamespace(platform="tpu", device_kind="TPU v5 lite")) is chips.CHIPS["v5e"]
    with pytest.raises(ConfigError, match="the tpu device kind 'TPU v9' is not in olmax's chip table"):
        chips.chip_of_device(SimpleNamespace(platform="tpu", device_kind="TPU v9"))
