"""GRPO as AI2's OlmoRL ran it: the per-token policy loss and the objective the train step asks
(docs/post-training/grpo.md, "GRPO"); the RL loop's advantages and group selection, host side, are
olmax.rollout.groups.

The source is open-instruct `open_instruct/grpo_fast.py` at the two commits AI2's OLMo 3 README names
for its RL runs: 42aa63c (7B Think, `scripts/train/olmo3/7b_think_rl.sh`) and 9ade62d (7B Instruct,
`7b_instruct_rl.sh`); grpo_fast.py differs between them only in checkpoint paths and a timeout. The
scripts' flags (beta 0, temperature 1, clip 0.2 / 0.272, centred advantages, Think's TIS cap 2,
Instruct's active sampling with pass rate 0.875) are the `grpo` section's defaults (olmax.config.grpo);
the code defaults at those commits were different (beta 0.05, temperature 0.7, clip_higher 0.2,
std-normalised advantages).

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

from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp

from olmax.config.grpo import GRPOConfig
from olmax.config.model import ModelConfig
from olmax.model.attention import segment_ids as segment_ids_of
from olmax.objectives.base import BatchField, Objective, StepContext
from olmax.objectives.logps import policy_token_logps, scored_tokens

TIS_LOG_CLAMP = 10.0  # open-instruct clamps logp_old - logp_sampler to +-10 before exp
KL_LOG_CLAMP = 40.0  # and logp - logp_ref to +-40 before its KL estimators (before commit 5136b84)

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
# The batch a GRPO train step takes: token-aligned (rows, seq) arrays, packed rows as open-instruct's
# (and doc_lens with data.doc_masking): GRPO.fields says which it needs.
BATCH_KEYS = ("input_ids", "response_mask", "advantages", "old_logps", "sampler_logps", "ref_logps")


# ----------------------------------------------------------------------------------------------
# The loss


class LossSettings(NamedTuple):
    """The loss's knobs, one value per run (static under jit): the PPO clip range, the truncated
    importance-sampling cap (0 = off) and the kl3 weight (0 = no reference)."""

    clip_low: float = GRPOConfig.clip_low
    clip_high: float = GRPOConfig.clip_high
    tis_cap: float = GRPOConfig.tis_cap
    beta: float = GRPOConfig.beta

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
    temperature: float = GRPOConfig.temperature,
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
        scored_tokens(response_mask),
        advantages,
        old_logps=old_logps,
        sampler_logps=sampler_logps,
        ref_logps=ref_logps,
        settings=settings,
        micro_batch_rows=micro_batch_rows,
        accum_steps=accum_steps,
    )


# ----------------------------------------------------------------------------------------------
# The objective


class GRPO(Objective):
    """trainer.objective=grpo: the global batch counts packed rollout rows (prompt + response sequences,
    open-instruct's pack_sequences), split over devices and micro-batches as instances are. Each
    micro-batch's loss is `grpo_loss` with one device's micro-batch as its token-mean group, divided by
    the accumulation steps (open-instruct's aggregation), so the step's loss is the mean over (device,
    micro-batch) groups of their token means. Metrics combine by METRIC_REDUCTIONS (sums, min, max)."""

    name = "grpo"
    config = GRPOConfig
    # named as open-instruct logs them; the rollout's own figures ("rollout/...") keep their names
    metric_names = {
        "loss": "train/GRPO loss",
        "response_tokens": "train/response tokens",
        **{name: name for name in GRPO_METRICS},
    }
    metric_reductions = METRIC_REDUCTIONS
    status_metrics = (
        "rollout/reward_mean",
        "rollout/solve_rate",
        "rollout/response_len_mean",
        "rollout/zero_spread_frac",
        "rollout/slot_efficiency_run",
        "rollout/staleness_mean",
    )

    def fields(self, cfg) -> dict[str, BatchField]:
        """input_ids, response_mask and advantages always; sampler_logps needed with grpo.tis_cap > 0 (the RL
        loop always gives it: its gap to the step's log-probs is a metric), ref_logps with grpo.beta > 0,
        old_logps optional (the loop gives it with grpo.mini_batches > 1; absent: the step's own log-probs,
        detached: one mini-batch per rollout), doc_lens with data.doc_masking (only then: without it the
        packed sequences would attend to each other unasked)."""
        rl, shape = cfg.grpo, (cfg.trainer.global_batch, cfg.data.seq_len)
        dtypes = {"input_ids": "int32", "response_mask": "bool", "doc_lens": "int32"}
        required = {"input_ids": True, "response_mask": True, "advantages": True, "doc_lens": True}
        required.update(sampler_logps=rl.tis_cap > 0, ref_logps=rl.beta > 0, old_logps=False)
        carried = {**required, "sampler_logps": True, "old_logps": rl.mini_batches > 1}
        keys = [*BATCH_KEYS, *["doc_lens"] * cfg.data.doc_masking]
        return {k: BatchField(shape, dtypes.get(k, "float32"), ("batch", "seq"), required[k], carried[k]) for k in keys}

    def check_batch(self, cfg, batch: dict) -> None:
        fields = self.fields(cfg)
        for key in batch:
            if key not in fields:  # a misspelt old_logps would otherwise be silently unused
                known = ", ".join(sorted(fields))
                raise ValueError(f"trainer.objective=grpo: unknown batch key {key!r} (known: {known})")
        for key, f in fields.items():
            if f.required and batch.get(key) is None:
                raise ValueError(f"trainer.objective=grpo but the batch has no {key!r} (docs/post-training/grpo.md)")
        for key, value in batch.items():
            if value is not None and tuple(value.shape) != fields[key].shape:
                raise ValueError(
                    f"batch[{key!r}] has shape {tuple(value.shape)}, "
                    f"expected (trainer.global_batch, data.seq_len) = {fields[key].shape}"
                )

    def prepare(self, ctx: StepContext, batch: dict) -> tuple[dict, Any]:
        f32, rl = jnp.float32, ctx.cfg.grpo
        dtypes = {"input_ids": jnp.int32, "response_mask": bool, "segments": jnp.int32}
        rows = {k: batch.get(k) for k in ("input_ids", "response_mask", "advantages", "old_logps", "sampler_logps")}
        rows["ref_logps"] = batch.get("ref_logps") if rl.beta > 0 else None
        if "doc_lens" in batch:  # attention within each packed prompt + response, as SFT's documents
            rows["segments"] = segment_ids_of(batch["doc_lens"])
        return {k: v.astype(dtypes.get(k, f32)) for k, v in rows.items() if v is not None}, None

    def micro_metrics(self) -> tuple[str, ...]:
        return ("loss", *GRPO_METRICS)

    def micro_loss(self, ctx: StepContext, params: dict, micro: dict, shared: Any):
        cfg, layout = ctx.cfg, ctx.layout
        loss, metrics = grpo_loss(
            params,
            micro["input_ids"],
            micro["response_mask"],
            micro["advantages"],
            cfg.model,
            old_logps=micro.get("old_logps"),
            sampler_logps=micro.get("sampler_logps"),
            ref_logps=micro.get("ref_logps"),
            segments=micro.get("segments"),
            temperature=cfg.grpo.temperature,
            settings=LossSettings.of(cfg.grpo),
            # a micro-batch's rows are every batch shard's micro_batch rows in shard order: each group
            # of micro_batch consecutive rows is one device's micro-batch, open-instruct's token-mean unit
            micro_batch_rows=layout.micro_batch,
            accum_steps=layout.accum_steps,
            chunk=cfg.trainer.loss_chunk,
        )
        return loss, {"loss": loss, **metrics}

    def finish(self, ctx: StepContext, grads: dict, sums: dict, batch: dict):
        """Each device micro-batch's token mean was divided by all of them (batch shards x accumulation
        steps); open-instruct divides by the micro-batches it has, none empty. The RL loop pads a step
        with empty rows, so the step counts the micro-batches that hold a scored token and rescales."""
        f32, layout = jnp.float32, ctx.layout
        scored = scored_tokens(batch["response_mask"])
        s, a, m = layout.batch_shards, layout.accum_steps, layout.micro_batch
        held = jnp.any(scored.reshape(s, a, m * scored.shape[1]), axis=-1)
        scale = (s * a) / jnp.maximum(jnp.sum(held, dtype=f32), 1.0)
        grads = jax.tree.map(lambda g: g * scale, grads)
        sums = {k: v * scale if self.metric_reductions.get(k, "sum") == "sum" else v for k, v in sums.items()}
        for k in ("tis/weight_min", "tis/weight_max"):  # +-inf without a scored token: log the neutral weight
            sums[k] = jnp.where(jnp.isfinite(sums[k]), sums[k], 1.0)
        return grads, sums["loss"], {**sums, "response_tokens": jnp.sum(scored, dtype=f32)}

    def hold(self, metrics: dict):
        """A batch without a scored token (no rollout group had a reward spread) updates nothing."""
        return metrics["response_tokens"] == 0
