"""The jitted, sharded training step: `train_step(state, batch) -> (state, metrics)`.

- The mesh and the ONE rules table in olmax.model.sharding decide every layout: parameters and both
  optimizer moments follow `param_specs` (FSDP shards their `embed` dimension, tensor parallelism
  their heads/MLP/vocab), the batch is split over data x fsdp and its sequences over context, the
  step and the skip window are replicated.
- The global batch (trainer.global_batch instances) is fixed by the recipe. Each batch shard (one
  data x fsdp coordinate) holds global_batch / (data * fsdp) instances and runs them as
  per-device / trainer.micro_batch_size micro-batches under jax.lax.scan, summing gradients.
- The loss of every micro-batch is divided by the non-ignored label count of the WHOLE global batch
  (olmax.train.loss), so the summed gradient is the global per-token mean however the batch is split.
  trainer.loss_normalisation=per_rank weighs each row instead by 1 / (loss_ranks x its OLMo-core
  rank's label count) (olmax.train.loss.rank_weights, `loss_rank_of_rows`): OLMo-core's mean of per-rank
  means, again the same however olmax's mesh and micro-batches split the batch.
- trainer.objective=dpo: the global batch counts preference pairs, each a (2, seq) chosen/rejected
  pair of rows (olmax.objectives.dpo.pair_axis_loss); the pair axis is split like the instance axis,
  so every micro-batch holds both sides of its pairs, and its loss is divided by the global pair count.
- trainer.objective=grpo: the global batch counts packed rollout rows (prompt + response sequences,
  open-instruct's pack_sequences), split over devices and micro-batches as instances are; each
  micro-batch's loss is olmax.objectives.grpo.grpo_loss with one device's micro-batch as its token-mean
  group and divided by the accumulation steps (open-instruct's aggregation), so the step's loss is the
  mean over (device, micro-batch) groups of their token means. Metrics combine by
  grpo.METRIC_REDUCTIONS (sums, min, max) through the scan; over devices the jitted arrays are global.
- Step numbering is OLMo-core's: state.step counts completed steps, the step being taken is
  state.step + 1 and the learning rate is schedule(state.step + 1). The step advances when the
  optimizer skips.
"""

from __future__ import annotations

from typing import Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from olmax.config.experiment import ExperimentConfig, check_context
from olmax.config.layout import BatchLayout, split_batch
from olmax.config.remat import AUTO
from olmax.errors import ConfigError
from olmax.model.attention import resolve_backend, segment_ids
from olmax.model.olmo3 import forward_hidden
from olmax.model.sharding import logical_to_spec
from olmax.objectives import dpo, grpo
from olmax.train.loss import loss_denominator, make_labels, output_loss, rank_weights
from olmax.train.schedules import make_schedule
from olmax.train.state import TrainState, optimizer, state_shardings


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


def loss_rank_of_rows(global_batch: int, ranks: int, processes: int) -> np.ndarray:
    """(global_batch,) int32: the OLMo-core data-parallel rank, of `ranks`, that trains each row of the
    step's batch. OLMo-core 3.0.0's `NumpyFSLDataLoader` (olmo_core/data/data_loader.py) gives rank r
    instances r, r + ranks, r + 2 ranks, ... of the global batch; olmax.trainer.run's batch holds each of
    `processes` processes' rows, the global batch's p::processes (olmax.data.loader), in process order."""
    per_process = global_batch // processes
    row = np.arange(global_batch)
    position = (row % per_process) * processes + row // per_process  # the row's place in the global batch
    return (position % ranks).astype(np.int32)


def batch_sharding(cfg: ExperimentConfig, mesh: Mesh) -> NamedSharding:
    """input_ids (global_batch, seq_len): batch axis over data x fsdp, sequence over context."""
    shape = (cfg.trainer.global_batch, cfg.data.seq_len)
    return NamedSharding(mesh, logical_to_spec(("batch", "seq"), shape, mesh))


def check_grpo_batch(cfg: ExperimentConfig, batch: dict) -> None:
    """trainer.objective=grpo's batch: grpo.BATCH_KEYS (+ doc_lens with data.doc_masking, only then), each
    (trainer.global_batch, data.seq_len) and token-aligned; input_ids, response_mask and advantages
    always, sampler_logps with grpo.tis_cap > 0, ref_logps with grpo.beta > 0, old_logps optional (absent:
    the step's own log-probs, detached: one mini-batch per rollout). Else a ValueError naming the key."""
    shape = (cfg.trainer.global_batch, cfg.data.seq_len)
    # doc_lens only with data.doc_masking: without it the rows' sequences would attend to each other unasked
    allowed = {*grpo.BATCH_KEYS, *["doc_lens"] * cfg.data.doc_masking}
    required = ["input_ids", "response_mask", "advantages"]
    required += ["sampler_logps"] * (cfg.grpo.tis_cap > 0) + ["ref_logps"] * (cfg.grpo.beta > 0)
    required += ["doc_lens"] * cfg.data.doc_masking
    for key in batch:
        if key not in allowed:  # a misspelt old_logps would otherwise be silently unused
            raise ValueError(f"trainer.objective=grpo: unknown batch key {key!r} (known: {', '.join(sorted(allowed))})")
    for key in required:
        if batch.get(key) is None:
            raise ValueError(f"trainer.objective=grpo but the batch has no {key!r} (docs/post-training/grpo.md)")
    for key, value in batch.items():
        if value is not None and tuple(value.shape) != shape:
            raise ValueError(
                f"batch[{key!r}] has shape {tuple(value.shape)}, "
                f"expected (trainer.global_batch, data.seq_len) = {shape}"
            )


def make_train_step(
    cfg: ExperimentConfig, mesh: Mesh, *, epoch_batches: Optional[int] = None
) -> Callable[[TrainState, dict], tuple[TrainState, dict]]:
    """The jitted step. batch: {"input_ids": (global_batch, seq_len) int32} and optionally
    {"instance_mask": (global_batch,) bool} (False = instance filtered out: no loss, still counted);
    with data.doc_masking also {"doc_lens": (global_batch, seq_len) int32} (the loader's), from which
    every token's document is found and attention kept within it (olmax.model.attention.segment_ids);
    with data.label_masks also {"label_mask": (global_batch, seq_len) bool}: the loss is taken only on
    the targets it keeps (SFT: the assistant's tokens), and the denominator counts only those.
    With trainer.objective=dpo the batch is instead {"input_ids" (pairs, 2, seq), "response_mask"
    (pairs, 2, seq), "reference_logps" (pairs, 2)} (olmax.objectives.dpo.check_pair_batch); with
    grpo, (global_batch, seq_len) token-aligned rows (`check_grpo_batch`).
    The state argument is donated. Metrics (float32 scalars): loss, ce_loss and z_loss (lm), the
    dpo.METRICS (dpo) or grpo.GRPO_METRICS and response_tokens (grpo: the tokens with a loss),
    grad_norm (before clipping), lr, skipped (1.0 when the optimizer skipped), tokens (input tokens
    this step, padding included).
    `epoch_batches`: the global batches in one epoch of the run's data, which schedule.t_max_epochs needs.
    """
    if cfg.model.remat == AUTO:
        raise ConfigError("model.remat=auto has not been chosen for this mesh: olmax.fit.remat.choose_remat first")
    layout = batch_layout(cfg, mesh)
    model, trainer, data = cfg.model, cfg.trainer, cfg.data
    z_mult = cfg.optimizer.z_loss
    opt = optimizer(cfg)
    tokens_per_step = cfg.rows_per_step * data.seq_len  # input tokens, padding included
    schedule = make_schedule(
        cfg.schedule,
        lr=cfg.optimizer.lr,
        max_steps=trainer.max_steps,
        tokens_per_step=tokens_per_step,
        epoch_batches=epoch_batches,
    )
    shardings = state_shardings(cfg, mesh)
    b_sharding = batch_sharding(cfg, mesh)
    batch_axes = b_sharding.spec[0]
    # Packed instances are padded with the pad id; a target that is padding has no loss (3.0.0's label_mask).
    pad_id = data.pad_token_id if data.mask_pad_token or data.packing == "obfd" else None
    per_rank = trainer.loss_normalisation == "per_rank"
    rows_rank = loss_rank_of_rows(trainer.global_batch, trainer.loss_ranks, jax.process_count()) if per_rank else None

    def micro_loss(params, input_ids, instance_mask, segments, label_mask, row_weights, denominator):
        labels = make_labels(input_ids, pad_token_id=pad_id, instance_mask=instance_mask, label_mask=label_mask)
        hidden = forward_hidden(params, input_ids, model, segments=segments)
        hidden, labels = context_rows(hidden), context_rows(labels)
        if row_weights is not None:  # each of a row's chunks is a row of the loss, with the row's weight
            per_chunk = jnp.broadcast_to(row_weights[:, None], (row_weights.shape[0], context))
            row_weights = context_rows(per_chunk)[:, 0]  # in the order context_rows gives the chunks
        total, (ce, z_sq) = output_loss(
            params, hidden, labels, model, chunk=trainer.loss_chunk, z_loss=z_mult, row_weights=row_weights
        )
        return total / denominator, {"ce_loss": ce / denominator, "z_loss": z_mult * z_sq / denominator}

    def dpo_micro_loss(params, input_ids, response_mask, reference):
        total, sums = dpo.pair_axis_loss(
            params,
            input_ids,
            response_mask,
            reference,
            model,
            loss_type=cfg.dpo.loss_type,
            beta=cfg.dpo.beta,
            chunk=trainer.loss_chunk,
        )
        # as micro_loss divides by the global label count: sums over the micro-batch's pairs / the global pairs
        pairs = trainer.global_batch
        return total / pairs, {"loss": total / pairs, **{k: v / pairs for k, v in sums.items()}}

    rl = cfg.grpo

    def grpo_micro_loss(params, input_ids, response_mask, advantages, segments, old, sampler, ref):
        loss, metrics = grpo.grpo_loss(
            params,
            input_ids,
            response_mask,
            advantages,
            model,
            old_logps=old,
            sampler_logps=sampler,
            ref_logps=ref,
            segments=segments,
            temperature=rl.temperature,
            settings=grpo.LossSettings.of(rl),
            # a micro-batch's rows are every batch shard's micro_batch rows in shard order: each group
            # of micro_batch consecutive rows is one device's micro-batch, open-instruct's token-mean unit
            micro_batch_rows=layout.micro_batch,
            accum_steps=layout.accum_steps,
            chunk=trainer.loss_chunk,
        )
        return loss, {"loss": loss, **metrics}

    seq_axis = b_sharding.spec[1]  # "context" when sequences are split, else None
    context = mesh.shape["context"] if seq_axis else 1

    def context_rows(x):
        """(batch, seq, ...) split over context -> (batch * context, seq / context, ...): each device's
        chunk of a sequence becomes a row of its own, with no data moved, so the output layer and the
        loss (a sum over positions, whatever the rows) run on every device's own chunk. Without a
        context axis, x unchanged.

        The new rows are ordered batch shard, then context shard, then the shard's own rows: the order
        of the devices that hold them, so that the row axis, split over (batch axes, context), gives
        each device the rows it already has. Merged as they lie, a row's chunks would be neighbours, and
        with 2 or more rows per batch shard a device's block of rows would be other devices' chunks:
        XLA's SPMD partitioner moved them by gathering the whole batch of hidden states on every device
        ("involuntary full rematerialization"; 8 GiB of bf16 and 16 of float32 per GPU on the 7B Think
        SFT's 64 H100s, docs/post-training/sft.md)."""
        if context == 1:
            return x
        b, t = x.shape[:2]
        s = layout.batch_shards
        x = x.reshape(s, b // s, context, t // context, *x.shape[2:]).swapaxes(1, 2)
        x = x.reshape(b * context, t // context, *x.shape[4:])
        rows = tuple(a for a in (batch_axes if isinstance(batch_axes, tuple) else (batch_axes,)) if a) + (seq_axis,)
        spec = PartitionSpec(rows, *([None] * (x.ndim - 1)))
        return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, spec))

    def split(x, inner=None):
        """(global_batch, ...) -> (accum_steps, batch_shards * micro_batch, ...): micro-batch k takes
        rows [k*micro, (k+1)*micro) of every shard's local rows, so no data crosses devices; the
        sequence axis stays split over context. `inner`: the specs of the axes after the batch axis
        (default: the sequence's, then none)."""
        s, a, m = layout.batch_shards, layout.accum_steps, layout.micro_batch
        x = x.reshape(s, a, m, *x.shape[1:]).swapaxes(0, 1).reshape(a, s * m, *x.shape[1:])
        if inner is None:
            inner = (*([seq_axis] if x.ndim > 2 else []), *([None] * (x.ndim - 3)))
        return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, PartitionSpec(None, batch_axes, *inner)))

    def accumulate(loss_grad, params, micro_batches, zero_sums, combine=None):
        """Gradients and metric sums over the micro-batches (a scan): the step's, as every micro-batch's
        loss is already divided by its global-batch denominator. `combine`: how two micro-batches'
        metrics make one (default: their sum)."""

        def body(carry, micro):
            grads, sums = carry
            g, aux = loss_grad(params, *micro)
            grads = jax.tree.map(jnp.add, grads, g)
            sums = jax.tree.map(jnp.add, sums, aux) if combine is None else combine(sums, aux)
            return (jax.lax.with_sharding_constraint(grads, shardings.params), sums), None

        zeros = jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), params)
        (grads, sums), _ = jax.lax.scan(body, (zeros, zero_sums), micro_batches)
        return grads, sums

    def lm_grads(params, batch: dict):
        """-> (grads, the loss the skip rule watches, metrics)."""
        input_ids, instance_mask = batch["input_ids"], batch.get("instance_mask")
        if input_ids.shape != (trainer.global_batch, data.seq_len):
            raise ValueError(
                f"batch['input_ids'] has shape {input_ids.shape}, expected "
                f"(trainer.global_batch, data.seq_len) = {(trainer.global_batch, data.seq_len)}"
            )
        input_ids = jax.lax.with_sharding_constraint(input_ids, b_sharding)
        segments = None
        if data.doc_masking:
            if "doc_lens" not in batch:
                raise ValueError("data.doc_masking=true but the batch has no 'doc_lens'")
            doc_lens = jax.lax.with_sharding_constraint(batch["doc_lens"].astype(jnp.int32), b_sharding)
            segments = jax.lax.with_sharding_constraint(segment_ids(doc_lens), b_sharding)
        label_mask = None
        if data.label_masks:
            if "label_mask" not in batch:
                raise ValueError("data.label_masks=true but the batch has no 'label_mask'")
            label_mask = jax.lax.with_sharding_constraint(batch["label_mask"].astype(bool), b_sharding)
        if instance_mask is not None:
            instance_mask = jax.lax.with_sharding_constraint(
                instance_mask, NamedSharding(mesh, PartitionSpec(batch_axes))
            )
        labels = make_labels(input_ids, pad_token_id=pad_id, instance_mask=instance_mask, label_mask=label_mask)
        if per_rank:
            # OLMo-core's z-loss is divided by the same per-rank count (olmo_core/nn/lm_head.py, 3.0.0)
            weights = rank_weights(labels, jnp.asarray(rows_rank), trainer.loss_ranks, instance_mask)
            weights = jax.lax.with_sharding_constraint(weights, NamedSharding(mesh, PartitionSpec(batch_axes)))
            denominator = jnp.float32(1.0)
        else:
            weights, denominator = None, loss_denominator(labels, instance_mask)
        if instance_mask is None:
            instance_mask = jnp.ones((trainer.global_batch,), bool)

        zero = jnp.zeros((), jnp.float32)
        grads, sums = accumulate(
            lambda p, *micro: jax.grad(micro_loss, has_aux=True)(p, *micro, denominator),
            params,
            (
                split(input_ids),
                split(instance_mask),
                None if segments is None else split(segments),
                None if label_mask is None else split(label_mask),
                None if weights is None else split(weights),
            ),
            {"ce_loss": zero, "z_loss": zero},
        )
        return grads, sums["ce_loss"], {"loss": sums["ce_loss"] + sums["z_loss"], **sums}

    def dpo_grads(params, batch: dict):
        """-> (grads, the loss the skip rule watches, metrics): batch of pairs, dpo.check_pair_batch."""
        dpo.check_pair_batch(batch, trainer.global_batch, data.seq_len)
        pair_shardings = dpo.pair_batch_shardings(mesh, batch_axes)
        arrays = [jax.lax.with_sharding_constraint(batch[k], pair_shardings[k]) for k in dpo.BATCH_KEYS]
        input_ids, response_mask, reference = arrays
        zero = jnp.zeros((), jnp.float32)
        grads, sums = accumulate(
            jax.grad(dpo_micro_loss, has_aux=True),
            params,
            (
                split(input_ids.astype(jnp.int32), inner=(None, None)),
                split(response_mask.astype(bool), inner=(None, None)),
                split(reference.astype(jnp.float32), inner=(None,)),
            ),
            {k: zero for k in ("loss", *dpo.METRICS)},
        )
        return grads, sums["loss"], sums

    def grpo_grads(params, batch: dict):
        """-> (grads, the loss the skip rule watches, metrics): packed rollout rows, check_grpo_batch."""
        check_grpo_batch(cfg, batch)

        def rows(key, dtype):  # (global_batch, seq) placed as the LM batch, cast, split into micro-batches
            if batch.get(key) is None:
                return None
            return split(jax.lax.with_sharding_constraint(batch[key].astype(dtype), b_sharding))

        segments = None
        if data.doc_masking:  # attention within each packed prompt + response, as SFT's documents
            doc_lens = jax.lax.with_sharding_constraint(batch["doc_lens"].astype(jnp.int32), b_sharding)
            segments = split(jax.lax.with_sharding_constraint(segment_ids(doc_lens), b_sharding))
        f32 = jnp.float32
        zero = jnp.zeros((), f32)
        grads, sums = accumulate(
            jax.grad(grpo_micro_loss, has_aux=True),
            params,
            (
                rows("input_ids", jnp.int32),
                rows("response_mask", bool),
                rows("advantages", f32),
                segments,
                rows("old_logps", f32),
                rows("sampler_logps", f32),
                rows("ref_logps", f32) if rl.beta > 0 else None,
            ),
            {"loss": zero, **grpo.zero_metrics()},
            combine=lambda a, b: {"loss": a["loss"] + b["loss"], **grpo.combine_metrics(a, b)},
        )
        scored = grpo.response_loss_mask(batch["response_mask"])  # the tokens that have a loss
        # Each device micro-batch's token mean was divided by all of them (batch shards x accumulation
        # steps); open-instruct divides by the micro-batches it has, none empty. The RL loop pads a step
        # with empty rows, so the step counts the micro-batches that hold a scored token and rescales.
        s, a, m = layout.batch_shards, layout.accum_steps, layout.micro_batch
        held = jnp.any(scored.reshape(s, a, m * scored.shape[1]), axis=-1)
        scale = (s * a) / jnp.maximum(jnp.sum(held, dtype=f32), 1.0)
        grads = jax.tree.map(lambda g: g * scale, grads)
        sums = {k: v * scale if k == "loss" or grpo.METRIC_REDUCTIONS[k] == "sum" else v for k, v in sums.items()}
        for k in ("tis/weight_min", "tis/weight_max"):  # +-inf without a scored token: log the neutral weight
            sums[k] = jnp.where(jnp.isfinite(sums[k]), sums[k], 1.0)
        return grads, sums["loss"], {**sums, "response_tokens": jnp.sum(scored, dtype=f32)}

    def step_fn(state: TrainState, batch: dict):
        grads_of = {"dpo": dpo_grads, "grpo": grpo_grads}.get(trainer.objective, lm_grads)
        grads, watched, metrics = grads_of(state.params, batch)
        lr = schedule(state.step + 1)
        # a GRPO batch without a scored token (no rollout group had a reward spread) updates nothing
        hold = metrics["response_tokens"] == 0 if trainer.objective == "grpo" else None
        params, opt_state, stats = opt.step(grads, state.opt_state, state.params, lr=lr, loss=watched, hold=hold)
        metrics = {
            **metrics,
            "grad_norm": stats.grad_norm,
            "lr": lr,
            "skipped": stats.skipped,
            "tokens": jnp.float32(tokens_per_step),
        }
        return TrainState(state.step + 1, params, opt_state), metrics

    # The batch's in_sharding is left to the constraints above (the batch dict may or may not carry
    # an instance_mask); place batches with `batch_sharding` to avoid a copy.
    replicated = NamedSharding(mesh, PartitionSpec())
    return jax.jit(step_fn, in_shardings=(shardings, None), out_shardings=(shardings, replicated), donate_argnums=0)


def make_policy_logps(cfg: ExperimentConfig, mesh: Mesh) -> Callable[[dict, dict], jax.Array]:
    """trainer.objective=grpo: the jitted, sharded log-probs of a batch of packed rows under `params`,
    without gradient: `(params, {"input_ids", "doc_lens" with data.doc_masking}) -> (global_batch,
    seq_len) float32`, placed as the batch (batch_sharding). With grpo.mini_batches > 1 the RL loop runs
    it over each of the rollout's mini-batches before the first update (open-instruct computes the old
    log-probs of the whole rollout so) and hands them to the step as old_logps. The forward is the
    step's (grpo.policy_token_logps: temperature, chunked output layer, segments), one micro-batch per
    batch shard at a time, so it needs no more activation memory than the step's forward."""
    if cfg.trainer.objective != "grpo":
        raise ConfigError(f"make_policy_logps is for trainer.objective=grpo, not {cfg.trainer.objective}")
    layout = batch_layout(cfg, mesh)
    rows = batch_sharding(cfg, mesh)
    s, a, m = layout.batch_shards, layout.accum_steps, layout.micro_batch
    stacked = NamedSharding(mesh, PartitionSpec(None, rows.spec[0], None))

    def split(x):  # as the step splits rows: micro-batch k takes rows [k m, (k + 1) m) of every shard's
        x = x.reshape(s, a, m, -1).swapaxes(0, 1).reshape(a, s * m, -1)
        return jax.lax.with_sharding_constraint(x, stacked)

    def logps(params, batch):
        ids = jax.lax.with_sharding_constraint(batch["input_ids"].astype(jnp.int32), rows)
        segments = None
        if cfg.data.doc_masking:
            segments = segment_ids(jax.lax.with_sharding_constraint(batch["doc_lens"].astype(jnp.int32), rows))
        out = jax.lax.map(
            lambda micro: grpo.policy_token_logps(
                params,
                micro[0],
                cfg.model,
                temperature=cfg.grpo.temperature,
                chunk=cfg.trainer.loss_chunk,
                segments=micro[1],
            ),
            (split(ids), None if segments is None else split(segments)),
        )
        out = out.reshape(a, s, m, -1).swapaxes(0, 1).reshape(ids.shape)  # back to the batch's row order
        return jax.lax.stop_gradient(out)

    return jax.jit(logps, in_shardings=(state_shardings(cfg, mesh).params, None), out_shardings=rows)
