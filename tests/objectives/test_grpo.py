"""The GRPO objective (olmax.objectives.grpo) against TRL 1.16.0's GRPO loss and by hand.

Parity: TRL's own `GRPOTrainer._compute_loss`, run on a stand-in trainer whose
`_get_per_token_logps_and_entropies` returns per-token log-probs made by hand (no model: the loss is a
function of the log-probs), with loss_type "bnpo", epsilon 0.2 / epsilon_high 0.272, and vLLM
importance-sampling correction in "token_truncate" mode capped at 2.0. bnpo is the aggregation
open-instruct's grpo_fast.py uses: the token mean over one process's micro-batch, divided by the
gradient-accumulation steps, with data-parallel processes averaging gradients ("dapo" divides by the
tokens of the whole generation batch, "grpo" averages per sequence first). The fixture is 2 processes x
2 accumulation steps, micro-batches of 2 rows x 7 completion tokens, in three settings (`CASES`).
fp32 bounds 1e-5 on the per-token loss, the clip fractions, the KL metric, the step's loss and the
gradient w.r.t. every log-prob.

TRL and torch take ~8 s to import, so the comparison itself is `slow`
(`test_matches_trl_grpo_loss`); the default test `test_matches_stored_trl_values` holds the same claim
against TRL's numbers stored in tests/fixtures/grpo_trl_reference.json, which the slow test checks
are still what TRL computes and which `python tests/objectives/test_grpo.py` rewrites.
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from olmax.config.model import ModelConfig
from olmax.objectives import grpo
from olmax.objectives import logps as logps_lib
from olmax.objectives.grpo import GRPO
from olmax.rollout import groups

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "grpo_trl_reference.json"
PROCS, ACCUM, ROWS, T = 2, 2, 2, 7  # processes, accumulation steps, rows per micro-batch, completion tokens
TOL = 1e-5
# (old log-probs given?, TIS cap, beta): the Instruct run's later mini-batches (old given, no TIS); the
# Think run (one mini-batch, old = the log-probs themselves, TIS 2.0) with old given so that the ratios
# clip; and beta > 0 with a reference (open-instruct's kl3, TRL's KL without its bias correction).
# "inflight_tis": the continuous engine's in-flight updates, each completion's first tokens drawn by the
# policy that is being trained (sampler = old within rounding) and the rest by one a step behind, whose
# per-token log-probs TIS corrects token by token.
CASES = {
    "instruct": dict(old=True, tis_cap=0.0, beta=0.0),
    "think_tis": dict(old=True, tis_cap=2.0, beta=0.0),
    "think_tis_old_none": dict(old=False, tis_cap=2.0, beta=0.0),
    "kl": dict(old=True, tis_cap=0.0, beta=0.05),
    "inflight_tis": dict(old=True, tis_cap=2.0, beta=0.0, sampler="sampler_logps_two_versions"),
}


def fixture_inputs(seed: int = 0) -> dict[str, np.ndarray]:
    """(PROCS, ACCUM, ROWS, T) completion-aligned float32 arrays: log-probs spread so that ratios fall
    on both sides of both clip bounds and sampler gaps both sides of log 2; mixed-sign advantages (one
    0); completions of different lengths (right-padded)."""
    rng = np.random.default_rng(seed)
    shape = (PROCS, ACCUM, ROWS, T)
    old = -rng.uniform(0.05, 3.0, shape)
    lengths = rng.integers(2, T + 1, (PROCS, ACCUM, ROWS))
    adv = rng.normal(0, 5, (PROCS, ACCUM, ROWS))
    adv[0, 0, 1] = 0.0
    out = {
        "logps": (old + rng.normal(0, 0.3, shape)).astype(np.float32),
        "old_logps": old.astype(np.float32),
        "sampler_logps": (old + rng.normal(0, 0.7, shape)).astype(np.float32),
        "ref_logps": (old + rng.normal(0, 0.5, shape)).astype(np.float32),
        "mask": (np.arange(T) < lengths[..., None]).astype(np.float32),
        "advantages": adv.astype(np.float32),
    }
    # drawn a version apart: tokens before each completion's switch by the current policy, after it by the
    # previous one (the seed's stream goes on after the arrays above, which stay as they were)
    switch = rng.integers(1, T, (PROCS, ACCUM, ROWS))[..., None]
    same, behind = old + rng.normal(0, 1e-3, shape), old + rng.normal(-0.2, 0.8, shape)
    out["sampler_logps_two_versions"] = np.where(np.arange(T) < switch, same, behind).astype(np.float32)
    return out


# ----------------------------------------------------------------------------------------------
# olmax's side: the global micro-batch k holds every process's rows of step k


def olmax_side(inputs: dict, old: bool, tis_cap: float, beta: float, sampler: str = "sampler_logps") -> dict:
    """Per-token loss, the step's loss, metrics and d loss / d logps, all shaped like the fixture.
    olmax's arrays are token-aligned: column 0 stands for the prompt (no loss), the completion after."""

    def token_aligned(x):  # (P, A, R, T) -> (A, P * R, 1 + T)
        x = jnp.asarray(x).swapaxes(0, 1).reshape(ACCUM, PROCS * ROWS, T)
        return jnp.concatenate([jnp.zeros_like(x[..., :1]), x], axis=-1)

    mask = token_aligned(inputs["mask"]).astype(bool)
    adv = token_aligned(np.broadcast_to(inputs["advantages"][..., None], inputs["mask"].shape))
    settings = grpo.LossSettings(clip_low=0.2, clip_high=0.272, tis_cap=tis_cap, beta=beta)
    kw = dict(settings=settings, micro_batch_rows=ROWS, accum_steps=ACCUM)
    old_logps = token_aligned(inputs["old_logps"]) if old else None
    sampler, ref = token_aligned(inputs[sampler]), token_aligned(inputs["ref_logps"])
    logps = token_aligned(inputs["logps"])

    def step(logps):
        """The step's loss and metrics, summed over its micro-batches, with each token's loss."""
        losses, per_token = [], []
        metrics = {k: v for k, v in GRPO().zero_metrics().items() if k in grpo.GRPO_METRICS}
        for k in range(ACCUM):
            old_k = None if old_logps is None else old_logps[k]
            loss, m = grpo.loss_from_logps(
                logps[k], mask[k], adv[k], old_logps=old_k, sampler_logps=sampler[k], ref_logps=ref[k], **kw
            )
            losses.append(loss)
            metrics = GRPO().combine(metrics, m)
            terms = grpo.token_terms(
                logps[k],
                old_k,
                adv[k],
                mask[k],
                sampler_logps=sampler[k],
                ref_logps=ref[k],
                settings=settings,
            )
            per_token.append(terms.loss)
        return sum(losses), (metrics, jnp.stack(per_token))

    (loss, (metrics, per_token)), grads = jax.jit(jax.value_and_grad(step, has_aux=True))(logps)

    def back(x):  # (A, P * R, 1 + T) -> (P, A, R, T)
        return np.asarray(x)[..., 1:].reshape(ACCUM, PROCS, ROWS, T).swapaxes(0, 1)

    return {
        "loss": float(loss),
        "per_token_loss": back(per_token),
        "grad": back(grads),
        "clipfrac": float(metrics["policy/clipfrac_avg"]),
        "clipfrac_low": float(metrics["policy/clipfrac_low"]),
        "clipfrac_high": float(metrics["policy/clipfrac_high"]),
        "kl": float(metrics["loss/kl_avg"]),
    }


# ----------------------------------------------------------------------------------------------
# TRL's side: its `_compute_loss` on a stand-in trainer, once per (process, accumulation step)


def trl_side(inputs: dict, old: bool, tis_cap: float, beta: float, sampler: str = "sampler_logps") -> dict:
    import torch
    from trl import GRPOConfig
    from trl.trainer.grpo_trainer import GRPOTrainer

    args = GRPOConfig(
        output_dir="/tmp/olmax-grpo-trl",
        use_cpu=True,
        bf16=False,
        report_to=[],
        loss_type="bnpo",
        epsilon=0.2,
        epsilon_high=0.272,
        scale_rewards="none",
        beta=beta,
        use_bias_correction_kl=False,  # open-instruct's kl3 is not weighted by the ratio
        vllm_importance_sampling_correction=tis_cap > 0,
        vllm_importance_sampling_mode="token_truncate",
        vllm_importance_sampling_clip_max=tis_cap if tis_cap > 0 else 3.0,
    )

    class OneProcess:  # accelerate's collectives on one process
        num_processes = 1

        def gather(self, x):
            return x

        gather_for_metrics = gather

        def reduce(self, x, reduction="sum"):
            return x

    def call(p, k, mask, logps):
        """TRL's loss of micro-batch (p, k) with completion mask `mask` and metrics logged."""
        t = {key: torch.tensor(np.asarray(v[p, k])) for key, v in inputs.items()}
        old_logps = t["old_logps"] if old else logps.detach().clone()
        trainer = SimpleNamespace(
            args=args,
            _get_per_token_logps_and_entropies=lambda *a, **kw: (logps, torch.zeros_like(logps), None),
            aux_loss_enabled=False,
            top_entropy_quantile=args.top_entropy_quantile,
            off_policy_mask_threshold=args.off_policy_mask_threshold,
            importance_sampling_level=args.importance_sampling_level,
            beta=args.beta,
            loss_type=args.loss_type,
            epsilon_low=args.epsilon,
            epsilon_high=args.epsilon_high,
            use_vllm=True,
            vllm_importance_sampling_correction=args.vllm_importance_sampling_correction,
            model=SimpleNamespace(training=True),
            current_gradient_accumulation_steps=ACCUM,
            _entropy_bonus_enabled=False,
            _metrics={"train": defaultdict(list)},
            accelerator=OneProcess(),
        )
        batch = {
            "prompt_ids": torch.zeros((ROWS, 1), dtype=torch.long),
            "prompt_mask": torch.ones((ROWS, 1), dtype=torch.long),
            "completion_ids": torch.zeros((ROWS, T), dtype=torch.long),
            "completion_mask": mask,
            "advantages": t["advantages"],
            "old_per_token_logps": old_logps,
            "ref_per_token_logps": t["ref_logps"],
        }
        if tis_cap > 0:
            # TRL computes this ratio in `_generate_and_score_completions` (it needs vLLM's sampling); its
            # token_truncate lines, transcribed: exp((old - sampler) * mask), clamped to [clip_min, clip_max]
            full = t["mask"]
            ratio = torch.exp((old_logps.detach() - t[sampler]) * full)
            batch["importance_sampling_ratio"] = torch.clamp(
                ratio, min=args.vllm_importance_sampling_clip_min, max=args.vllm_importance_sampling_clip_max
            )
        loss = GRPOTrainer._compute_loss(trainer, None, batch)
        return loss, trainer._metrics["train"]

    per_token = np.zeros_like(inputs["logps"])
    grads = np.zeros_like(inputs["logps"])
    total, clip, low, high, kl = 0.0, [], [], [], []
    for p in range(PROCS):
        for k in range(ACCUM):
            mask = torch.tensor(inputs["mask"][p, k])
            logps = torch.tensor(inputs["logps"][p, k], requires_grad=True)
            loss, logged = call(p, k, mask, logps)
            loss.backward()
            grads[p, k] = logps.grad.numpy() / PROCS  # DDP averages the processes' gradients
            total += loss.item() / PROCS
            clip.append(logged["clip_ratio/region_mean"][0])
            low.append(logged["clip_ratio/low_mean"][0])
            high.append(logged["clip_ratio/high_mean"][0])
            kl.append(logged["kl"][0] if beta else 0.0)
            # per-token loss: bnpo with a one-token mask is that token's loss / accumulation steps
            for r, i in zip(*np.nonzero(inputs["mask"][p, k])):
                one = torch.zeros_like(mask)
                one[r, i] = 1.0
                per_token[p, k, r, i] = call(p, k, one, torch.tensor(inputs["logps"][p, k]))[0].item() * ACCUM
    return {
        "loss": total,
        "per_token_loss": per_token,
        "grad": grads,
        "clipfrac": float(np.mean(clip)),
        "clipfrac_low": float(np.mean(low)),
        "clipfrac_high": float(np.mean(high)),
        "kl": float(np.mean(kl)),
    }


def assert_same(ours: dict, theirs: dict, name: str) -> dict[str, float]:
    errors = {}
    for key, value in theirs.items():
        errors[key] = float(np.max(np.abs(np.asarray(ours[key], np.float64) - np.asarray(value, np.float64))))
        assert errors[key] <= TOL, f"{name}: {key} differs by {errors[key]:.2e}"
    return errors


def trl_reference() -> dict:
    inputs = fixture_inputs()
    cases = {
        name: {k: np.asarray(v).tolist() for k, v in trl_side(inputs, **case).items()} for name, case in CASES.items()
    }
    return {"inputs": {k: v.tolist() for k, v in inputs.items()}, "cases": cases}


@pytest.mark.slow  # TRL + torch imports (~8 s); test_matches_stored_trl_values holds the claim by default
@pytest.mark.parity
def test_matches_trl_grpo_loss():
    pytest.importorskip("trl")
    fresh = trl_reference()
    stored = json.loads(FIXTURE.read_text())
    inputs = fixture_inputs()
    for name, case in CASES.items():
        assert_same(olmax_side(inputs, **case), fresh["cases"][name], name)
        assert_same(stored["cases"][name], fresh["cases"][name], f"stored {name}")  # the fixture is TRL's


def test_matches_stored_trl_values():
    stored = json.loads(FIXTURE.read_text())
    inputs = {k: np.asarray(v, np.float32) for k, v in stored["inputs"].items()}
    np.testing.assert_array_equal(inputs["logps"], fixture_inputs()["logps"])  # same generator, same numbers
    for name, case in CASES.items():
        theirs = stored["cases"][name]
        ours = olmax_side(inputs, **case)
        assert_same(ours, theirs, name)
        if case.get("sampler"):  # two versions: weights ~1 on the current policy's tokens, some capped after
            weight = np.exp(inputs["old_logps"] - inputs[case["sampler"]])[inputs["mask"] > 0]
            assert np.sum(np.abs(weight - 1) < 0.01) >= 10 and np.sum(weight > case["tis_cap"]) >= 3
        if case["old"]:  # the fixture's ratios reach both clip bounds
            assert theirs["clipfrac_low"] > 0 and theirs["clipfrac_high"] > 0
        else:
            assert theirs["clipfrac"] == 0.0  # r = 1 in value: nothing clips, as in the Think run


# ----------------------------------------------------------------------------------------------
# By hand


def test_advantages_and_zero_spread_by_hand():
    rewards = jnp.array([10.0, 0.0, 0.0, 10.0, 10.0, 10.0, 10.0, 10.0, 0.0, 0.0, 0.0, 5.0])
    np.testing.assert_allclose(
        groups.advantages(rewards, 4), [5, -5, -5, 5, 0, 0, 0, 0, -1.25, -1.25, -1.25, 3.75], rtol=1e-6
    )
    std = groups.advantages(rewards, 4, normalise_std=True)  # population std: 5, 0, 2.165
    np.testing.assert_allclose(std[:8], [1, -1, -1, 1, 0, 0, 0, 0], rtol=1e-6)
    np.testing.assert_allclose(std[8:], np.array([-1.25, -1.25, -1.25, 3.75]) / np.sqrt(75 / 16), rtol=1e-6)
    np.testing.assert_array_equal(groups.zero_spread(rewards, 4), [False, True, False])
    np.testing.assert_allclose(groups.pass_rates(rewards, 4, 10.0), [0.5, 1.0, 0.125])
    with pytest.raises(ValueError, match="groups"):
        groups.advantages(rewards, 5)
    packed = jnp.array([[0, 1, 1, 0, 2, 2], [3, 3, 3, 0, 0, 0]])
    np.testing.assert_array_equal(
        groups.token_values(jnp.array([5.0, -5.0, 2.0]), packed), [[0, 5, 5, 0, -5, -5], [2, 2, 2, 0, 0, 0]]
    )


def test_token_terms_by_hand():
    # one row, token 0 masked; tokens: A=2 r=1.5 (clipped high), A=-1 r=0.5 (clipped low),
    # A=1 r=0.5 (unclipped), A=-1 r=1.5 (unclipped), A=0
    ratio = np.array([1.0, 1.5, 0.5, 0.5, 1.5, 1.1], np.float32)
    old = np.full((1, 6), -1.0, np.float32)
    logps = old + np.log(ratio)
    adv = np.array([[7.0, 2.0, -1.0, 1.0, -1.0, 0.0]], np.float32)
    mask = np.array([[False, True, True, True, True, True]])
    sampler = old - np.log([1, 3.0, 0.5, 1.0, 2.5, 1.0], dtype=np.float32)  # raw weights 1 3 .5 1 2.5 1
    mask2 = np.concatenate([mask, mask]).copy()
    mask2[1, 1] = False

    tis = grpo.LossSettings(tis_cap=2.0)

    @jax.jit
    def run(logps):
        def loss_sum(lp):
            return jnp.sum(grpo.token_terms(lp, old, adv, mask, sampler_logps=sampler, settings=tis).loss)

        terms = grpo.token_terms(logps, old, adv, mask, sampler_logps=sampler, settings=tis)
        two = jnp.concatenate([terms.loss, terms.loss])  # 2 device micro-batches of 1 row, 2 accumulation steps
        return (
            terms,
            grpo.aggregate(two, mask2, micro_batch_rows=1, accum_steps=2),
            grpo.aggregate(two, mask2, micro_batch_rows=2, accum_steps=1),
            grpo.metrics(terms, mask, micro_batch_rows=1, accum_steps=1),
            jax.grad(loss_sum)(logps),
        )

    terms, per_device, one_group, m, grad = run(logps)
    weight = np.array([1, 2.0, 0.5, 1.0, 2.0, 1.0])
    policy = np.array([0, -2 * 1.272, 0.8, -0.5, 1.5, 0.0]) * weight
    np.testing.assert_allclose(terms.loss[0], policy, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(terms.clipped_high[0], [0, 1, 0, 0, 0, 0])
    np.testing.assert_array_equal(terms.clipped_low[0], [0, 0, 1, 0, 0, 0])
    np.testing.assert_allclose(terms.tis_weight[0], weight, rtol=1e-6)
    np.testing.assert_array_equal(terms.tis_truncated[0], [0, 1, 0, 0, 1, 0])
    np.testing.assert_allclose(per_device, (policy[1:].mean() + policy[2:].mean()) / 2 / 2, rtol=1e-6)
    np.testing.assert_allclose(one_group, (policy[1:].sum() + policy[2:].sum()) / 9, rtol=1e-6)  # 5 + 4 tokens
    assert float(m["policy/clipfrac_avg"]) == pytest.approx(0.4)
    assert float(m["tis/truncated_frac"]) == pytest.approx(0.4)
    assert (float(m["tis/weight_min"]), float(m["tis/weight_max"])) == pytest.approx((0.5, 2.0))
    np.testing.assert_allclose(float(m["tis/weight_mean"]), weight[1:].mean(), rtol=1e-6)
    # the TIS weight carries no gradient; the loss's gradient is -A w r on unclipped tokens, 0 on clipped
    np.testing.assert_allclose(grad[0], [0, 0, 0, -0.5, 2 * 1.5, 0], rtol=1e-6, atol=1e-7)
    with pytest.raises(ValueError, match="sampler"):
        grpo.token_terms(logps, None, adv, mask, settings=grpo.LossSettings(tis_cap=2.0))
    with pytest.raises(ValueError, match="reference"):
        grpo.token_terms(logps, None, adv, mask, settings=grpo.LossSettings(beta=0.1))


def test_select_groups_by_hand():
    # groups of 8 arriving in this order, solved counts 8, 3, 0, 7, 5, 8 (reward 10 per solve)
    solved = [8, 3, 0, 7, 5, 8]
    rewards = jnp.asarray(np.concatenate([10.0 * (np.arange(8) < s) for s in solved]), jnp.float32)
    sel = groups.select_groups(rewards, 8, 3, max_score=10.0, active=True, no_resampling_pass_rate=0.875)
    np.testing.assert_array_equal(sel.keep, [0, 1, 0, 1, 1, 0])  # refilled to 3 groups of non-zero spread
    assert (int(sel.consumed), bool(sel.full)) == (5, True)  # the 6th group waits for the next batch
    np.testing.assert_array_equal(sel.no_resample, [1, 0, 0, 1, 0, 0])  # 8/8 and 7/8 >= 0.875
    assert (int(sel.filtered_zero), int(sel.filtered_solved), int(sel.filtered_other)) == (1, 1, 0)
    short = groups.select_groups(rewards, 8, 4, max_score=10.0, active=True)
    np.testing.assert_array_equal(short.keep, [0, 1, 0, 1, 1, 0])
    assert (int(short.consumed), bool(short.full)) == (6, False)
    plain = groups.select_groups(
        rewards, 8, 3, max_score=10.0, active=False, no_resampling_pass_rate=0.875
    )  # the Think run
    np.testing.assert_array_equal(plain.keep, [0, 1, 0, 0, 0, 0])  # exactly 3 read, the survivors kept
    assert int(plain.consumed) == 3
    np.testing.assert_array_equal(plain.no_resample, [1, 0, 0, 0, 0, 0])
    ids, size = groups.next_epoch_prompts(np.array([4, 9, 2, 7, 5, 1, 3]), np.array([9, 5]), batch_size=2)
    np.testing.assert_array_equal(ids, [4, 2, 7, 1, 3])
    assert size == 4
    with pytest.raises(ValueError, match="needs the filter"):
        groups.select_groups(rewards, 8, 3, max_score=10.0, active=True, filter_zero_spread=False)


def test_token_logps_over_the_real_vocabulary():
    cfg = ModelConfig(vocab_size=50, compute_dtype="float32")  # padded to 128: the padding must not count
    rng = np.random.default_rng(1)
    rows, t, d = 3, 8, 16
    params = {"lm_head": jnp.asarray(rng.normal(0, 1, (d, cfg.padded_vocab_size)), jnp.float32)}
    hidden = jnp.asarray(rng.normal(0, 1, (rows, t, d)), jnp.float32)
    ids = jnp.asarray(rng.integers(0, 50, (rows, t)), jnp.int32)
    logps = jax.jit(logps_lib.token_logps, static_argnums=3, static_argnames=("temperature", "chunk"))
    full = np.asarray(hidden, np.float64) @ np.asarray(params["lm_head"], np.float64)
    # the whole sequence at once and in chunks; the raw logits (DPO's, the reference pass's) without a temperature
    for temperature, chunk in ((0.7, 0), (1.0, 4), (None, 4), (None, 0)):
        logits = full[..., :50] / (temperature + 1e-7 if temperature is not None else 1.0)
        shifted = logits - logits.max(-1, keepdims=True)
        log_softmax = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
        want = np.take_along_axis(log_softmax[:, :-1], np.asarray(ids)[:, 1:, None], -1)[..., 0]
        got = logps(params, hidden, ids, cfg, temperature=temperature, chunk=chunk)
        np.testing.assert_allclose(got[:, 1:], want, atol=1e-5)
        np.testing.assert_array_equal(got[:, 0], 0.0)
    # DPO's per-sequence log-probs are the per-token ones summed over the response tokens t >= 1 of the
    # mask (position 0 predicts nothing), counted so too
    mask = rng.random((rows, t)) < 0.6
    seq = logps_lib.sequence_logps(got, mask)
    scored = mask & (np.arange(t) > 0)
    np.testing.assert_allclose(seq.total, np.sum(np.where(scored, got, 0.0), 1), atol=2e-5)
    np.testing.assert_array_equal(seq.count, scored.sum(1))
    with pytest.raises(ValueError, match="does not divide"):
        logps_lib.token_logps(params, hidden, ids, cfg, chunk=3)


if __name__ == "__main__":
    # Writes the fixture from TRL (needs the parity extra): python tests/objectives/test_grpo.py
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests' own modules (models.py)
    FIXTURE.write_text(json.dumps(trl_reference()) + "\n")
    print(f"wrote {FIXTURE}")
