"""Direct preference optimisation: the loss over the model's outputs and its metrics (docs/post-training/dpo.md, "DPO").

The batch holds 2P rows, one sequence per row (prompt then response, right-padded): rows 0..P-1 the
chosen responses, rows P..2P-1 the rejected ones, pair i being rows i and P + i (the row order of
open-instruct's `concatenated_forward` and TRL 1.16.0's `DataCollatorForPreference`), so both sides go
through ONE forward pass. `response_mask` (2P, seq) is one bool per token, True where the token is part
of the response (the tokenizer's label mask). The log-prob of token t + 1 is read at position t, so a
sequence's log-prob is the sum, over its response tokens, of log softmax(logits[t - 1])[token t].

Logits are taken over the real vocabulary (`cfg.vocab_size`, not the padded one): the log-probs of the
HF model open-instruct trained (open-instruct `dpo_utils.py`, commit e6c3044).

The log-probs are olmax.objectives.logps's, shared with GRPO and the reference pass.

Losses, with r = policy log-prob - reference log-prob of a sequence and beta = dpo.beta (5, AI2's):
- `dpo`: -log sigmoid(beta (r_chosen - r_rejected)), r over summed log-probs (TRL `loss_type="sigmoid"`);
- `dpo_norm`: the same with r divided by the sequence's response tokens, that is over log-probs
  averaged per token (open-instruct `dpo_tune_cache.py`'s `dpo_norm`, AI2's OLMo 3 DPO loss; TRL
  `loss_type="sigmoid_norm"`).
Per pair; the step's loss is their mean over the global batch. Rewards are beta r (without gradient),
r as the loss uses it: averaged log-probs for `dpo_norm`, as open-instruct logs them (TRL 1.16.0 logs
summed ones for both losses). Accuracy counts pairs whose chosen reward is strictly larger.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from olmax.config.dpo import DPO_LOSS_TYPES, DPOConfig
from olmax.config.model import ModelConfig
from olmax.objectives.base import BatchField, Objective, StepContext, item_fields
from olmax.objectives.logps import SequenceLogps, response_logps

METRICS = ("rewards/chosen", "rewards/rejected", "rewards/margins", "rewards/accuracy")


class PairTerms(NamedTuple):
    losses: jnp.ndarray  # (pairs,) float32
    chosen_rewards: jnp.ndarray  # (pairs,) float32, no gradient
    rejected_rewards: jnp.ndarray  # (pairs,) float32, no gradient


def policy_logps(
    params: dict, input_ids: jnp.ndarray, response_mask: jnp.ndarray, cfg: ModelConfig, *, chunk: int
) -> SequenceLogps:
    """One forward pass over all rows (chosen and rejected together) -> their response log-probs."""
    return response_logps(params, input_ids, response_mask, cfg, chunk=chunk)


def reference_logps(
    params: dict, input_ids: jnp.ndarray, response_mask: jnp.ndarray, cfg: ModelConfig, *, chunk: int
) -> jnp.ndarray:
    """The reference model's summed response log-probs (rows,), without gradient: what the reference
    pass computes once per row and the cache keeps (the token counts follow from the masks)."""
    return jax.lax.stop_gradient(policy_logps(params, input_ids, response_mask, cfg, chunk=chunk).total)


def pair_terms(policy: SequenceLogps, reference: jnp.ndarray, *, loss_type: str, beta: float) -> PairTerms:
    """Per-pair losses and rewards from the policy's log-probs and the reference's summed log-probs
    (rows,), rows ordered chosen then rejected."""
    if loss_type not in DPO_LOSS_TYPES:
        raise ValueError(f"unknown DPO loss {loss_type!r}; expected one of {', '.join(DPO_LOSS_TYPES)}")
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
    beta: float = DPOConfig.beta,
    chunk: int = 0,
) -> tuple[jnp.ndarray, dict[str, jnp.ndarray]]:
    """(sum of the per-pair losses, metric sums) of one (micro-)batch: divide both by the global batch's
    pair count, as olmax.objectives.cross_entropy's sums are divided by the global token count, to get the
    mean over pairs whatever the micro-batching. `reference` (rows,) is the reference's summed log-probs
    (`reference_logps`)."""
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
    beta: float = DPOConfig.beta,
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


class DPO(Objective):
    """trainer.objective=dpo: the batch counts preference pairs, each a (2, seq) chosen/rejected pair of
    rows; a micro-batch's loss is its pairs' summed losses divided by the global pair count."""

    name = "dpo"
    config = DPOConfig
    reference_pass = True
    # named as open-instruct logs them
    metric_names = {"loss": "train/DPO loss", **{name: f"train/{name}" for name in METRICS}}

    def fields(self, cfg) -> dict[str, BatchField]:
        return item_fields(cfg, reference=True)

    def check_batch(self, cfg, batch: dict) -> None:
        for key, f in self.fields(cfg).items():
            if key not in batch:
                raise ValueError(f"trainer.objective=dpo but the batch has no {key!r}")
            if tuple(batch[key].shape) != f.shape:
                raise ValueError(
                    f"batch[{key!r}] has shape {tuple(batch[key].shape)}, expected {f.shape} "
                    "(trainer.global_batch pairs, chosen and rejected, data.seq_len)"
                )

    def prepare(self, ctx: StepContext, batch: dict) -> tuple[dict, Any]:
        return {
            "input_ids": batch["input_ids"].astype(jnp.int32),
            "response_mask": batch["response_mask"].astype(bool),
            "reference_logps": batch["reference_logps"].astype(jnp.float32),
        }, None

    def micro_metrics(self) -> tuple[str, ...]:
        return ("loss", *METRICS)

    def micro_loss(self, ctx: StepContext, params: dict, micro: dict, shared: Any):
        cfg = ctx.cfg
        total, sums = pair_axis_loss(
            params,
            micro["input_ids"],
            micro["response_mask"],
            micro["reference_logps"],
            cfg.model,
            loss_type=cfg.dpo.loss_type,
            beta=cfg.dpo.beta,
            chunk=cfg.trainer.loss_chunk,
        )
        pairs = cfg.trainer.global_batch
        return total / pairs, {"loss": total / pairs, **{k: v / pairs for k, v in sums.items()}}
