"""Direct preference optimisation: the loss over the model's outputs and its metrics (docs/post-training/dpo.md, "DPO").

The batch holds 2P rows, one sequence per row (prompt then response, right-padded): rows 0..P-1 the
chosen responses, rows P..2P-1 the rejected ones, pair i being rows i and P + i (the row order of
open-instruct's `concatenated_forward` and TRL 1.16.0's `DataCollatorForPreference`), so both sides go
through ONE forward pass. `response_mask` (2P, seq) is one bool per token, True where the token is part
of the response (the tokenizer's label mask). The log-prob of token t + 1 is read at position t, so a
sequence's log-prob is the sum, over its response tokens, of log softmax(logits[t - 1])[token t].

Logits are taken over the real vocabulary (`cfg.vocab_size`, not the padded one): the log-probs of the
HF model open-instruct trained (open-instruct `dpo_utils.py`, commit e6c3044).

Losses, with r = policy log-prob - reference log-prob of a sequence and beta = 5 by default:
- `dpo`: -log sigmoid(beta (r_chosen - r_rejected)), r over summed log-probs (TRL `loss_type="sigmoid"`);
- `dpo_norm`: the same with r divided by the sequence's response tokens, that is over log-probs
  averaged per token (open-instruct `dpo_tune_cache.py`'s `dpo_norm`, AI2's OLMo 3 DPO loss; TRL
  `loss_type="sigmoid_norm"`).
Per pair; the step's loss is their mean over the global batch. Rewards are beta r (without gradient),
r as the loss uses it: averaged log-probs for `dpo_norm`, as open-instruct logs them (TRL 1.16.0 logs
summed ones for both losses). Accuracy counts pairs whose chosen reward is strictly larger.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from olmax.config.dpo import DPO_LOSS_TYPES
from olmax.config.model import ModelConfig
from olmax.model.olmo3 import forward_hidden, lm_head

LOSS_TYPES = DPO_LOSS_TYPES
BETA = 5.0  # open-instruct's DPO beta for OLMo 3
METRICS = ("rewards/chosen", "rewards/rejected", "rewards/margins", "rewards/accuracy")
# The train step's batch (olmax.data.pairs makes it): a pair axis first, so that splitting the batch
# over devices and micro-batches, as the step splits instances, keeps both sides of a pair together.
BATCH_KEYS = ("input_ids", "response_mask", "reference_logps")  # (P, 2, seq), (P, 2, seq), (P, 2)


class SequenceLogps(NamedTuple):
    total: jnp.ndarray  # (rows,) float32: summed log-probs of the response tokens
    count: jnp.ndarray  # (rows,) float32: response tokens that have a log-prob


class PairTerms(NamedTuple):
    losses: jnp.ndarray  # (pairs,) float32
    chosen_rewards: jnp.ndarray  # (pairs,) float32, no gradient
    rejected_rewards: jnp.ndarray  # (pairs,) float32, no gradient


def sequence_logps(
    params: dict,
    hidden: jnp.ndarray,
    input_ids: jnp.ndarray,
    response_mask: jnp.ndarray,
    cfg: ModelConfig,
    *,
    chunk: int,
) -> SequenceLogps:
    """Per-row log-probs of the response tokens from the final-normed hidden states (rows, seq, d_model).

    The output layer runs `chunk` positions at a time (0: the whole sequence) under jax.checkpoint, so a
    backward pass holds one (rows, chunk, vocab) block of logits at a time and recomputes it."""
    rows, t, d = hidden.shape
    chunk = t if chunk <= 0 or chunk >= t else chunk
    if t % chunk:
        raise ValueError(f"trainer.loss_chunk={chunk} does not divide the sequence length {t}")
    # position i predicts token i + 1; the last position predicts nothing
    targets = jnp.concatenate([input_ids[:, 1:], jnp.zeros_like(input_ids[:, :1])], axis=1).astype(jnp.int32)
    weights = response_weights(response_mask)
    head = {"lm_head": params["lm_head"]}

    @jax.checkpoint
    def one_chunk(head, h, y, m):
        logits = lm_head(head, h, cfg)[..., : cfg.vocab_size]
        target = jnp.take_along_axis(logits, y[..., None], axis=-1)[..., 0]
        return jnp.sum(jnp.where(m, target - jax.nn.logsumexp(logits, axis=-1), 0.0), axis=1)

    def by_chunks(x):
        return x.reshape(rows, t // chunk, chunk, *x.shape[2:]).swapaxes(0, 1)

    def step(total, xs):
        return total + one_chunk(head, *xs), None

    zero = jnp.zeros((rows,), jnp.float32)
    total, _ = jax.lax.scan(step, zero, (by_chunks(hidden), by_chunks(targets), by_chunks(weights)))
    return SequenceLogps(total, jnp.sum(weights, axis=1, dtype=jnp.float32))


def response_weights(response_mask: jnp.ndarray) -> jnp.ndarray:
    """(rows, seq) bool: the positions whose log-prob counts, those predicting a response token (position
    i predicts token i + 1, the last predicts nothing); their sum per row is SequenceLogps.count."""
    return jnp.concatenate([response_mask[:, 1:], jnp.zeros_like(response_mask[:, :1])], axis=1).astype(bool)


def policy_logps(
    params: dict, input_ids: jnp.ndarray, response_mask: jnp.ndarray, cfg: ModelConfig, *, chunk: int
) -> SequenceLogps:
    """One forward pass over all rows (chosen and rejected together) -> their response log-probs."""
    return sequence_logps(params, forward_hidden(params, input_ids, cfg), input_ids, response_mask, cfg, chunk=chunk)


def reference_logps(
    params: dict, input_ids: jnp.ndarray, response_mask: jnp.ndarray, cfg: ModelConfig, *, chunk: int
) -> jnp.ndarray:
    """The reference model's summed response log-probs (rows,), without gradient: what the reference
    pass computes once per row and the cache keeps (the token counts follow from the masks)."""
    return jax.lax.stop_gradient(policy_logps(params, input_ids, response_mask, cfg, chunk=chunk).total)


def pair_terms(policy: SequenceLogps, reference: jnp.ndarray, *, loss_type: str, beta: float) -> PairTerms:
    """Per-pair losses and rewards from the policy's log-probs and the reference's summed log-probs
    (rows,), rows ordered chosen then rejected."""
    if loss_type not in LOSS_TYPES:
        raise ValueError(f"unknown DPO loss {loss_type!r}; expected one of {', '.join(LOSS_TYPES)}")
    rows = policy.total.shape[0]
    if rows % 2:
        raise ValueError(f"a DPO batch holds chosen and rejected rows, so an even number; got {rows}")
    ratio = policy.total - reference
    if loss_type == "dpo_norm":
        ratio = ratio / jnp.maximum(policy.count, 1.0)  # both averaged over the same response tokens
    chosen, rejected = ratio[: rows // 2], ratio[rows // 2 :]
    losses = -jax.nn.log_sigmoid(beta * (chosen - rejected))
    return PairTerms(losses, beta * jax.lax.stop_gradient(chosen), beta * jax.lax.stop_gradient(rejected))


def metric_sums(terms: PairTerms) -> dict[str, jnp.ndarray]:
    """METRICS summed over the pairs; divided by the global batch's pair count they are the step's means."""
    chosen, rejected = terms.chosen_rewards, terms.rejected_rewards
    return {
        "rewards/chosen": jnp.sum(chosen),
        "rewards/rejected": jnp.sum(rejected),
        "rewards/margins": jnp.sum(chosen - rejected),
        "rewards/accuracy": jnp.sum((chosen > rejected).astype(jnp.float32)),
    }


def dpo_loss(
    params: dict,
    input_ids: jnp.ndarray,
    response_mask: jnp.ndarray,
    reference: jnp.ndarray,
    cfg: ModelConfig,
    *,
    loss_type: str,
    beta: float = BETA,
    chunk: int = 0,
) -> tuple[jnp.ndarray, dict[str, jnp.ndarray]]:
    """(sum of the per-pair losses, metric sums) of one (micro-)batch: divide both by the global batch's
    pair count, as olmax.train.loss divides by the global token count, to get the mean over pairs whatever the
    micro-batching. `reference` (rows,) is the reference's summed log-probs (`reference_logps`)."""
    terms = pair_terms(
        policy_logps(params, input_ids, response_mask, cfg, chunk=chunk), reference, loss_type=loss_type, beta=beta
    )
    return jnp.sum(terms.losses), metric_sums(terms)


def pair_axis_loss(
    params: dict,
    input_ids: jnp.ndarray,
    response_mask: jnp.ndarray,
    reference: jnp.ndarray,
    cfg: ModelConfig,
    *,
    loss_type: str,
    beta: float = BETA,
    chunk: int = 0,
) -> tuple[jnp.ndarray, dict[str, jnp.ndarray]]:
    """`dpo_loss` of a batch with a pair axis: input_ids and response_mask (P, 2, seq), reference (P, 2),
    [:, 0] chosen and [:, 1] rejected. The forward runs on the 2P rows pair by pair (merging the pair
    axis, which the step shards, with the side axis moves no data); only the (2P,) log-probs are
    reordered into dpo_loss's chosen-block-then-rejected-block rows."""
    p, _, t = input_ids.shape
    logps = policy_logps(params, input_ids.reshape(2 * p, t), response_mask.reshape(2 * p, t), cfg, chunk=chunk)

    def blocks(x):  # (2P,) pair by pair -> chosen rows 0..P-1, rejected rows P..2P-1
        return x.reshape(p, 2).T.reshape(2 * p)

    policy = SequenceLogps(blocks(logps.total), blocks(logps.count))
    terms = pair_terms(policy, blocks(reference.reshape(2 * p)), loss_type=loss_type, beta=beta)
    return jnp.sum(terms.losses), metric_sums(terms)


def check_pair_batch(batch: dict, pairs: int, seq_len: int) -> None:
    """The step's DPO batch has BATCH_KEYS at (pairs, 2, seq_len) / (pairs, 2); else a ValueError naming them."""
    shapes = {"input_ids": (pairs, 2, seq_len), "response_mask": (pairs, 2, seq_len), "reference_logps": (pairs, 2)}
    for key, shape in shapes.items():
        if key not in batch:
            raise ValueError(f"trainer.objective=dpo but the batch has no {key!r}")
        if tuple(batch[key].shape) != shape:
            raise ValueError(
                f"batch[{key!r}] has shape {tuple(batch[key].shape)}, expected {shape} "
                "(trainer.global_batch pairs, chosen and rejected, data.seq_len)"
            )


def pair_batch_shardings(mesh: Mesh, batch_axes) -> dict[str, NamedSharding]:
    """BATCH_KEYS' shardings: the pair axis over `batch_axes` (the step's, data x fsdp), the rest whole."""
    return {
        "input_ids": NamedSharding(mesh, PartitionSpec(batch_axes, None, None)),
        "response_mask": NamedSharding(mesh, PartitionSpec(batch_axes, None, None)),
        "reference_logps": NamedSharding(mesh, PartitionSpec(batch_axes, None)),
    }
