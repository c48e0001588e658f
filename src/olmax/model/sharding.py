"""The device mesh and the ONE table that maps logical axis names to mesh axes.

Model code names every parameter dimension with a logical axis (olmax.model.olmo3.param_specs);
this table alone decides how those dimensions are laid out over the mesh. FSDP shards the `embed`
dimension of every matrix over the `fsdp` axis; tensor parallelism shards heads, MLP and vocab over
`tensor`; the batch is split over `data` x `fsdp`; context parallelism splits every sequence (the
logical `seq` axis of the batch and of the activations) into contiguous chunks over `context`, and
attention gathers keys and values over it (olmax.model.attention). Change a layout here, nowhere else.
One operation has its data movement written out here rather than left to XLA: the embedding lookup
under HSDP (`lookup_rows`).

The mesh follows the hardware (`make_mesh`):
- TPU: within a slice, jax's mesh_utils orders the devices so each mesh axis runs along the ICI
  torus; across slices (multislice), only the `data` axis spans the slices, so the one collective
  that crosses the slower data-centre network (DCN) is the gradient all-reduce of data parallelism.
  MeshConfig describes ONE slice; with S slices the `data` axis is S x mesh.data long.
- GPU (and CPU) with several processes, one per node as the Slurm backend starts them: MeshConfig
  describes the WHOLE job, and `node_split` places the innermost axes (tensor, context, then fsdp) within a
  node, over NVLink, as far as they fit, and the rest across nodes. `mesh.data=-1 mesh.fsdp=8` on
  nodes of 8 GPUs is HSDP (parameters sharded within a node, replicated across nodes: OLMo-core's
  `hsdp` default, which AI2's OLMo 3 7B script uses); `mesh.fsdp=-1` shards over every GPU of the
  job (OLMo-core's `fsdp`), so its all-gathers and reduce-scatters cross the inter-node network.
  Both are allowed: the second is what a model too large for one node's HBM needs. Only the batch
  axes (data, fsdp) may cross nodes: each process loads its own rows of the batch.
"""

from __future__ import annotations

import functools
import math
from typing import Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import mesh_utils, multihost_utils
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from olmax.config.mesh import BATCH_AXES, MESH_AXES, MeshConfig, mesh_shape, node_split
from olmax.errors import ConfigError

LOGICAL_AXIS_RULES: tuple[tuple[str, Optional[str | tuple[str, ...]]], ...] = (
    ("batch", BATCH_AXES),
    ("layers", None),
    ("embed", "fsdp"),
    ("vocab", "tensor"),
    ("q_heads", "tensor"),
    ("kv_heads", "tensor"),
    ("mlp", "tensor"),
    ("norm", None),
    ("seq", "context"),
    ("head_dim", None),
)


def num_slices(devices: Sequence[jax.Device]) -> int:
    """TPU slices the devices span (1 for devices that have no slice index: CPU, GPU, one slice)."""
    return len({getattr(d, "slice_index", 0) or 0 for d in devices})


def _by_process(devices: Sequence[jax.Device]) -> list[list[jax.Device]]:
    """The devices grouped by process (a node, one process per node), each group ordered by device id."""
    groups: dict[int, list[jax.Device]] = {}
    for d in devices:
        groups.setdefault(d.process_index, []).append(d)
    nodes = [sorted(groups[p], key=lambda d: d.id) for p in sorted(groups)]
    if len({len(n) for n in nodes}) > 1:
        counts = {p: len(groups[p]) for p in sorted(groups)}
        raise ConfigError(f"processes hold different numbers of devices ({counts}): the mesh needs equal nodes")
    return nodes


def make_mesh(cfg: MeshConfig, devices: Optional[Sequence[jax.Device]] = None) -> Mesh:
    devices = list(devices if devices is not None else jax.devices())
    slices = num_slices(devices)
    if len(devices) % slices:
        raise ConfigError(f"{len(devices)} devices do not split evenly over {slices} slices")
    if slices > 1:
        ici = mesh_shape(cfg, len(devices) // slices)
        dcn = (slices,) + (1,) * (len(MESH_AXES) - 1)
        grid = mesh_utils.create_hybrid_device_mesh(ici, dcn, devices)
    elif devices[0].platform == "tpu":
        grid = mesh_utils.create_device_mesh(mesh_shape(cfg, len(devices)), devices, allow_split_physical_axes=True)
    else:
        nodes = _by_process(devices)
        within, across = node_split(mesh_shape(cfg, len(devices)), len(nodes[0]))
        ordered = [d for node in nodes for d in node]
        grid = mesh_utils.create_hybrid_device_mesh(within, across, ordered, process_is_granule=True)
    # Auto axis types: sharding is propagated by XLA from the parameter and batch layouts.
    return Mesh(grid, MESH_AXES, axis_types=(AxisType.Auto,) * len(MESH_AXES))


def logical_to_spec(axes: Sequence[str], shape: Sequence[int], mesh: Mesh) -> PartitionSpec:
    """PartitionSpec for an array with these logical axes (None: a dimension kept whole). A dimension that
    the mesh axes do not divide stays replicated, and a mesh axis is used at most once per array."""
    rules = dict(LOGICAL_AXIS_RULES)
    used: set[str] = set()
    spec = []
    for name, size in zip(axes, shape):
        if name is None:
            spec.append(None)
            continue
        if name not in rules:
            raise KeyError(f"logical axis {name!r} has no rule in LOGICAL_AXIS_RULES")
        target = rules[name]
        targets = (target,) if isinstance(target, str) else tuple(target or ())
        targets = tuple(a for a in targets if a not in used and mesh.shape[a] > 1)
        if targets and size % math.prod(mesh.shape[a] for a in targets) == 0:
            used.update(targets)
            spec.append(targets[0] if len(targets) == 1 else targets)
        else:
            spec.append(None)
    return PartitionSpec(*spec)


def place(sharding: NamedSharding, x) -> jax.Array:
    """A host array that every process holds whole, as the global array laid out by `sharding` (jit
    takes only global arrays on several processes; jax.make_array_from_process_local_data, with the
    same arguments, takes each process's own part instead)."""
    return jax.make_array_from_callback(np.shape(x), sharding, lambda index: x[index])


def gather(x: jax.Array) -> np.ndarray:
    """A global array whole on every process, which holds only its own devices' shards of it."""
    return np.asarray(multihost_utils.process_allgather(x, tiled=True))


def merge_strided(x: np.ndarray) -> np.ndarray:
    """A host array of which each process filled the rows r with r % process_count == its index, whole
    on every process: the other processes' rows come by an all-gather, sent as bytes so that they
    arrive bit for bit (JAX without x64 would narrow float64 to float32)."""
    procs = jax.process_count()
    if procs == 1:
        return x
    raw = np.ascontiguousarray(x).view(np.uint8).reshape(len(x), -1)
    every = np.asarray(multihost_utils.process_allgather(raw))  # (processes, rows, bytes per row)
    rows = np.arange(len(x))
    return np.ascontiguousarray(every[rows % procs, rows]).view(x.dtype).reshape(x.shape)


def tree_shardings(specs, mesh: Mesh, is_leaf) -> object:
    """NamedShardings for a pytree of objects with `.axes` and `.shape` (e.g. ParamSpec)."""
    return jax.tree.map(lambda s: NamedSharding(mesh, logical_to_spec(s.axes, s.shape, mesh)), specs, is_leaf=is_leaf)


def _mesh_axes(entry) -> tuple[str, ...]:
    """The mesh axes of one PartitionSpec entry (None, a name, or a tuple of names)."""
    return () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _rows(table, ids, dtype):
    """`table.astype(dtype)[ids]` whose gradient is scattered and summed in the table's dtype (float32 in
    training). Autodiff's would scatter-add the bf16 cotangent into a bf16 table, so the embedding
    gradient would be summed across devices in bf16, where OLMo-core's FSDP (`reduce_dtype=float32`)
    sums in float32 (the block weights do so through olmax.model.olmo3.dense)."""
    return table.astype(dtype)[ids]


def _rows_fwd(table, ids, dtype):
    return _rows(table, ids, dtype), (table, ids)  # the table for its shape: it is live anyway


def _rows_bwd(dtype, residuals, g):
    table, ids = residuals
    grad = jnp.zeros(table.shape, table.dtype).at[ids].add(g.astype(table.dtype))
    return grad, np.zeros(ids.shape, jax.dtypes.float0)  # ids are integers: a float0 cotangent


_rows.defvjp(_rows_fwd, _rows_bwd)


def lookup_rows(table, ids, dtype):
    """`table.astype(dtype)[ids]`: the embedding lookup of a table with logical axes (vocab, embed) by
    ids (batch, seq), giving (batch, seq, embed) rows laid out as the residual stream.

    HSDP (the batch split over data x fsdp, the table's columns over fsdp only) gets an explicit
    shard_map, so that neither direction moves more than the rows: every device gathers the ids of its
    fsdp group (small), looks them up in its own columns of the table (summed over `tensor` when the
    vocabulary is split), and one all-to-all over fsdp hands each row, whole, to the device that holds
    it in the batch layout. The gradient is the transpose: the reverse all-to-all and a scatter-add into
    the device's own columns, summed over `data` like every gradient. Left to XLA, the backward pass of
    `table[ids]` on that mesh reshards the batch-split cotangent to the table's layout (columns over
    fsdp, replicated over data), which the SPMD partitioner cannot do with one collective: it gathers
    the whole cotangent on every device ("Involuntary full rematerialization"), or (XLA's GPU compiler)
    gathers the whole table for the lookup and sums a whole-table gradient over every device.
    Everywhere else (one device, pure FSDP, no FSDP) it is the plain lookup: with the batch split over
    the table's column axes alone, XLA's reshard is already one all-to-all."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or mesh.size == 1:
        return _rows(table, ids, dtype)
    table_spec = logical_to_spec(("vocab", "embed"), table.shape, mesh)
    ids_spec = logical_to_spec(("batch", "seq"), ids.shape, mesh)
    vocab_axes, col_axes = _mesh_axes(table_spec[0]), _mesh_axes(table_spec[1])
    row_axes = set(_mesh_axes(ids_spec[0]))
    if not col_axes or not set(col_axes) < row_axes:
        return _rows(table, ids, dtype)

    batch_only = tuple(a for a in _mesh_axes(ids_spec[0]) + _mesh_axes(ids_spec[1]) if a not in vocab_axes + col_axes)

    def local(table, ids):  # table: (vocab shard, column shard); ids: this device's (rows, seq)
        ids = jax.lax.all_gather(ids, col_axes, axis=0, tiled=True)  # the rows of the fsdp group
        # the table's copies over the batch-only axes (data) take different gradients: made varying
        # explicitly, whose transpose sums them (in float32, as `_rows` returns them)
        table = jax.lax.pcast(table, batch_only, to="varying") if batch_only else table
        if vocab_axes:  # each vocabulary shard contributes the rows it holds, zeros elsewhere
            n = table.shape[0]
            local_ids = ids - jax.lax.axis_index(vocab_axes) * n
            held = (local_ids >= 0) & (local_ids < n)
            rows = jax.lax.psum(
                jnp.where(held[..., None], _rows(table, jnp.clip(local_ids, 0, n - 1), dtype), 0), vocab_axes
            )
        else:
            rows = _rows(table, ids, dtype)
        # (group rows, seq, own columns) -> (own rows, seq, all columns), in the fsdp order of both
        return jax.lax.all_to_all(rows, col_axes, split_axis=0, concat_axis=2, tiled=True)

    out_spec = PartitionSpec(ids_spec[0], ids_spec[1], None)
    return jax.shard_map(local, mesh=mesh, in_specs=(table_spec, ids_spec), out_specs=out_spec)(table, ids)


def constrain(x, axes: Sequence[str]):
    """Pin an activation to the layout the rules table gives its logical axes, when traced under a
    mesh (`jax.set_mesh`); a no-op otherwise, so model code stays single-device. Without it XLA may
    let activations inherit a parameter's FSDP layout and rematerialise them."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or mesh.size == 1:
        return x
    return jax.lax.with_sharding_constraint(x, logical_to_spec(axes, x.shape, mesh))
