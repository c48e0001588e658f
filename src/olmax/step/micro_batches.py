"""How a global batch becomes a step's micro-batches on the mesh, and how their gradients add up.

The global batch (trainer.global_batch items) is split over the batch shards (data x fsdp devices,
olmax.config.layout); each shard's items run as accum_steps micro-batches of micro_batch items under
jax.lax.scan, gradients summed. Micro-batch k takes items [k*micro, (k+1)*micro) of every shard's own
items, so no data crosses devices; every micro-batch's loss is already divided by its global-batch
denominator (the objective's), so the sum is the step's loss.
"""

from __future__ import annotations

from typing import Callable, Optional

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from olmax.config.layout import BatchLayout


def split(x: jax.Array, layout: BatchLayout, mesh: Mesh, spec: PartitionSpec) -> jax.Array:
    """(global_batch, ...) placed by `spec` -> (accum_steps, batch_shards * micro_batch, ...): micro-batch
    k is rows [k*micro, (k+1)*micro) of every shard's local rows, laid out as `spec` lays out a batch."""
    s, a, m = layout.batch_shards, layout.accum_steps, layout.micro_batch
    x = x.reshape(s, a, m, *x.shape[1:]).swapaxes(0, 1).reshape(a, s * m, *x.shape[1:])
    return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, PartitionSpec(None, *spec)))


def merge(x: jax.Array, layout: BatchLayout) -> jax.Array:
    """`split`'s inverse: (accum_steps, batch_shards * micro_batch, ...) -> (global_batch, ...) in the
    batch's row order."""
    s, a, m = layout.batch_shards, layout.accum_steps, layout.micro_batch
    return x.reshape(a, s, m, *x.shape[2:]).swapaxes(0, 1).reshape(s * a * m, *x.shape[2:])


def accumulate(
    loss_grad: Callable,
    params: dict,
    micro_batches,
    zero_sums: dict,
    combine: Callable[[dict, dict], dict],
    param_shardings,
) -> tuple[dict, dict]:
    """Gradients and metrics over the micro-batches (a scan over their leading axis): `loss_grad(params,
    micro) -> (grads, metrics)`; the gradients are summed, the metrics combined with `combine` from
    `zero_sums`. The running gradients keep the parameters' layout."""

    def body(carry, micro):
        grads, sums = carry
        g, aux = loss_grad(params, micro)
        grads = jax.tree.map(jnp.add, grads, g)
        return (jax.lax.with_sharding_constraint(grads, param_shardings), combine(sums, aux)), None

    zeros = jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), params)
    (grads, sums), _ = jax.lax.scan(body, (zeros, zero_sums), micro_batches)
    return grads, sums


def row_spec(x: jax.Array, batch_spec: PartitionSpec, seq_axis: Optional[str]) -> PartitionSpec:
    """The layout of an array the objective derived from the batch (labels, weights, segments): its rows
    as the batch's, its second axis (the sequence, when it has one) over the context axis, the rest whole."""
    inner = (*([seq_axis] if x.ndim > 1 else []), *([None] * (x.ndim - 2)))
    return PartitionSpec(batch_spec, *inner)
