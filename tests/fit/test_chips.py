"""The chip table (olmax.fit.chips) is one entry a chip: names, aliases, Cloud TPU's type names and their
slices come from the entry, and a TPU or GPU the table does not know is an error naming its kind, not a
run without a memory bound. The devices the compilers describe for each chip are the entry's (libtpu's
topology description, XLA's GPU target description), and a description that is not is refused."""

import collections
import dataclasses
from types import SimpleNamespace

import pytest

from olmax.errors import ConfigError
from olmax.fit import chips
from olmax.fit.compiler import topology_devices

TPUS = [c for c in chips.CHIPS.values() if c.platform == "tpu"]
GPUS = [c for c in chips.CHIPS.values() if c.platform == "gpu"]


def test_every_name_comes_from_the_entries():
    assert chips.get_chip("Ironwood") is chips.CHIPS["tpu7x"] and chips.get_chip("v5litepod") is chips.CHIPS["v5e"]
    assert set(chips.chip_names()) == {*chips.CHIPS, "ironwood", "v5litepod"}
    with pytest.raises(ConfigError, match="unknown chip 'v9'; known: h100, h200, b200, v4, v5p, v5e, v6e, tpu7x"):
        chips.get_chip("v9")
    # a type's number counts TensorCores on v4 and v5p (2 a chip, one device) and devices elsewhere
    assert chips.libtpu_topology("v5p-128") == "v5p:4x4x4" and chips.tpu_type("v5p:4x4x4") == "v5p-128"
    assert chips.libtpu_topology("v4-8") == "v4:2x2x1" and chips.tpu_type("v4:4x4x4") == "v4-128"
    assert chips.libtpu_topology("v5litepod-16") == "v5e:4x4" and chips.tpu_type("v5e:4x4") == "v5litepod-16"
    assert chips.libtpu_topology("tpu7x-128") == "tpu7x:4x4x4" and chips.tpu_type("tpu7x:2x2x1") == "tpu7x-8"


def test_a_device_the_table_does_not_know():
    assert chips.chip_of_device(SimpleNamespace(platform="cpu", device_kind="cpu")) is None
    assert chips.chip_of_device(SimpleNamespace(platform="tpu", device_kind="TPU v5 lite")) is chips.CHIPS["v5e"]
    assert chips.chip_of_device(SimpleNamespace(platform="tpu", device_kind="TPU v4")) is chips.CHIPS["v4"]
    with pytest.raises(ConfigError, match="the tpu device kind 'TPU v9' is not in olmax's chip table"):
        chips.chip_of_device(SimpleNamespace(platform="tpu", device_kind="TPU v9"))


def four_chips(chip: chips.Chip) -> str:
    """libtpu's name of a slice of 4 chips of a TPU (one host)."""
    return f"{chip.topology}:{'2x2x1' if chip.torus_dims == 3 else '2x2'}"


@pytest.mark.parametrize("chip", TPUS, ids=lambda c: c.name)
def test_libtpus_devices_are_the_tables(chip):
    """libtpu's devices of 4 chips: the entry's device kind, devices_per_chip of them on each chip's
    coordinates, and as many as the slice's Cloud TPU type counts (type_unit_devices)."""
    topology = four_chips(chip)
    devices = topology_devices(topology)
    assert {d.device_kind for d in devices} == {chip.device_kind}
    per_chip = collections.Counter(tuple(d.coords) for d in devices)
    assert len(per_chip) == 4 and set(per_chip.values()) == {chip.devices_per_chip}
    count = int(chips.tpu_type(topology).rpartition("-")[2])
    assert len(devices) == 4 * chip.devices_per_chip == count * chip.type_unit_devices


def test_a_description_that_is_not_the_runs_is_refused(monkeypatch):
    """v4 without its chip config: libtpu 0.0.42.1 describes one device per TensorCore, where a v4 VM
    runs one per chip (megacore)."""
    monkeypatch.setitem(chips.CHIPS, "v4", dataclasses.replace(chips.CHIPS["v4"], libtpu_chip_config=None))
    with pytest.raises(
        ConfigError,
        match="libtpu describes v4:2x2x1 as 8 TPU v4 devices, 2 a chip, where olmax's chip table has 1 TPU v4 device",
    ):
        topology_devices("v4:2x2x1")


@pytest.mark.parametrize("chip", GPUS, ids=lambda c: c.name)
def test_xlas_gpu_devices_are_the_tables(chip):
    pytest.importorskip("jax_cuda12_plugin", reason="needs the gpu-compile extra (make setup-test)")
    devices = topology_devices(f"{chip.topology}:1x2")
    assert [d.device_kind for d in devices] == [chip.device_kind] * 2
