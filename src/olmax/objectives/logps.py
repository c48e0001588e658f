"""Log-probabilities of tokens under the model, the one code the objectives on sequences share: DPO's
response log-probs and its reference pass (olmax.objectives.dpo, olmax.trainer.reference), GRPO's
per-token log-probs and the RL loop's old log-probs (olmax.objectives.grpo, olmax.step.policy_logps).

Every array is TOKEN-aligned: entry [b, t] belongs to token input_ids[b, t], whose log-prob is read
from the logits at position t - 1; column 0 has none (0). Logits are taken over the real vocabulary
(`cfg.vocab_size`, not the padded one): the log-probs of the HF model AI2 trained (open-instruct
`dpo_utils.py` and `grpo_fast.py` slice them so too).

The output layer runs `chunk` positions at a time (0: the whole sequence) under jax.checkpoint, so a
backward pass holds one (rows, chunk, vocab) block of logits at a time and recomputes it.

Rows that only feed a statistic (KTO's KL estimate from mismatched completions, which TRL 1.16's
KTOTrainer computes under torch.no_grad) take `statistic_logps`: a forward of their own whose result
is stopped, so the step's gradient never reaches it and XLA builds no backward pass for those rows.
Run together with the trained rows in one forward, they would go through the backward pass.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp

from olmax.config.model import ModelConfig
from olmax.model.olmo3 import forward_hidden, lm_head

# open-instruct divides the training logits by temperature + 1e-7 (grpo_fast.py `forward`); kept so the
# log-probs are its.
TEMPERATURE_EPS = 1e-7


class SequenceLogps(NamedTuple):
    total: jnp.ndarray  # (rows,) float32: summed log-probs of the response tokens
    count: jnp.ndarray  # (rows,) float32: response tokens that have a log-prob


def token_logps(
    params: dict,
    hidden: jnp.ndarray,
    input_ids: jnp.ndarray,
    cfg: ModelConfig,
    *,
    chunk: int = 0,
    temperature: Optional[float] = None,
) -> jnp.ndarray:
    """(rows, seq) float32 log-prob of every token given the ones before it, from the final-normed
    hidden states (rows, seq, d_model): [b, t] = log softmax(logits[b, t - 1] / (temperature + 1e-7))
    [input_ids[b, t]]; the raw logits when `temperature` is None; column 0 is 0."""
    rows, t, _ = hidden.shape
    chunk = t if chunk <= 0 or chunk >= t else chunk
    if t % chunk:
        raise ValueError(f"trainer.loss_chunk={chunk} does not divide the sequence length {t}")
    # position i predicts token i + 1; the last position predicts nothing
    targets = jnp.concatenate([input_ids[:, 1:], jnp.zeros_like(input_ids[:, :1])], axis=1).astype(jnp.int32)
    head = {"lm_head": params["lm_head"]}
    scale = None if temperature is None else 1.0 / (temperature + TEMPERATURE_EPS)

    @jax.checkpoint
    def one_chunk(head, h, y):
        logits = lm_head(head, h, cfg)[..., : cfg.vocab_size]
        if scale is not None:
            logits = logits * scale
        target = jnp.take_along_axis(logits, y[..., None], axis=-1)[..., 0]
        return target - jax.nn.logsumexp(logits, axis=-1)

    def by_chunks(x):
        return x.reshape(rows, t // chunk, chunk, *x.shape[2:]).swapaxes(0, 1)

    _, out = jax.lax.scan(lambda c, xs: (c, one_chunk(head, *xs)), None, (by_chunks(hidden), by_chunks(targets)))
    predicted = out.swapaxes(0, 1).reshape(rows, t)  # [b, i]: log-prob of token i + 1
    return jnp.concatenate([jnp.zeros((rows, 1), jnp.float32), predicted[:, :-1]], axis=1)


def policy_token_logps(
    params: dict,
    input_ids: jnp.ndarray,
    cfg: ModelConfig,
    *,
    chunk: int = 0,
    temperature: Optional[float] = None,
    segments: Optional[jnp.ndarray] = None,
) -> jnp.ndarray:
    """One forward pass -> `token_logps`. segments: packed rows' sequence index per token
    (forward_hidden's), so attention stays within each sequence."""
    hidden = forward_hidden(params, input_ids, cfg, segments=segments)
    return token_logps(params, hidden, input_ids, cfg, chunk=chunk, temperature=temperature)


def scored_tokens(response_mask: jnp.ndarray) -> jnp.ndarray:
    """Token-aligned response mask -> the tokens that have a log-prob to score: column 0 has no prediction."""
    mask = jnp.asarray(response_mask, bool)  # a numpy mask too (the RL loop's, a test's)
    return mask.at[:, 0].set(False)


def sequence_logps(logps: jnp.ndarray, response_mask: jnp.ndarray) -> SequenceLogps:
    """Per-row sums of the response tokens' log-probs (rows, seq) -> SequenceLogps."""
    scored = scored_tokens(response_mask)
    total = jnp.sum(jnp.where(scored, logps, 0.0), axis=1)
    return SequenceLogps(total, jnp.sum(scored, axis=1, dtype=jnp.float32))


def response_logps(
    params: dict, input_ids: jnp.ndarray, response_mask: jnp.ndarray, cfg: ModelConfig, *, chunk: int
) -> SequenceLogps:
    """One forward pass over whole sequences (one prompt + response a row) -> their response log-probs."""
    return sequence_logps(policy_token_logps(params, input_ids, cfg, chunk=chunk), response_mask)


def statistic_logps(
    params: dict, input_ids: jnp.ndarray, response_mask: jnp.ndarray, cfg: ModelConfig, *, chunk: int
) -> SequenceLogps:
    """`response_logps` of rows that only feed a statistic: their own forward, its result under
    stop_gradient, so no backward pass runs over them (module doc)."""
    return jax.lax.stop_gradient(response_logps(params, input_ids, response_mask, cfg, chunk=chunk))
