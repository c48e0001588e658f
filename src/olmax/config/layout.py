"""What a config becomes on a mesh of devices, in plain Python (no jax): the global batch split over
the batch shards into per-device rows and accumulated micro-batches. The train step (olmax.step.train_step)
and the launcher (olmax.launch.plan, which lays a recipe out for N devices before anything is
submitted) both take it from here, so they cannot disagree."""

from __future__ import annotations

import functools
import logging
from typing import Mapping, NamedTuple

from olmax.config.experiment import ExperimentConfig, check_context
from olmax.errors import ConfigError

log = logging.getLogger(__name__)


class BatchLayout(NamedTuple):
    batch_shards: int  # data x fsdp devices the global batch is split over
    per_device: int  # instances per batch shard per step
    micro_batch: int  # instances per batch shard per forward/backward
    accum_steps: int  # micro-batches per step


def split_batch(cfg: ExperimentConfig, shape: Mapping[str, int]) -> BatchLayout:
    """Per-device batch and accumulation steps from the global batch and the mesh's axis sizes (`shape`:
    {"data", "fsdp", "context", "tensor"}), errors naming the knob; with a context axis, also what it
    needs of the sequence (check_context)."""
    context = shape.get("context", 1)
    if context > 1:
        check_context(cfg, context)
    shards = shape["data"] * shape["fsdp"]
    gb = cfg.trainer.global_batch
    if gb % shards:
        raise ConfigError(
            f"trainer.global_batch={gb} is not divisible by the data x fsdp devices "
            f"({shape['data']} x {shape['fsdp']} = {shards})"
        )
    per_device = gb // shards
    asked = cfg.trainer.micro_batch_size
    if asked is not None and asked > per_device:  # a recipe's micro-batch on more devices than it was set for
        _warn_clamped(asked, per_device, gb, shards)
    micro = min(asked or per_device, per_device)
    if per_device % micro:
        raise ConfigError(
            f"trainer.micro_batch_size={micro} does not divide the per-device batch of "
            f"{per_device} (trainer.global_batch={gb} over {shards} batch shards)"
        )
    return BatchLayout(shards, per_device, micro, per_device // micro)


@functools.cache  # once a process: the layout is asked for by the fit, the trainer and the reference pass
def _warn_clamped(asked: int, per_device: int, global_batch: int, shards: int) -> None:
    log.warning(
        "trainer.micro_batch_size=%d is more than the per-device batch of %d items (trainer.global_batch=%d "
        "over %d batch shards): each device runs its %d at once, with no accumulation",
        *(asked, per_device, global_batch, shards, per_device),
    )
