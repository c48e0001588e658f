"""The `mesh` section and what it means on N devices, in plain Python (the launcher reads it on a host
without accelerators): the mesh axes, their sizes once -1 takes the rest of the devices, and how a
job of one process per node splits them within and across nodes. The device mesh itself is built by
olmax.model.sharding.make_mesh."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from olmax.errors import ConfigError


@dataclass(frozen=True)
class MeshConfig:
    """Sizes of the device mesh axes (olmax.model.sharding); -1 means "all remaining devices" (one axis at most).
    The product must be the device count."""

    data: int = 1
    """Data parallelism with replicated parameters: the batch is split over it."""
    fsdp: int = -1
    """Fully sharded data parallelism: the batch is split over it and parameters and optimizer moments
    are sharded along their embed dimension."""
    context: int = 1
    """Context parallelism: every sequence is cut into this many contiguous chunks, one per device along
    the axis (activations, batch and loss stay split so); attention gathers keys and values over it
    (docs/attention.md). data.seq_len must divide by it."""
    tensor: int = 1
    """Tensor parallelism: heads, MLP hidden units and the vocabulary are split over it."""

    def __post_init__(self):
        for name in ("data", "fsdp", "context", "tensor"):
            size = getattr(self, name)
            if not isinstance(size, int) or (size < 1 and size != -1):
                raise ConfigError(
                    f"mesh.{name} must be a positive integer or -1 (the rest of the devices), got {size!r}"
                )


# `context` sits between `fsdp` and `tensor`, as in MaxText's axis order: the later an axis, the closer
# its devices (GPUs: consecutive devices, one node for a context of 8 as AI2 ran it), and after tensor
# parallelism the per-layer gathers of keys and values are the most frequent collectives.
MESH_AXES = ("data", "fsdp", "context", "tensor")
# The axes the batch is split over (the rules table's `batch`, olmax.model.sharding): each process loads
# its own rows, so only these may span processes (nodes).
BATCH_AXES = ("data", "fsdp")


def mesh_shape(cfg: MeshConfig, n_devices: int) -> tuple[int, ...]:
    """Resolve -1 ("the rest of the devices") and check that the axes multiply to n_devices; sizes
    in MESH_AXES order."""
    sizes = [getattr(cfg, axis) for axis in MESH_AXES]
    named = lambda values: " x ".join(f"{a}={v}" for a, v in zip(MESH_AXES, values))
    if sizes.count(-1) > 1:
        raise ConfigError(f"at most one mesh axis may be -1, got {named(sizes)}")
    if cfg.context > 0 and n_devices % cfg.context:
        raise ConfigError(
            f"mesh.context={cfg.context} does not divide the {n_devices} devices: the context axis splits every "
            "sequence over that many devices, which must be a divisor of the device count"
        )
    known = math.prod(s for s in sizes if s != -1)
    if -1 in sizes:
        if n_devices % known:
            raise ConfigError(f"{n_devices} devices are not divisible by the fixed mesh axes (product {known})")
        sizes[sizes.index(-1)] = n_devices // known
    if math.prod(sizes) != n_devices:
        raise ConfigError(f"mesh {named(sizes)} needs {math.prod(sizes)} devices, but {n_devices} are available")
    return tuple(sizes)


def node_split(shape: Sequence[int], per_node: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Split a mesh shape (in MESH_AXES order) into the part within one node of `per_node` devices and
    the part across nodes, elementwise shape = within x across. The innermost axis is placed first
    (tensor, then context, fsdp, data), each wholly within the node while it fits; the first axis that
    does not fit is split (the node's remaining devices within, the rest across) and every axis
    outside it runs across nodes only. An axis that can be split neither way is refused, and so is one
    that spans nodes without splitting the batch (tensor, context): every process loads its own rows of the
    batch (olmax.trainer.run), so the devices that hold one row must all be in one process."""
    within, across, room = [1] * len(shape), [1] * len(shape), per_node
    for i in reversed(range(len(shape))):
        size = shape[i]
        if room % size == 0:
            within[i], room = size, room // size
        elif size % room == 0:
            within[i], across[i], room = room, size // room, 1
        else:
            raise ConfigError(
                f"mesh {MESH_AXES[i]}={size} does not split over nodes of {per_node} devices: the axes inside it "
                f"leave {room} device(s) of each node, and {size} is neither a divisor nor a multiple of {room}"
            )
    for axis, n in zip(MESH_AXES, across):
        if n > 1 and axis not in BATCH_AXES:
            raise ConfigError(
                f"mesh {axis}={shape[MESH_AXES.index(axis)]} would span {n} nodes of {per_node} devices; it must "
                f"stay within a node (each node loads its own rows of the batch, which the {axis} devices share)"
            )
    return tuple(within), tuple(across)


def describe_node_split(shape: Sequence[int], per_node: int) -> str:
    """node_split in words, e.g. "within each node: fsdp=8; across 2 nodes: data=2"."""
    within, across = node_split(shape, per_node)

    def axes(sizes):
        return ", ".join(f"{a}={n}" for a, n in zip(MESH_AXES, sizes) if n > 1)

    if math.prod(across) == 1:
        return "one node" if math.prod(within) == 1 else f"one node: {axes(within)}"
    text = f"within each node: {axes(within) or 'one device'}; across {math.prod(across)} nodes: {axes(across)}"
    spanning = [a for a, w, n in zip(MESH_AXES, within, across) if w > 1 and n > 1]
    if spanning:  # allowed (a model too large for one node needs it), but its collectives leave NVLink
        text += f" ({', '.join(spanning)} spans nodes: its collectives cross the inter-node network)"
    return text
