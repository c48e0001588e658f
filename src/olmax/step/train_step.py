"""The jitted, sharded training step: `train_step(state, batch) -> (state, metrics)`, the same for every
objective (olmax.objectives: the step asks the run's objective, never its name).

- The mesh and the ONE rules table in olmax.model.sharding decide every layout: parameters and both
  optimizer moments follow `param_specs` (FSDP shards their `embed` dimension, tensor parallelism
  their heads/MLP/vocab), each batch field its declared logical axes (the item axis over data x fsdp,
  the sequence over context), the step and the skip window are replicated.
- A step: the objective checks the batch; each field is placed; the objective prepares the per-item
  arrays (and what the whole batch decides, e.g. the LM loss's denominator); they are split into
  micro-batches (olmax.step.micro_batches) whose gradients and metrics are accumulated under
  jax.lax.scan; the objective finishes them (gradients, the loss the skip rule watches, metrics) and
  may hold the update; skip-step AdamW applies it.
- The global batch (trainer.global_batch items of the objective's data: token instances, preference
  pairs, packed rollout rows) is fixed by the recipe. Each batch shard (one data x fsdp coordinate)
  holds global_batch / (data * fsdp) items and runs them as per-device / trainer.micro_batch_size
  micro-batches, summing gradients; every micro-batch's loss is already divided by its global-batch
  denominator, so the split changes nothing.
- Step numbering is OLMo-core's: state.step counts completed steps, the step being taken is
  state.step + 1 and the learning rate is schedule(state.step + 1). The step advances when the
  optimizer skips.
"""

from __future__ import annotations

from typing import Callable, Optional

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from olmax.config.experiment import ExperimentConfig, check_context
from olmax.config.layout import BatchLayout, split_batch
from olmax.config.remat import AUTO
from olmax.errors import ConfigError
from olmax.model.attention import resolve_backend
from olmax.model.sharding import logical_to_spec
from olmax.objectives.base import BatchField, Objective, StepContext
from olmax.objectives.registry import objective_of
from olmax.step.micro_batches import accumulate, row_spec, split
from olmax.step.schedules import make_schedule
from olmax.step.state import TrainState, optimizer, state_shardings


def batch_layout(cfg: ExperimentConfig, mesh: Mesh) -> BatchLayout:
    """`split_batch` on `mesh` (errors name the knob), after what a context axis needs of the sequence for
    the platform of the mesh's devices: `auto` attention is splash on a TPU, whose tiles must fit."""
    context = mesh.shape.get("context", 1)
    if context > 1:
        check_context(cfg, context)
        device = mesh.abstract_mesh.abstract_device  # None for a mesh of no particular devices
        if device and resolve_backend(cfg.model.attention, device.platform, cfg.model.compute_dtype) == "splash":
            cfg.model.splash_blocks.tiles(cfg.data.seq_len, context)
    return split_batch(cfg, mesh.shape)


def batch_sharding(cfg: ExperimentConfig, mesh: Mesh) -> NamedSharding:
    """A (global_batch, seq_len) array of rows: batch axis over data x fsdp, sequence over context."""
    shape = (cfg.trainer.global_batch, cfg.data.seq_len)
    return NamedSharding(mesh, logical_to_spec(("batch", "seq"), shape, mesh))


def field_sharding(field: BatchField, mesh: Mesh) -> NamedSharding:
    """Where a batch field lies: its logical axes through the rules table."""
    return NamedSharding(mesh, logical_to_spec(field.axes, field.shape, mesh))


def batch_shardings(cfg: ExperimentConfig, mesh: Mesh, objective: Optional[Objective] = None) -> dict:
    """{field: NamedSharding} of every field the objective's batch may hold (place batches so: no copy)."""
    fields = (objective or objective_of(cfg)).fields(cfg)
    return {k: field_sharding(f, mesh) for k, f in fields.items()}


def abstract_batch(cfg: ExperimentConfig, mesh: Mesh) -> dict:
    """The batch this run's data carries, as placed abstract arrays (what the fit compiles the step for)."""
    fields = objective_of(cfg).fields(cfg)
    return {
        k: jax.ShapeDtypeStruct(f.shape, f.dtype, sharding=field_sharding(f, mesh))
        for k, f in fields.items()
        if f.carried
    }


def make_train_step(
    cfg: ExperimentConfig, mesh: Mesh, *, epoch_batches: Optional[int] = None
) -> Callable[[TrainState, dict], tuple[TrainState, dict]]:
    """The jitted step. batch: the objective's fields (olmax.objectives: `fields` says which, their shapes
    and whether each is needed; `check_batch` refuses another batch naming the key). The state argument
    is donated. Metrics (float32 scalars): the objective's (its metric_names' keys), grad_norm (before
    clipping), lr, skipped (1.0 when the optimizer skipped), tokens (input tokens this step, padding
    included). `epoch_batches`: the global batches in one epoch of the run's data, which
    schedule.t_max_epochs needs."""
    if cfg.model.remat == AUTO:
        raise ConfigError("model.remat=auto has not been chosen for this mesh: olmax.fit.remat.choose_remat first")
    objective = objective_of(cfg)
    ctx = StepContext(cfg, mesh, batch_layout(cfg, mesh))
    opt = optimizer(cfg)
    tokens_per_step = cfg.rows_per_step * cfg.data.seq_len  # input tokens, padding included
    schedule = make_schedule(
        cfg.schedule,
        lr=cfg.optimizer.lr,
        max_steps=cfg.trainer.max_steps,
        tokens_per_step=tokens_per_step,
        epoch_batches=epoch_batches,
    )
    shardings = state_shardings(cfg, mesh)
    fields = objective.fields(cfg)
    field_specs = {k: field_sharding(f, mesh).spec for k, f in fields.items()}
    rows = batch_sharding(cfg, mesh).spec  # (batch axes, seq axis)

    def grads_of(params, batch: dict):
        objective.check_batch(cfg, batch)
        placed = {
            k: jax.lax.with_sharding_constraint(batch[k], NamedSharding(mesh, spec))
            for k, spec in field_specs.items()
            if batch.get(k) is not None
        }
        per_item, shared = objective.prepare(ctx, placed)
        micro_batches = {
            k: split(x, ctx.layout, mesh, field_specs.get(k) or row_spec(x, rows[0], rows[1]))
            for k, x in per_item.items()
        }
        grad = jax.grad(lambda p, micro: objective.micro_loss(ctx, p, micro, shared), has_aux=True)
        grads, sums = accumulate(
            grad, params, micro_batches, objective.zero_metrics(), objective.combine, shardings.params
        )
        return objective.finish(ctx, grads, sums, placed)

    def step_fn(state: TrainState, batch: dict):
        grads, watched, metrics = grads_of(state.params, batch)
        lr = schedule(state.step + 1)
        hold = objective.hold(metrics)
        params, opt_state, stats = opt.step(grads, state.opt_state, state.params, lr=lr, loss=watched, hold=hold)
        metrics = {
            **metrics,
            "grad_norm": stats.grad_norm,
            "lr": lr,
            "skipped": stats.skipped,
            "tokens": jnp.float32(tokens_per_step),
        }
        return TrainState(state.step + 1, params, opt_state), metrics

    # The batch's in_sharding is left to the constraints above (optional fields may be absent); place
    # batches with `batch_shardings` to avoid a copy.
    replicated = NamedSharding(mesh, PartitionSpec())
    return jax.jit(step_fn, in_shardings=(shardings, None), out_shardings=(shardings, replicated), donate_argnums=0)
