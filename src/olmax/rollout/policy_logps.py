"""The RL loop's own forward: the log-probs of a rollout's packed rows under the current (old) or the
reference parameters, without gradient, as the train step would compute them (olmax.objectives.logps:
temperature, chunked output layer, segments), one micro-batch per batch shard at a time
(olmax.step.micro_batches), so it needs no more activation memory than the step's forward."""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, PartitionSpec

from olmax.config.experiment import ExperimentConfig
from olmax.config.objective import data_kind
from olmax.errors import ConfigError
from olmax.model.attention import segment_ids
from olmax.objectives.logps import policy_token_logps
from olmax.step.micro_batches import merge, split
from olmax.step.state import state_shardings
from olmax.step.train_step import batch_layout, batch_sharding


def make_policy_logps(cfg: ExperimentConfig, mesh: Mesh) -> Callable[[dict, dict], jax.Array]:
    """An objective on rollouts (grpo): the jitted, sharded log-probs of a batch of packed rows under
    `params`: `(params, {"input_ids", "doc_lens" with data.doc_masking}) -> (global_batch, seq_len)
    float32`, placed as the batch (batch_sharding). With grpo.mini_batches > 1 the RL loop runs it over
    each of the rollout's mini-batches before the first update (open-instruct computes the old log-probs
    of the whole rollout so) and hands them to the step as old_logps; with grpo.beta > 0, under the
    reference parameters, as ref_logps."""
    if data_kind(cfg.objective_config) != "rollouts":
        raise ConfigError(f"make_policy_logps is for trainer.objective=grpo, not {cfg.trainer.objective}")
    layout = batch_layout(cfg, mesh)
    rows = batch_sharding(cfg, mesh)
    stacked = PartitionSpec(rows.spec[0], None)

    def logps(params, batch):
        ids = jax.lax.with_sharding_constraint(batch["input_ids"].astype(jnp.int32), rows)
        segments = None
        if cfg.data.doc_masking:
            segments = segment_ids(jax.lax.with_sharding_constraint(batch["doc_lens"].astype(jnp.int32), rows))
        out = jax.lax.map(
            lambda micro: policy_token_logps(
                params,
                micro[0],
                cfg.model,
                temperature=cfg.grpo.temperature,
                chunk=cfg.trainer.loss_chunk,
                segments=micro[1],
            ),
            (split(ids, layout, mesh, stacked), None if segments is None else split(segments, layout, mesh, stacked)),
        )
        return jax.lax.stop_gradient(merge(out, layout))  # back to the batch's row order

    return jax.jit(logps, in_shardings=(state_shardings(cfg, mesh).params, None), out_shardings=rows)
