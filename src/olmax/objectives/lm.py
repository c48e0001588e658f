"""Next-token cross-entropy, the pre-training and SFT objective (trainer.objective=lm): OLMo-core's loss
(olmax.objectives.cross_entropy) as the one train step runs it.

- The loss of every micro-batch is divided by the non-ignored label count of the WHOLE global batch, so
  the summed gradient is the global per-token mean however the batch is split.
  trainer.loss_normalisation=per_rank weighs each row instead by 1 / (loss_ranks x its OLMo-core rank's
  label count) (cross_entropy.rank_weights, `loss_rank_of_rows`): OLMo-core's mean of per-rank means,
  again the same however olmax's mesh and micro-batches split the batch.
- With a context axis each device's chunk of a sequence is a row of its own for the output layer and
  the loss (`context_rows`).
"""

from __future__ import annotations

from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from olmax.model.attention import segment_ids
from olmax.model.olmo3 import forward_hidden
from olmax.model.sharding import logical_to_spec
from olmax.objectives.base import BatchField, Objective, StepContext
from olmax.objectives.cross_entropy import loss_denominator, make_labels, output_loss, rank_weights


def loss_rank_of_rows(global_batch: int, ranks: int, processes: int) -> np.ndarray:
    """(global_batch,) int32: the OLMo-core data-parallel rank, of `ranks`, that trains each row of the
    step's batch. OLMo-core 3.0.0's `NumpyFSLDataLoader` (olmo_core/data/data_loader.py) gives rank r
    instances r, r + ranks, r + 2 ranks, ... of the global batch; olmax.trainer.run's batch holds each of
    `processes` processes' rows, the global batch's p::processes (olmax.data.loader), in process order."""
    per_process = global_batch // processes
    row = np.arange(global_batch)
    position = (row % per_process) * processes + row // per_process  # the row's place in the global batch
    return (position % ranks).astype(np.int32)


def context_rows(x: jax.Array, ctx: StepContext) -> jax.Array:
    """(batch, seq, ...) split over context -> (batch * context, seq / context, ...): each device's chunk
    of a sequence becomes a row of its own, with no data moved, so the output layer and the loss (a sum
    over positions, whatever the rows) run on every device's own chunk. Without a context axis, x
    unchanged.

    The new rows are ordered batch shard, then context shard, then the shard's own rows: the order of the
    devices that hold them, so that the row axis, split over (batch axes, context), gives each device the
    rows it already has. Merged as they lie, a row's chunks would be neighbours, and with 2 or more rows
    per batch shard a device's block of rows would be other devices' chunks: XLA's SPMD partitioner moved
    them by gathering the whole batch of hidden states on every device ("involuntary full
    rematerialization"; 8 GiB of bf16 and 16 of float32 per GPU on the 7B Think SFT's 64 H100s,
    docs/post-training/sft.md)."""
    mesh, cfg = ctx.mesh, ctx.cfg
    batch_axes, seq_axis = logical_to_spec(("batch", "seq"), (cfg.trainer.global_batch, cfg.data.seq_len), mesh)
    context = mesh.shape["context"] if seq_axis else 1
    if context == 1:
        return x
    b, t = x.shape[:2]
    s = ctx.layout.batch_shards
    x = x.reshape(s, b // s, context, t // context, *x.shape[2:]).swapaxes(1, 2)
    x = x.reshape(b * context, t // context, *x.shape[4:])
    rows = tuple(a for a in (batch_axes if isinstance(batch_axes, tuple) else (batch_axes,)) if a) + (seq_axis,)
    return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, PartitionSpec(rows, *([None] * (x.ndim - 1)))))


class _Shared(NamedTuple):
    denominator: jax.Array  # the global batch's loss tokens (1 with per-rank weights)


class LM(Objective):
    """trainer.objective=lm. The batch: input_ids (global_batch, seq_len); instance_mask (global_batch,)
    with the repetition filter (False = filtered out: no loss, still counted); doc_lens with
    data.doc_masking (attention kept within each document, olmax.model.attention.segment_ids); label_mask
    with data.label_masks (SFT: the loss only on the targets it keeps, and the denominator counts only
    those)."""

    name = "lm"
    metric_names = {"ce_loss": "train/CE loss", "z_loss": "train/Z loss"}  # OLMo-core's W&B names
    unlogged_metrics = ("loss",)  # CE + Z, for the step's callers: the writers log its two parts
    loss_metric = "ce_loss"

    def fields(self, cfg) -> dict[str, BatchField]:
        data, shape = cfg.data, (cfg.trainer.global_batch, cfg.data.seq_len)
        fields = {
            "input_ids": BatchField(shape, "int32", ("batch", "seq")),
            "instance_mask": BatchField(shape[:1], "bool", ("batch",), False, data.instance_filter),
        }
        if data.doc_masking:
            fields["doc_lens"] = BatchField(shape, "int32", ("batch", "seq"))
        if data.label_masks:
            fields["label_mask"] = BatchField(shape, "bool", ("batch", "seq"))
        return fields

    def check_batch(self, cfg, batch: dict) -> None:
        expected = (cfg.trainer.global_batch, cfg.data.seq_len)
        if tuple(batch["input_ids"].shape) != expected:
            raise ValueError(
                f"batch['input_ids'] has shape {tuple(batch['input_ids'].shape)}, expected "
                f"(trainer.global_batch, data.seq_len) = {expected}"
            )
        if cfg.data.doc_masking and "doc_lens" not in batch:
            raise ValueError("data.doc_masking=true but the batch has no 'doc_lens'")
        if cfg.data.label_masks and "label_mask" not in batch:
            raise ValueError("data.label_masks=true but the batch has no 'label_mask'")

    def prepare(self, ctx: StepContext, batch: dict) -> tuple[dict, Any]:
        trainer, data = ctx.cfg.trainer, ctx.cfg.data
        rows = {"input_ids": batch["input_ids"].astype(jnp.int32), "instance_mask": batch.get("instance_mask")}
        if "doc_lens" in batch:
            rows["segments"] = segment_ids(batch["doc_lens"].astype(jnp.int32))
        if "label_mask" in batch:
            rows["label_mask"] = batch["label_mask"].astype(bool)
        labels = make_labels(
            rows["input_ids"],
            pad_token_id=_pad_id(data),
            instance_mask=rows["instance_mask"],
            label_mask=rows.get("label_mask"),
        )
        if trainer.loss_normalisation == "per_rank":
            # OLMo-core's z-loss is divided by the same per-rank count (olmo_core/nn/lm_head.py, 3.0.0)
            ranks = loss_rank_of_rows(trainer.global_batch, trainer.loss_ranks, jax.process_count())
            rows["row_weights"] = rank_weights(labels, jnp.asarray(ranks), trainer.loss_ranks, rows["instance_mask"])
            denominator = jnp.float32(1.0)
        else:
            denominator = loss_denominator(labels, rows["instance_mask"])
        if rows["instance_mask"] is None:
            rows["instance_mask"] = jnp.ones((trainer.global_batch,), bool)
        return rows, _Shared(denominator)

    def micro_metrics(self) -> tuple[str, ...]:
        return ("ce_loss", "z_loss")

    def micro_loss(self, ctx: StepContext, params: dict, micro: dict, shared: _Shared):
        cfg = ctx.cfg
        z_mult = cfg.optimizer.z_loss
        labels = make_labels(
            micro["input_ids"],
            pad_token_id=_pad_id(cfg.data),
            instance_mask=micro["instance_mask"],
            label_mask=micro.get("label_mask"),
        )
        hidden = forward_hidden(params, micro["input_ids"], cfg.model, segments=micro.get("segments"))
        hidden, labels = context_rows(hidden, ctx), context_rows(labels, ctx)
        row_weights = micro.get("row_weights")
        if row_weights is not None:  # each of a row's chunks is a row of the loss, with the row's weight
            context = labels.shape[0] // row_weights.shape[0]
            per_chunk = jnp.broadcast_to(row_weights[:, None], (row_weights.shape[0], context))
            row_weights = context_rows(per_chunk, ctx)[:, 0]  # in the order context_rows gives the chunks
        total, (ce, z_sq) = output_loss(
            params, hidden, labels, cfg.model, chunk=cfg.trainer.loss_chunk, z_loss=z_mult, row_weights=row_weights
        )
        d = shared.denominator
        return total / d, {"ce_loss": ce / d, "z_loss": z_mult * z_sq / d}

    def finish(self, ctx: StepContext, grads: dict, sums: dict, batch: dict):
        return grads, sums["ce_loss"], {"loss": sums["ce_loss"] + sums["z_loss"], **sums}


def _pad_id(data) -> Optional[int]:
    """Packed instances are padded with the pad id; a target that is padding has no loss (3.0.0's label_mask)."""
    return data.pad_token_id if data.mask_pad_token or data.packing == "obfd" else None
