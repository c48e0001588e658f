"""GRPO as AI2's OlmoRL ran it: the per-token policy loss, advantages and batch selection
(docs/post-training/grpo.md, "GRPO").

The source is open-instruct `open_instruct/grpo_fast.py` at the two commits AI2's OLMo 3 README names
for its RL runs: 42aa63c (7B Think, `scripts/train/olmo3/7b_think_rl.sh`) and 9ade62d (7B Instruct,
`7b_instruct_rl.sh`); grpo_fast.py differs between them only in checkpoint paths and a timeout. The
scripts' flags (beta 0, temperature 1, clip 0.2 / 0.272, centred advantages, Think's TIS cap 2,
Instruct's active sampling with pass rate 0.875) are this module's defaults; the code defaults at those
commits were different (beta 0.05, temperature 0.7, clip_higher 0.2, std-normalised advantages).

Layout: every per-token array is (rows, seq) and TOKEN-aligned, as open-instruct packs them: entry
[b, t] belongs to token input_ids[b, t] (the sampler's log-prob of that token, the advantage of the
response it is part of, whether it is a response token). The model's log-prob of token t is read from
the logits at position t - 1, so column 0 never carries a loss.

Loss of a response token (ratio r = exp(logp - logp_old), advantage A, eps 0.2 / 0.272):
    w * max(-A r, -A clip(r, 1 - eps_low, 1 + eps_high))  [+ beta * kl3]
w is the truncated importance-sampling weight min(exp(logp_old - logp_sampler), cap) (Think; 1 when
off). It is computed from the old and the sampler's log-probs only, so it carries no gradient, and it
scales both PPO branches before the max (equal to scaling the max, as w > 0); the KL term is not scaled.
Aggregation (open-instruct `masked_mean` with no axis, then `loss / accumulation_steps`): the token
mean over each device's micro-batch, divided by the micro-batches per optimizer step; data-parallel
ranks average their gradients, i.e. the mean over micro-batches of the same step index.
"""

from __future__ import annotations

from functools import partial
from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from olmax.config.model import ModelConfig
from olmax.model.olmo3 import forward_hidden, lm_head

# The OLMo 3 7B RL scripts' values (the Think and the Instruct run share all but TIS_CAP).
TEMPERATURE = 1.0
CLIP_LOW = 0.2
CLIP_HIGH = 0.272
TIS_CAP = 2.0  # Think only; Instruct runs without TIS (cap 0 = off, as open-instruct's flag)
REWARD_SCALE = 10.0  # open-instruct `verification_reward`: the caller's rewards are 10 x the verifier score
NO_RESAMPLING_PASS_RATE = 0.875  # Instruct's active sampling
# open-instruct divides the training logits by temperature + 1e-7 (`forward`); kept so log-probs are its.
TEMPERATURE_EPS = 1e-7
TIS_LOG_CLAMP = 10.0  # open-instruct clamps logp_old - logp_sampler to +-10 before exp
KL_LOG_CLAMP = 40.0  # and logp - logp_ref to +-40 before its KL estimators (before commit 5136b84)
STD_EPS = 1e-8  # the std normalisation's epsilon (numpy population std, as open-instruct)

# Metrics of one micro-batch, each already in the form that the train step's scan combines with
# METRIC_REDUCTIONS: "sum" metrics are token means divided by the micro-batch count (summed over the
# step they give the mean over micro-batches, as open-instruct averages its per-micro-batch stats);
# "min"/"max" are over the response tokens (+inf / -inf when a micro-batch has none).
GRPO_METRICS = (
    "loss/policy_avg",  # the PPO term (with TIS), without KL
    "loss/kl_avg",  # mean kl3 estimate (0 when beta is 0: no reference log-probs)
    "policy/clipfrac_avg",  # tokens whose clipped branch won (low or high)
    "policy/clipfrac_low",  # A < 0 and r < 1 - eps_low
    "policy/clipfrac_high",  # A > 0 and r > 1 + eps_high
    "val/ratio",  # mean r
    "tis/weight_mean",
    "tis/weight_min",
    "tis/weight_max",
    "tis/truncated_frac",  # tokens whose exp(logp_old - logp_sampler) exceeded the cap
    "debug/sampler_logp_diff_mean",  # mean |logp_old - logp_sampler|: the sampler/trainer gap
)
METRIC_REDUCTIONS = {
    name: ("min" if name == "tis/weight_min" else "max" if name == "tis/weight_max" else "sum") for name in GRPO_METRICS
}
# The batch a GRPO train step needs: token-aligned (rows, seq) arrays, packed rows as open-instruct's.
BATCH_KEYS = ("input_ids", "response_mask", "advantages", "old_logps", "sampler_logps", "ref_logps")


# ----------------------------------------------------------------------------------------------
# Log-probs


def token_logps(
    params: dict,
    hidden: jnp.ndarray,
    input_ids: jnp.ndarray,
    cfg: ModelConfig,
    *,
    temperature: float = TEMPERATURE,
    chunk: int = 0,
) -> jnp.ndarray:
    """(rows, seq) float32 log-prob of every token given the ones before it, from the final-normed
    hidden states (rows, seq, d_model): [b, t] = log softmax(logits[b, t - 1] / (temperature + 1e-7))
    [input_ids[b, t]] over the real vocabulary (cfg.vocab_size); column 0 is 0.

    As dpo.sequence_logps: the output layer runs `chunk` positions at a time (0: all) under
    jax.checkpoint, so the backward pass holds one (rows, chunk, vocab) block of logits at a time."""
    rows, t, _ = hidden.shape
    chunk = t if chunk <= 0 or chunk >= t else chunk
    if t % chunk:
        raise ValueError(f"trainer.loss_chunk={chunk} does not divide the sequence length {t}")
    targets = jnp.concatenate([input_ids[:, 1:], jnp.zeros_like(input_ids[:, :1])], axis=1).astype(jnp.int32)
    head = {"lm_head": params["lm_head"]}
    scale = 1.0 / (temperature + TEMPERATURE_EPS)

    @jax.checkpoint
    def one_chunk(head, h, y):
        logits = lm_head(head, h, cfg)[..., : cfg.vocab_size] * scale
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
    temperature: float = TEMPERATURE,
    chunk: int = 0,
    segments: Optional[jnp.ndarray] = None,
) -> jnp.ndarray:
    """One forward pass -> `token_logps`. segments: the packed rows' sequence index per token
    (forward_hidden's), so attention stays within each prompt + response."""
    hidden = forward_hidden(params, input_ids, cfg, segments=segments)
    return token_logps(params, hidden, input_ids, cfg, temperature=temperature, chunk=chunk)


# ----------------------------------------------------------------------------------------------
# Advantages and groups (rewards: (groups * group_size,), each group's samples consecutive)


def _grouped(rewards: jnp.ndarray, group_size: int) -> jnp.ndarray:
    if rewards.ndim != 1 or rewards.shape[0] % group_size:
        raise ValueError(f"rewards must be (groups * {group_size},), got shape {tuple(rewards.shape)}")
    return rewards.reshape(-1, group_size).astype(jnp.float32)


@partial(jax.jit, static_argnames=("group_size", "normalise_std"))
def advantages(rewards: jnp.ndarray, group_size: int, normalise_std: bool = False) -> jnp.ndarray:
    """(n,) per sample: reward - its group's mean (open-instruct "centered", the OLMo 3 runs'); with
    normalise_std also divided by the group's population std + 1e-8 (its "standard")."""
    r = _grouped(rewards, group_size)
    centred = r - jnp.mean(r, axis=1, keepdims=True)
    if normalise_std:
        centred = centred / (jnp.std(r, axis=1, keepdims=True) + STD_EPS)
    return centred.reshape(-1)


@partial(jax.jit, static_argnames="group_size")
def zero_spread(rewards: jnp.ndarray, group_size: int) -> jnp.ndarray:
    """(groups,) bool: True where every sample of the group has the same reward (open-instruct drops
    these: `np.std(scores) == 0`, which for its groups of 8 is exactly this equality)."""
    r = _grouped(rewards, group_size)
    return jnp.all(r == r[:, :1], axis=1)


@partial(jax.jit, static_argnames="group_size")
def pass_rates(rewards: jnp.ndarray, group_size: int, max_score: float = REWARD_SCALE) -> jnp.ndarray:
    """(groups,) mean reward / the largest possible reward (open-instruct's `percent_solved`)."""
    return jnp.mean(_grouped(rewards, group_size), axis=1) / max_score


def token_values(per_response: jnp.ndarray, response_index: jnp.ndarray) -> jnp.ndarray:
    """Per-response values (n,) -> (rows, seq) per token: response_index [b, t] = k + 1 where token t of
    packed row b is a token of response k, 0 elsewhere (open-instruct's packed `response_masks`)."""
    lookup = jnp.concatenate([jnp.zeros((1,), jnp.float32), per_response.astype(jnp.float32)])
    return lookup[response_index]


# ----------------------------------------------------------------------------------------------
# The loss


class LossSettings(NamedTuple):
    """The loss's knobs, one value per run (static under jit): the PPO clip range, the truncated
    importance-sampling cap (0 = off) and the kl3 weight (0 = no reference)."""

    clip_low: float = CLIP_LOW
    clip_high: float = CLIP_HIGH
    tis_cap: float = 0.0
    beta: float = 0.0

    @classmethod
    def of(cls, rl) -> LossSettings:
        """From the `grpo` config section (olmax.config.grpo.GRPOConfig)."""
        return cls(rl.clip_low, rl.clip_high, rl.tis_cap, rl.beta)


class TokenTerms(NamedTuple):
    loss: jnp.ndarray  # (rows, seq) float32 per-token loss (PPO term x TIS + beta x kl), 0 off the mask
    policy: jnp.ndarray  # (rows, seq) the PPO term x TIS alone
    ratio: jnp.ndarray  # (rows, seq) exp(logp - logp_old), 1 off the mask
    clipped_low: jnp.ndarray  # (rows, seq) bool
    clipped_high: jnp.ndarray  # (rows, seq) bool
    tis_weight: jnp.ndarray  # (rows, seq) the truncated weight (1 off the mask or without TIS), no gradient
    tis_truncated: jnp.ndarray  # (rows, seq) bool: the raw weight exceeded the cap
    kl: jnp.ndarray  # (rows, seq) kl3 of (logp, logp_ref), 0 without a reference


def token_terms(
    logps: jnp.ndarray,
    old_logps: Optional[jnp.ndarray],
    advantages: jnp.ndarray,
    mask: jnp.ndarray,
    *,
    sampler_logps: Optional[jnp.ndarray] = None,
    ref_logps: Optional[jnp.ndarray] = None,
    settings: LossSettings = LossSettings(),
) -> TokenTerms:
    """Per-token terms; all arrays (rows, seq), mask True where the token has a loss.

    old_logps None: the log-probs themselves without gradient (open-instruct with one mini-batch per
    step, the Think run: r = 1 in value). settings.tis_cap > 0 needs sampler_logps; settings.beta > 0
    needs ref_logps. Values off the mask are ignored (where-selected before any exp, so padding cannot
    make NaNs)."""
    clip_low, clip_high, tis_cap, beta = settings
    mask = mask.astype(bool)
    logps = logps.astype(jnp.float32)
    old = jax.lax.stop_gradient(logps if old_logps is None else old_logps.astype(jnp.float32))
    adv = jnp.where(mask, advantages.astype(jnp.float32), 0.0)
    ratio = jnp.exp(jnp.where(mask, logps - old, 0.0))
    unclipped = -adv * ratio
    clipped = -adv * jnp.clip(ratio, 1.0 - clip_low, 1.0 + clip_high)
    ones = jnp.ones_like(ratio)
    weight, truncated = ones, jnp.zeros_like(mask)
    if tis_cap > 0:
        if sampler_logps is None:
            raise ValueError("truncated importance sampling (tis_cap > 0) needs the sampler's log-probs")
        gap = jnp.clip(jnp.where(mask, old - sampler_logps.astype(jnp.float32), 0.0), -TIS_LOG_CLAMP, TIS_LOG_CLAMP)
        raw = jax.lax.stop_gradient(jnp.exp(gap))
        weight, truncated = jnp.minimum(raw, tis_cap), mask & (raw > tis_cap)
    policy = jnp.where(mask, jnp.maximum(unclipped * weight, clipped * weight), 0.0)
    kl = jnp.zeros_like(ratio)
    if beta > 0:
        if ref_logps is None:
            raise ValueError("beta > 0 needs the reference log-probs")
        d = jnp.clip(
            jnp.where(mask, logps - jax.lax.stop_gradient(ref_logps.astype(jnp.float32)), 0.0),
            -KL_LOG_CLAMP,
            KL_LOG_CLAMP,
        )
        kl = jnp.where(mask, jnp.expm1(-d) + d, 0.0)  # open-instruct's kl3 = TRL's exp(-d) + d - 1
    return TokenTerms(
        loss=policy + beta * kl,
        policy=policy,
        ratio=ratio,
        clipped_low=mask & (adv < 0) & (ratio < 1.0 - clip_low),
        clipped_high=mask & (adv > 0) & (ratio > 1.0 + clip_high),
        tis_weight=weight,
        tis_truncated=truncated,
        kl=kl,
    )


def micro_batch_means(x: jnp.ndarray, mask: jnp.ndarray, micro_batch_rows: int) -> jnp.ndarray:
    """(rows, seq) -> (rows / micro_batch_rows,): the token mean over each group of micro_batch_rows
    consecutive rows (one device's micro-batch; open-instruct's per_device_train_batch_size, 1 in the
    OLMo 3 runs). A group without tokens gives 0 (open-instruct would divide by zero; TRL clamps)."""
    rows = x.shape[0]
    if rows % micro_batch_rows:
        raise ValueError(f"{rows} rows do not split into micro-batches of {micro_batch_rows} rows")
    m = mask.astype(jnp.float32).reshape(rows // micro_batch_rows, -1)
    total = jnp.sum(jnp.where(m > 0, x.astype(jnp.float32).reshape(m.shape), 0.0), axis=1)
    return total / jnp.maximum(jnp.sum(m, axis=1), 1.0)


def aggregate(per_token: jnp.ndarray, mask: jnp.ndarray, *, micro_batch_rows: int, accum_steps: int) -> jnp.ndarray:
    """The loss a micro-batch contributes to its optimizer step: the mean over its device micro-batches
    (the data-parallel gradient average) of their token means, divided by accum_steps (the micro-batches
    per device per optimizer step). Summed over the step's micro-batches = open-instruct's update."""
    return jnp.mean(micro_batch_means(per_token, mask, micro_batch_rows)) / accum_steps


def metrics(
    terms: TokenTerms,
    mask: jnp.ndarray,
    *,
    micro_batch_rows: int,
    accum_steps: int,
    logps_gap: Optional[jnp.ndarray] = None,
) -> dict[str, jnp.ndarray]:
    """GRPO_METRICS of one micro-batch in METRIC_REDUCTIONS' form. logps_gap: |logp_old - logp_sampler|."""
    mask = mask.astype(bool)

    def mean(x):
        return aggregate(x, mask, micro_batch_rows=micro_batch_rows, accum_steps=accum_steps)

    f32 = jnp.float32
    zeros = jnp.zeros(mask.shape, f32)
    return {
        "loss/policy_avg": mean(terms.policy),
        "loss/kl_avg": mean(terms.kl),
        "policy/clipfrac_avg": mean((terms.clipped_low | terms.clipped_high).astype(f32)),
        "policy/clipfrac_low": mean(terms.clipped_low.astype(f32)),
        "policy/clipfrac_high": mean(terms.clipped_high.astype(f32)),
        "val/ratio": mean(terms.ratio),
        "tis/weight_mean": mean(terms.tis_weight),
        "tis/weight_min": jnp.min(jnp.where(mask, terms.tis_weight, jnp.inf)),
        "tis/weight_max": jnp.max(jnp.where(mask, terms.tis_weight, -jnp.inf)),
        "tis/truncated_frac": mean(terms.tis_truncated.astype(f32)),
        "debug/sampler_logp_diff_mean": mean(zeros if logps_gap is None else logps_gap),
    }


def zero_metrics() -> dict[str, jnp.ndarray]:
    """The identity of combine_metrics: where the train step's scan starts."""
    start = {"sum": 0.0, "min": jnp.inf, "max": -jnp.inf}
    return {k: jnp.asarray(start[METRIC_REDUCTIONS[k]], jnp.float32) for k in GRPO_METRICS}


def combine_metrics(a: dict, b: dict) -> dict:
    """Two micro-batches' metrics -> the step's so far (sum, min or max per METRIC_REDUCTIONS)."""
    ops = {"sum": jnp.add, "min": jnp.minimum, "max": jnp.maximum}
    return {k: ops[METRIC_REDUCTIONS[k]](a[k], b[k]) for k in GRPO_METRICS}


def loss_from_logps(
    logps: jnp.ndarray,
    mask: jnp.ndarray,
    advantages: jnp.ndarray,
    *,
    old_logps: Optional[jnp.ndarray] = None,
    sampler_logps: Optional[jnp.ndarray] = None,
    ref_logps: Optional[jnp.ndarray] = None,
    settings: LossSettings = LossSettings(),
    micro_batch_rows: int = 1,
    accum_steps: int = 1,
) -> tuple[jnp.ndarray, dict[str, jnp.ndarray]]:
    """(loss, metrics) of one micro-batch from its token log-probs; see `token_terms` and `aggregate`."""
    terms = token_terms(
        logps,
        old_logps,
        advantages,
        mask,
        sampler_logps=sampler_logps,
        ref_logps=ref_logps,
        settings=settings,
    )
    gap = None
    if sampler_logps is not None:
        old = logps if old_logps is None else old_logps
        gap = jax.lax.stop_gradient(jnp.abs(jnp.where(mask, old - sampler_logps, 0.0)))
    loss = aggregate(terms.loss, mask, micro_batch_rows=micro_batch_rows, accum_steps=accum_steps)
    return loss, metrics(terms, mask, micro_batch_rows=micro_batch_rows, accum_steps=accum_steps, logps_gap=gap)


def response_loss_mask(response_mask: jnp.ndarray) -> jnp.ndarray:
    """Token-aligned response mask -> the tokens that have a loss: column 0 has no prediction."""
    mask = jnp.asarray(response_mask, bool)  # a numpy mask too (the loop's, a test's)
    return mask.at[:, 0].set(False)


def grpo_loss(
    params: dict,
    input_ids: jnp.ndarray,
    response_mask: jnp.ndarray,
    advantages: jnp.ndarray,
    cfg: ModelConfig,
    *,
    old_logps: Optional[jnp.ndarray] = None,
    sampler_logps: Optional[jnp.ndarray] = None,
    ref_logps: Optional[jnp.ndarray] = None,
    segments: Optional[jnp.ndarray] = None,
    temperature: float = TEMPERATURE,
    settings: LossSettings = LossSettings(),
    micro_batch_rows: int = 1,
    accum_steps: int = 1,
    chunk: int = 0,
) -> tuple[jnp.ndarray, dict[str, jnp.ndarray]]:
    """(loss, metrics) of one micro-batch of packed rows: input_ids, response_mask, advantages and the
    optional log-prob arrays all (rows, seq), token-aligned. jax.grad of the loss, summed over the
    step's micro-batches, is open-instruct's gradient for the step; the metrics combine with
    combine_metrics. settings, micro_batch_rows, accum_steps, chunk: static."""
    logps = policy_token_logps(params, input_ids, cfg, temperature=temperature, chunk=chunk, segments=segments)
    return loss_from_logps(
        logps,
        response_loss_mask(response_mask),
        advantages,
        old_logps=old_logps,
        sampler_logps=sampler_logps,
        ref_logps=ref_logps,
        settings=settings,
        micro_batch_rows=micro_batch_rows,
        accum_steps=accum_steps,
    )


# ----------------------------------------------------------------------------------------------
# Which groups make the batch (host side, between rollouts)


class Selection(NamedTuple):
    keep: jnp.ndarray  # (groups,) bool: the group enters the batch
    consumed: jnp.ndarray  # int: groups read from the stream (the rest wait for the next batch)
    full: jnp.ndarray  # bool: the batch holds num_prompts groups
    no_resample: jnp.ndarray  # (groups,) bool: the prompt is not sampled again (among the consumed)
    filtered_zero: jnp.ndarray  # int: consumed groups dropped with every reward 0
    filtered_solved: jnp.ndarray  # int: ... with every reward max_score
    filtered_other: jnp.ndarray  # int: ... with another common reward


# jitted: the loop calls it with one configuration, so it compiles once and each call is one dispatch
@partial(
    jax.jit,
    static_argnames=("group_size", "num_prompts", "active", "filter_zero_spread", "no_resampling_pass_rate"),
)
def select_groups(
    rewards: jnp.ndarray,
    group_size: int,
    num_prompts: int,
    *,
    active: bool,
    filter_zero_spread: bool = True,
    no_resampling_pass_rate: Optional[float] = None,
    max_score: float = REWARD_SCALE,
) -> Selection:
    """open-instruct's `accumulate_inference_batches` over the groups in the order they arrived
    (rewards: (groups * group_size,)). Each group read: its prompt is marked not to be sampled again
    when its pass rate is >= no_resampling_pass_rate (before filtering: a 7-of-8 group is marked and
    still trained on); then, with filter_zero_spread, a group of equal rewards is dropped.
    active=False reads exactly num_prompts groups and keeps the survivors (the Think run); active=True
    reads until num_prompts groups survive (the Instruct run; `full` False: the stream ran out first,
    read more and call again with the rest)."""
    zero = zero_spread(rewards, group_size)
    groups = zero.shape[0]
    index = jnp.arange(groups)
    survives = ~zero if filter_zero_spread else jnp.ones_like(zero)
    if active:
        if not filter_zero_spread:
            raise ValueError("active sampling refills groups the zero-spread filter drops; it needs the filter")
        rank = jnp.cumsum(survives)
        full = rank[-1] >= num_prompts
        consumed = jnp.where(full, jnp.argmax(rank >= num_prompts) + 1, groups)
    else:
        consumed = jnp.asarray(min(num_prompts, groups))
        full = jnp.asarray(groups >= num_prompts)
    read = index < consumed
    keep = survives & read
    no_resample = jnp.zeros_like(read)
    if no_resampling_pass_rate is not None:
        no_resample = read & (pass_rates(rewards, group_size, max_score) >= no_resampling_pass_rate)
    first = _grouped(rewards, group_size)[:, 0]
    dropped = read & ~survives
    return Selection(
        keep=keep,
        consumed=consumed,
        full=full,
        no_resample=no_resample,
        filtered_zero=jnp.sum(dropped & (first == 0)),
        filtered_solved=jnp.sum(dropped & (first == max_score)),
        filtered_other=jnp.sum(dropped & (first != 0) & (first != max_score)),
    )


def next_epoch_prompts(prompt_ids: np.ndarray, excluded: np.ndarray, batch_size: int) -> tuple[np.ndarray, int]:
    """The prompts the next epoch draws from (open-instruct's ShufflingIterator drops excluded prompts
    only when an epoch ends, then reshuffles): (ids without the excluded ones, how many of them one epoch
    serves: a multiple of batch_size, the rest left out as its `effective_size`)."""
    kept = np.asarray(prompt_ids)[~np.isin(prompt_ids, excluded)]
    return kept, len(kept) - len(kept) % batch_size
