"""Cross-entropy and z-loss with OLMo-core's masking and global-batch normalisation (docs/reference.md, "Loss").

- labels = input_ids shifted left by one; the last position has no label and is ignored (IGNORE).
  Optionally labels equal to the pad token are ignored too (off by default, as in OLMo-core; the
  MaxText stage-2 run masked them). An instance masked by the instance filter has all its labels
  ignored. With a label mask (SFT: data.label_masks) the label at a position whose token the mask
  leaves out is ignored, before the shift, as OLMo-core's `get_labels` (olmo_core/data/utils.py, 3.0.0).
- Both terms are SUMS over the non-ignored positions, computed on float32 logits over the padded
  vocabulary: CE = sum(logsumexp(z) - z[label]); z-loss = multiplier * sum(logsumexp(z)^2).
- The caller divides both sums by `loss_denominator` of the WHOLE global batch, so summing
  micro-batch losses gives the global per-token mean whatever the micro-batching. With
  trainer.loss_normalisation=per_rank the sums weigh each row instead (`rank_weights`): OLMo-core's
  per-rank means, averaged over its data-parallel ranks.

`output_loss` computes the same sums from the final hidden states chunk by chunk along the
sequence, with the gradient of each chunk's logits formed in the same pass (a custom VJP), so the
full (batch, seq, vocab) float32 logits and their gradient are never held in memory at once and
nothing over the vocabulary is recomputed (docs/performance/cpu.md has the measurements).
"""

from __future__ import annotations

import functools
from typing import Optional

import jax
import jax.numpy as jnp

from olmax.config.model import ModelConfig

IGNORE = -100  # OLMo-core's label_ignore_index


def make_labels(
    input_ids: jnp.ndarray,
    *,
    pad_token_id: Optional[int] = None,
    instance_mask: Optional[jnp.ndarray] = None,
    label_mask: Optional[jnp.ndarray] = None,
) -> jnp.ndarray:
    """(batch, seq) int32 labels: input_ids shifted left, IGNORE at the last position, at pad tokens
    when pad_token_id is given, at tokens where label_mask (batch, seq) is False, and everywhere in
    instances where instance_mask (batch,) is False."""
    labels = input_ids.astype(jnp.int32)
    if label_mask is not None:
        labels = jnp.where(label_mask, labels, IGNORE)
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


def rank_weights(
    labels: jnp.ndarray, rank_of_row: jnp.ndarray, ranks: int, instance_mask: Optional[jnp.ndarray] = None
) -> jnp.ndarray:
    """(batch,) float32: 1 / (ranks x n_r) for each row of rank r, n_r being `loss_denominator` of
    rank r's rows. Weighting every row's sums so is OLMo-core 3.0.0's normalisation
    (`TransformerTrainModule.train_batch`, olmo_core/train/train_module/transformer/train_module.py):
    each data-parallel rank divides its sums by its own count, over all its micro-batches, and the
    gradient all-reduce averages the ranks. `rank_of_row` (batch,) int32 in [0, ranks). A rank with no
    loss token weighs 0 (OLMo-core would divide 0 by 0)."""
    count = jnp.sum(labels != IGNORE, axis=1, dtype=jnp.int32)
    if instance_mask is not None:  # a filtered instance counts whole, as in loss_denominator
        count = count + (~instance_mask).astype(jnp.int32) * labels.shape[1]
    per_rank = jax.ops.segment_sum(count, rank_of_row, num_segments=ranks)
    return (1.0 / (ranks * jnp.maximum(per_rank, 1).astype(jnp.float32)))[rank_of_row]


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


def output_loss(
    params: dict,
    hidden: jnp.ndarray,
    labels: jnp.ndarray,
    cfg: ModelConfig,
    *,
    chunk: int,
    z_loss: float,
    row_weights: Optional[jnp.ndarray] = None,
) -> tuple[jnp.ndarray, tuple[jnp.ndarray, jnp.ndarray]]:
    """The output layer and the loss in one pass: `(ce_sum + z_loss * z_sq, (ce_sum, z_sq))`, equal to
    `loss_sums(lm_head(params, hidden, cfg), labels)` combined, computed `chunk` positions at a time.
    `row_weights` (batch,): each row's positions count that many times in both sums (`rank_weights`);
    None = once.

    hidden (batch, seq, d_model) are the final-normed hidden states; the gradient of the first value
    flows to them and to params["lm_head"]; the two sums are returned for logging, without gradient.

    Each chunk's logits exist once, in the forward pass, which also computes their gradient
    (softmax - onehot + 2 z_loss lse softmax) and multiplies it into the gradients of the hidden
    states and the LM head right away; the backward pass only scales those by the incoming
    cotangent. Autodiff with a rematerialised chunk would run the (tokens x d_model x vocab) matmul
    and the exponentials over the vocabulary twice; this runs 3 such matmuls instead of 4 and one
    exponential pass, and holds one (batch, chunk, vocab) block of logits at a time. The batch axis
    stays whole in every chunk, so a batch-sharded input needs no communication.
    """
    b, t, _ = hidden.shape
    chunk = t if chunk <= 0 or chunk >= t else chunk
    if t % chunk:
        raise ValueError(f"trainer.loss_chunk={chunk} does not divide the sequence length {t}")
    weights = jnp.ones((b,), jnp.float32) if row_weights is None else row_weights.astype(jnp.float32)
    total, ce, z_sq = _fused_output_loss(
        hidden, params["lm_head"], labels, weights, cfg.compute_dtype, chunk, float(z_loss)
    )
    return total, (jax.lax.stop_gradient(ce), jax.lax.stop_gradient(z_sq))


def _chunk(h, w, y, rw, z_loss: float, with_grads: bool):
    """One chunk: h (batch, chunk, d) and w (d, vocab) in compute dtype, labels y (batch, chunk), row
    weights rw (batch,). -> (CE sum, sum of lse^2), each position weighted by its row's weight, and
    with_grads also d(CE + z_loss lse^2)/dh in h's dtype and /dw in float32. A weight of 1 multiplies
    exactly, so unweighted sums are bit for bit those without weights."""
    logits = jnp.einsum("btd,dv->btv", h, w, preferred_element_type=jnp.float32)
    valid = (y != IGNORE)[..., None]
    rw = rw[:, None, None]
    # logsumexp by hand, so the exponentials are computed once and reused for the softmax below
    top = jnp.max(logits, axis=-1, keepdims=True)
    e = jnp.exp(logits - top)
    s = jnp.sum(e, axis=-1, keepdims=True)
    lse = top + jnp.log(s)
    target = jnp.take_along_axis(logits, jnp.where(valid[..., 0], y, 0)[..., None], axis=-1)
    sums = (jnp.sum(jnp.where(valid, rw * (lse - target), 0.0)), jnp.sum(jnp.where(valid, rw * (lse * lse), 0.0)))
    if not with_grads:
        return sums
    # d/dlogits of (lse - logits[y]) + z_loss lse^2 = softmax (1 + 2 z_loss lse) - onehot(y), times the weight
    scale = jnp.where(valid, rw * (1.0 + 2.0 * z_loss * lse) / s, 0.0)
    onehot = jnp.logical_and(jnp.arange(logits.shape[-1], dtype=jnp.int32) == y[..., None], valid)
    d_logits = (e * scale - jnp.where(onehot, rw, 0.0)).astype(h.dtype)
    d_h = jnp.einsum("btv,dv->btd", d_logits, w, preferred_element_type=jnp.float32).astype(h.dtype)
    d_w = jnp.einsum("btd,btv->dv", h, d_logits, preferred_element_type=jnp.float32)
    return sums, d_h, d_w


def _chunks(hidden, labels, compute_dtype: str, chunk: int):
    """(n_chunks, batch, chunk, d) hidden states in compute dtype and (n_chunks, batch, chunk) labels."""
    b, t, d = hidden.shape
    h = hidden.astype(jnp.dtype(compute_dtype)).reshape(b, t // chunk, chunk, d).swapaxes(0, 1)
    return h, labels.reshape(b, t // chunk, chunk).swapaxes(0, 1)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6))
def _fused_output_loss(hidden, w, labels, rw, compute_dtype: str, chunk: int, z_loss: float):
    """(CE sum + z_loss * z_sq, CE sum, z_sq), rows weighted by rw; without differentiation, no
    gradient work is done."""
    w_c = w.astype(jnp.dtype(compute_dtype))

    def one_chunk(carry, xs):
        ce, z_sq = _chunk(xs[0], w_c, xs[1], rw, z_loss, with_grads=False)
        return (carry[0] + ce, carry[1] + z_sq), None

    zero = jnp.zeros((), jnp.float32)
    (ce, z_sq), _ = jax.lax.scan(one_chunk, (zero, zero), _chunks(hidden, labels, compute_dtype, chunk))
    return ce + z_loss * z_sq, ce, z_sq


def _fused_forward(hidden, w, labels, rw, compute_dtype, chunk, z_loss):
    b, t, d = hidden.shape
    w_c = w.astype(jnp.dtype(compute_dtype))

    def one_chunk(carry, xs):
        ce, z_sq, d_w = carry
        (ce_c, z_c), d_h, d_w_c = _chunk(xs[0], w_c, xs[1], rw, z_loss, with_grads=True)
        return (ce + ce_c, z_sq + z_c, d_w + d_w_c), d_h

    zero = jnp.zeros((), jnp.float32)
    init = (zero, zero, jnp.zeros(w.shape, jnp.float32))
    (ce, z_sq, d_w), d_h = jax.lax.scan(one_chunk, init, _chunks(hidden, labels, compute_dtype, chunk))
    d_h = d_h.swapaxes(0, 1).reshape(b, t, d).astype(hidden.dtype)
    return (ce + z_loss * z_sq, ce, z_sq), (d_h, d_w.astype(w.dtype))


def _fused_bwd(compute_dtype, chunk, z_loss, residuals, cotangents):
    d_h, d_w = residuals
    g = cotangents[0]  # the two sums carry no gradient: output_loss stops it; nor do the row weights
    return (g * d_h).astype(d_h.dtype), (g * d_w).astype(d_w.dtype), None, None


_fused_output_loss.defvjp(_fused_forward, _fused_bwd)
