"""Cross-entropy and z-loss with OLMo-core's masking and global-batch normalisation (REFERENCE.md, Loss).

- labels = input_ids shifted left by one; the last position has no label and is ignored (IGNORE).
  Optionally labels equal to the pad token are ignored too (off by default, as in OLMo-core; the
  MaxText stage-2 run masked them). An instance masked by the instance filter has all its labels
  ignored.
- Both terms are SUMS over the non-ignored positions, computed on float32 logits over the padded
  vocabulary: CE = sum(logsumexp(z) - z[label]); z-loss = multiplier * sum(logsumexp(z)^2).
- The caller divides both sums by `loss_denominator` of the WHOLE global batch, so summing
  micro-batch losses gives the global per-token mean whatever the micro-batching.

`chunked_loss_sums` computes the same sums from the final hidden states chunk by chunk along the
sequence, recomputing each chunk's logits in the backward pass, so the full (batch, seq, vocab)
float32 logits and their gradient are never held in memory at once.
"""

from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp

from olmax.config import ModelConfig
from olmax.model.olmo3 import lm_head

IGNORE = -100  # OLMo-core's label_ignore_index


def make_labels(input_ids: jnp.ndarray, *, pad_token_id: Optional[int] = None,
                instance_mask: Optional[jnp.ndarray] = None) -> jnp.ndarray:
    """(batch, seq) int32 labels: input_ids shifted left, IGNORE at the last position, at pad tokens
    when pad_token_id is given, and everywhere in instances where instance_mask (batch,) is False."""
    labels = input_ids.astype(jnp.int32)
    if pad_token_id is not None:
        labels = jnp.where(labels == pad_token_id, IGNORE, labels)
    if instance_mask is not None:
        labels = jnp.where(instance_mask[:, None], labels, IGNORE)
    return jnp.concatenate([labels[:, 1:], jnp.full_like(labels[:, :1], IGNORE)], axis=1)


def loss_denominator(labels: jnp.ndarray, instance_mask: Optional[jnp.ndarray] = None) -> jnp.ndarray:
    """Number of non-ignored labels, as a float32 scalar. Like OLMo-core, an instance masked by the
    instance filter still counts with its full sequence length (its tokens count as zero loss)."""
    count = jnp.sum(labels != IGNORE, dtype=jnp.int32)
    if instance_mask is not None:
        count = count + jnp.sum(~instance_mask, dtype=jnp.int32) * labels.shape[1]
    return count.astype(jnp.float32)


def loss_sums(logits: jnp.ndarray, labels: jnp.ndarray) -> tuple[jnp.ndarray, jnp.ndarray]:
    """(CE sum, sum of logsumexp^2) over the non-ignored positions. logits (..., vocab) are used in
    float32; labels (...) with IGNORE where there is no target."""
    logits = logits.astype(jnp.float32)
    valid = labels != IGNORE
    lse = jax.nn.logsumexp(logits, axis=-1)
    target = jnp.take_along_axis(logits, jnp.where(valid, labels, 0)[..., None], axis=-1)[..., 0]
    ce = jnp.sum(jnp.where(valid, lse - target, 0.0))
    z_sq = jnp.sum(jnp.where(valid, lse * lse, 0.0))
    return ce, z_sq


def chunked_loss_sums(params: dict, hidden: jnp.ndarray, labels: jnp.ndarray, cfg: ModelConfig,
                      chunk: int) -> tuple[jnp.ndarray, jnp.ndarray]:
    """`loss_sums(lm_head(params, hidden, cfg), labels)` computed `chunk` sequence positions at a time.

    hidden (batch, seq, d_model) are the final-normed hidden states. The batch axis stays whole in
    every chunk, so a batch-sharded input needs no communication. Each chunk is rematerialised in the
    backward pass: peak memory holds one (batch, chunk, vocab) block of logits instead of all of them.
    """
    b, t, d = hidden.shape
    if chunk <= 0 or chunk >= t:
        return loss_sums(lm_head(params, hidden, cfg), labels)
    if t % chunk:
        raise ValueError(f"trainer.loss_chunk={chunk} does not divide the sequence length {t}")
    n = t // chunk
    h = hidden.reshape(b, n, chunk, d).swapaxes(0, 1)  # (n, batch, chunk, d)
    y = labels.reshape(b, n, chunk).swapaxes(0, 1)

    @jax.checkpoint
    def one_chunk(carry, xs):
        h_c, y_c = xs
        ce, z_sq = loss_sums(lm_head(params, h_c, cfg), y_c)
        return (carry[0] + ce, carry[1] + z_sq), None

    zero = jnp.zeros((), jnp.float32)
    (ce, z_sq), _ = jax.lax.scan(one_chunk, (zero, zero), (h, y))
    return ce, z_sq
