"""The node-aware mesh (olmax.model.sharding.make_mesh, node_split) of a job with one process per node, as
the Slurm backend starts it: the inner mesh axes (tensor, fsdp) stay within a node, the rest runs
across nodes. Checked on the split table, on devices handed over in a scrambled order, and for real
with two jax.distributed processes on CPU (Slurm's variables, 4 devices each), whose train step gives
the loss of one process on 8 devices."""

import json
import os
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
from launch_env import slurm_tasks
from small_run import SMALL

from olmax.config.io import apply_overrides
from olmax.config.mesh import MESH_AXES, MeshConfig, describe_node_split, node_split
from olmax.config.recipes import get_recipe
from olmax.errors import ConfigError
from olmax.model.sharding import make_mesh

HSDP = ["mesh.data=-1", "mesh.fsdp=4", "mesh.tensor=1"]  # nodes of 4 devices: shard within, replicate across


def _shape(**sizes) -> tuple[int, ...]:
    return tuple(sizes.get(axis, 1) for axis in MESH_AXES)


def _sizes(**sizes) -> dict[str, int]:
    """A mesh's shape as jax.sharding.Mesh.shape gives it: every axis, 1 unless named."""
    return dict(zip(MESH_AXES, _shape(**sizes)))


@pytest.mark.parametrize(
    "shape, per_node, within, across",
    [
        (_shape(data=2, fsdp=8), 8, _shape(fsdp=8), _shape(data=2)),  # HSDP: OLMo-core's default
        (_shape(fsdp=16), 8, _shape(fsdp=8), _shape(fsdp=2)),  # FSDP over two nodes
        (_shape(data=4, fsdp=4, tensor=2), 8, _shape(fsdp=4, tensor=2), _shape(data=4)),
        (_shape(data=2, fsdp=2, tensor=2), 8, _shape(data=2, fsdp=2, tensor=2), _shape()),  # one node
        # AI2's stage-3 layout: a context group of 8 per node, the batch shards across the 32 nodes
        (_shape(fsdp=32, context=8), 8, _shape(context=8), _shape(fsdp=32)),
        (_shape(fsdp=64, context=4), 8, _shape(fsdp=2, context=4), _shape(fsdp=32)),
        (_shape(fsdp=16, context=2, tensor=2), 8, _shape(fsdp=2, context=2, tensor=2), _shape(fsdp=8)),
    ],
)
def test_node_split_places_inner_axes_within_a_node(shape, per_node, within, across):
    assert node_split(shape, per_node) == (within, across)
    assert tuple(w * a for w, a in zip(within, across)) == shape


@pytest.mark.parametrize(
    "shape, per_node, words",
    [
        (_shape(data=2, fsdp=8), 8, "within each node: fsdp=8; across 2 nodes: data=2"),
        (_shape(fsdp=8), 8, "one node: fsdp=8"),
        (_shape(), 1, "one node"),
        (_shape(data=2), 1, "within each node: one device; across 2 nodes: data=2"),
        (
            _shape(data=2, fsdp=16),
            8,
            "within each node: fsdp=8; across 4 nodes: data=2, fsdp=2 "
            "(fsdp spans nodes: its collectives cross the inter-node network)",
        ),
    ],
)
def test_describe_node_split_names_an_axis_that_spans_nodes(shape, per_node, words):
    assert describe_node_split(shape, per_node) == words


def test_node_split_refuses_an_axis_that_cannot_follow_the_nodes():
    # tensor shares its rows of the batch, and each node (process) loads its own rows
    with pytest.raises(ConfigError, match="mesh tensor=16 would span 2 nodes of 8 devices; it must stay within a node"):
        node_split(_shape(fsdp=4, tensor=16), 8)
    with pytest.raises(ConfigError, match="mesh tensor=3 does not split over nodes of 8 devices"):
        node_split(_shape(fsdp=8, tensor=3), 8)
    with pytest.raises(ConfigError, match="mesh fsdp=6 does not split .* leave 4 device"):
        node_split(_shape(fsdp=6, tensor=2), 8)
    # a context group shares its rows of the batch too: it may not leave the node
    with pytest.raises(ConfigError, match="mesh context=16 would span 2 nodes of 8 devices; it must stay within"):
        node_split(_shape(fsdp=2, context=16), 8)


class _Device:
    """What make_mesh reads of a device of a multi-process job (a jax.Device's attributes)."""

    platform, device_kind = "gpu", "a GPU"

    def __init__(self, process: int, local: int, per_node: int):
        self.process_index, self.id = process, process * per_node + local

    def __repr__(self):
        return f"d{self.id}@p{self.process_index}"


def _scrambled(nodes: int, per_node: int) -> list:
    devices = [_Device(p, i, per_node) for p in range(nodes) for i in range(per_node)]
    order = np.random.default_rng(0).permutation(len(devices))
    return [devices[i] for i in order]


def _processes(mesh, axis: str) -> list[set[int]]:
    """For every group along `axis` (the devices that differ only in that axis): its processes."""
    grid = np.moveaxis(mesh.devices, MESH_AXES.index(axis), -1)
    return [{d.process_index for d in group} for group in grid.reshape(-1, grid.shape[-1])]


def test_mesh_groups_follow_nodes_whatever_the_device_order(monkeypatch):
    # mesh_utils reshapes the objects as it is given them; jax.sharding.Mesh would insist on jax.Devices
    monkeypatch.setattr("olmax.model.sharding.Mesh", lambda grid, axes, axis_types: _GridOnly(grid, axes))
    hsdp = make_mesh(MeshConfig(data=-1, fsdp=8, tensor=1), _scrambled(4, 8))
    assert hsdp.shape == _sizes(data=4, fsdp=8)
    assert all(len(p) == 1 for p in _processes(hsdp, "fsdp"))  # each fsdp group is one node
    assert _processes(hsdp, "data") == [{0, 1, 2, 3}] * 8  # data parallelism across the nodes, in node order
    assert [d.id for d in hsdp.devices[2].ravel()] == list(range(16, 24))  # within a node, by device id

    cross = make_mesh(MeshConfig(data=2, fsdp=-1, tensor=2), _scrambled(4, 8))
    assert cross.shape == _sizes(data=2, fsdp=8, tensor=2)
    assert all(len(p) == 1 for p in _processes(cross, "tensor"))
    # fsdp 8 = 4 within a node x 2 nodes: each group spans two nodes, each node's 4 devices side by side
    for group in np.moveaxis(cross.devices, 1, -1).reshape(-1, 8):
        nodes = [d.process_index for d in group]
        assert nodes == [nodes[0]] * 4 + [nodes[4]] * 4 and nodes[0] != nodes[4]
    # data across the node pairs: fsdp 0-3 sit on nodes 0 | 2, fsdp 4-7 on nodes 1 | 3
    assert _processes(cross, "data") == [{0, 2}] * 8 + [{1, 3}] * 8


def _gpu_compiler():
    pytest.importorskip("jax_cuda12_plugin", reason="needs the gpu-compile extra (make setup-test)")


def test_gpu_cluster_devices_group_by_node():
    """The abstract devices of `olmax compile-check --topology h100:4x8` carry their node as process_index."""
    from olmax.fit.compiler import topology_devices

    _gpu_compiler()

    devices = topology_devices("h100:4x8")
    assert [d.process_index for d in devices] == [n for n in range(4) for _ in range(8)]
    hsdp = make_mesh(MeshConfig(data=-1, fsdp=8, tensor=1), devices)
    assert _processes(hsdp, "fsdp") == [{0}, {1}, {2}, {3}] and _processes(hsdp, "data") == [{0, 1, 2, 3}] * 8
    fsdp = make_mesh(MeshConfig(data=1, fsdp=-1, tensor=1), devices)
    assert _processes(fsdp, "fsdp") == [{0, 1, 2, 3}]  # allowed: FSDP over every GPU of the job
    tp = make_mesh(MeshConfig(data=2, fsdp=-1, tensor=4), devices)
    assert all(len(p) == 1 for p in _processes(tp, "tensor")) and _processes(tp, "fsdp") == [{0, 1}] * 4 + [{2, 3}] * 4


def test_compile_check_reports_the_node_layout():
    """The tiny step compiled by XLA's GPU compiler for 2 nodes of 4 H100s, as HSDP (with one of the
    small run's two layers: the layout reported is the mesh's, and the compile is the test's time)."""
    from olmax.fit.compile_check import compile_report

    _gpu_compiler()
    cfg = _config(HSDP + ["model.attention=xla", "model.n_layers=1"])
    report = compile_report(cfg, topology="h100:2x4")
    assert report["mesh"] == _sizes(data=2, fsdp=4) and report["nodes"] == 2
    assert report["node_layout"] == "within each node: fsdp=4; across 2 nodes: data=2"


def test_mesh_refuses_unequal_nodes():
    devices = [_Device(0, i, 8) for i in range(8)] + [_Device(1, i, 8) for i in range(4)]
    with pytest.raises(ConfigError, match=r"processes hold different numbers of devices \({0: 8, 1: 4}\)"):
        make_mesh(MeshConfig(data=1, fsdp=-1, tensor=1), devices)


class _GridOnly:
    def __init__(self, grid, axes):
        self.devices, self.shape = grid, dict(zip(axes, grid.shape))


def _config(mesh_overrides):
    # a vocabulary of 1024 (random tokens, no tokenizer): the compiles dominate this test's time
    return apply_overrides(get_recipe("tiny"), SMALL + ["model.vocab_size=1024"] + mesh_overrides)


def _tokens(cfg) -> np.ndarray:
    return np.random.default_rng(0).integers(0, cfg.model.vocab_size, (8, cfg.data.seq_len), dtype=np.int32)


def _one_step(cfg, mesh) -> dict:
    """One train step from the seed-0 initial state on the fixed batch; this process feeds its rows."""
    from olmax.step.state import init_train_state
    from olmax.step.train_step import batch_sharding, make_train_step

    sharding = batch_sharding(cfg, mesh)
    tokens = _tokens(cfg)
    rows = sorted({idx[0].start or 0 for idx in sharding.addressable_devices_indices_map(tokens.shape).values()})
    per_device = 8 // (mesh.shape["data"] * mesh.shape["fsdp"])
    local = np.concatenate([tokens[r : r + per_device] for r in rows])
    with jax.set_mesh(mesh):
        state = init_train_state(cfg, mesh, jax.random.key(0))
        batch = {"input_ids": jax.make_array_from_process_local_data(sharding, local)}
        _, metrics = make_train_step(cfg, mesh)(state, batch)
    return {k: float(metrics[k]) for k in ("loss", "grad_norm")}


def node_process() -> None:
    """One 'node' of the two-process test: jax.distributed from Slurm's variables (the worker's own
    set-up), then the HSDP mesh and one step on it. Prints one JSON line. (FSDP over both processes,
    the old layout, trains in tests/trainer/test_train_multihost.py.)"""
    from olmax.cli.worker import distributed_args

    jax.distributed.initialize(**distributed_args(os.environ))
    cfg = _config(HSDP)
    mesh = make_mesh(cfg.mesh)
    out = {
        "process": jax.process_index(),
        "hsdp": {
            "shape": dict(mesh.shape),
            "fsdp_groups": [sorted(p) for p in _processes(mesh, "fsdp")],
            "data_groups": [sorted(p) for p in _processes(mesh, "data")],
            **_one_step(cfg, mesh),
        },
    }
    print("RESULT " + json.dumps(out), flush=True)


@pytest.mark.slow  # two JAX processes; the default run checks the node layout (compile-check test)
def test_two_processes_build_the_node_mesh_and_step_like_one():
    here = Path(__file__).resolve().parent
    folders = [str(here), str(here.parent)]  # this module, and the tests' shared modules it imports
    code = f"import sys; sys.path[:0] = {folders!r}; import test_mesh_nodes as t; t.node_process()"
    procs = slurm_tasks([sys.executable, "-c", code], local_devices=4)
    logs = [p.communicate(timeout=300)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), "\n".join(log[-3000:] for log in logs)
    results = [json.loads(line[7:]) for log in logs for line in log.splitlines() if line.startswith("RESULT ")]
    assert [r["process"] for r in results] == [0, 1]

    got = [r["hsdp"] for r in results]
    assert got[0] == got[1]  # both processes built the same mesh and computed the same step
    assert got[0]["shape"] == _sizes(data=2, fsdp=4)
    assert got[0]["fsdp_groups"] == [[0], [1]]  # fsdp within each process ("node")
    assert got[0]["data_groups"] == [[0, 1]] * 4  # data parallelism across the two
    cfg = _config(HSDP)
    single = _one_step(cfg, make_mesh(cfg.mesh))  # this process: all 8 devices in one node
    for key in ("loss", "grad_norm"):
        assert got[0][key] == pytest.approx(single[key], rel=1e-6), key
