"""The DPO objective (olmax.objectives.dpo) against TRL 1.16.0's `DPOTrainer` and by hand.

Parity: a tiny transformers Olmo3ForCausalLM policy and a reference (the policy with every weight
scaled by 1 + 0.02 N(0, 1), so the log-ratios are O(1) and the loss is far from saturated), both
converted to olmax. TRL tokenizes three preference rows of different lengths and collates them
([chosen; rejected] rows, right-padded, a completion mask); olmax scores the same input ids and mask.
fp32 bounds (TOL = 1e-5; `tolerances`): with `dpo_norm`, per-pair loss, rewards and margins within TOL
and every gradient tensor within TOL of its largest entry; with `dpo`, whose log-probs are sums of ~10
tokens, TOL per summed token (two fp32 forwards differ by up to ~3e-6 nats a token). After 5
torch-default AdamW steps (TRL's `train`) against optax's adamw, at a learning rate that keeps the loss
unsaturated, every parameter within what float32 leaves open (`adam_allowance`), for both. Both losses:
`dpo_norm` = TRL `sigmoid_norm`, `dpo` = TRL `sigmoid`; beta 5. No bound depends on the order XLA's CPU
code adds in (the CPU's vector width, the optimisation level): the suite's own compile is used.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from models import make_hf_config, randomize_

from olmax.config import dpo as dpo_config
from olmax.objectives import dpo

VOCAB = 300  # padded to 384 in olmax: the log-softmax must leave the padding out
TRL_LOSS = {"dpo_norm": "sigmoid_norm", "dpo": "sigmoid"}
LENGTHS = [(5, 4, 9), (9, 7, 3), (3, 11, 6)]  # (prompt, chosen, rejected) words; TRL appends EOS to each response
BETA = dpo_config.DPOConfig().beta  # AI2's OLMo 3 DPO: 5
# Five AdamW steps at 1e-5 keep the loss unsaturated (TRL's: `dpo` 0.099 -> 0.0045, `dpo_norm` 0.64 -> 0.43).
# At 1e-3 the summed `dpo` loss reached 1e-45 by the fifth step, its gradients float32 rounding noise
# that Adam turned into whole steps of lr, signed by the host's float order: o_proj 7.4e-4 of its norm
# from TRL's on one x86-64 host, within the bound of 1e-5 on another.
LR, STEPS = 1e-5, 5
TOL = 1e-5
# jitted once for the batch shape all parity tests share
policy_logps = jax.jit(dpo.policy_logps, static_argnums=3, static_argnames="chunk")
reference_logps = jax.jit(dpo.reference_logps, static_argnums=3, static_argnames="chunk")


# ----------------------------------------------------------------------------------------------
# By hand (no reference library)


def test_pair_terms_by_hand():
    # two pairs; rows: chosen 0, chosen 1, rejected 0, rejected 1
    policy = dpo.SequenceLogps(jnp.array([-4.0, -6.0, -9.0, -3.0]), jnp.array([2.0, 3.0, 3.0, 1.0]))
    reference = jnp.array([-5.0, -6.0, -6.0, -4.0])
    ratio = np.array([1.0, 0.0, -3.0, 1.0])
    for loss_type, r in (("dpo", ratio), ("dpo_norm", ratio / np.array([2.0, 3.0, 3.0, 1.0]))):
        terms = dpo.pair_terms(policy, reference, loss_type=loss_type, beta=2.0)
        delta = r[:2] - r[2:]
        np.testing.assert_allclose(terms.losses, np.log1p(np.exp(-2.0 * delta)), rtol=1e-6)
        np.testing.assert_allclose(terms.chosen_rewards, 2.0 * r[:2], rtol=1e-6)
        np.testing.assert_allclose(terms.rejected_rewards, 2.0 * r[2:], rtol=1e-6)
        sums = dpo.metric_sums(terms)
        assert float(sums["rewards/accuracy"]) == 1.0  # pair 0 wins, pair 1 loses
        np.testing.assert_allclose(float(sums["rewards/margins"]), 2.0 * delta.sum(), rtol=1e-6)


def test_bad_batches_are_refused():
    policy = dpo.SequenceLogps(jnp.zeros(3), jnp.ones(3))
    with pytest.raises(ValueError, match="even number"):
        dpo.pair_terms(policy, jnp.zeros(3), loss_type="dpo", beta=5.0)
    with pytest.raises(ValueError, match="unknown DPO loss 'ipo'"):
        dpo.pair_terms(dpo.SequenceLogps(jnp.zeros(2), jnp.ones(2)), jnp.zeros(2), loss_type="ipo", beta=5.0)


def test_chunked_logps_equal_whole_and_by_hand():
    """policy_logps over 4 chunks equals one chunk and a direct log-softmax; the log-prob of token
    t + 1 is read at position t, only where the mask marks token t + 1; padding columns are left out."""
    from olmax.config.model import ModelConfig
    from olmax.model.olmo3 import abstract_params, forward_hidden, lm_head

    cfg = ModelConfig(
        vocab_size=50,
        d_model=16,
        n_layers=2,
        n_heads=2,
        n_kv_heads=1,
        head_dim=8,
        mlp_hidden=32,
        compute_dtype="float32",
    )
    # numpy inputs: each eager JAX operation would be a compile of its own
    rng = np.random.default_rng(0)
    params = jax.tree.map(lambda a: rng.normal(0.5, 0.3, a.shape).astype(a.dtype), abstract_params(cfg))
    params["lm_head"][:, cfg.vocab_size :] = 3.0  # padding that would count if included
    ids = rng.integers(0, cfg.vocab_size, (4, 16), dtype=np.int32)
    mask = np.zeros((4, 16), bool)
    mask[:, 6:12] = True
    mask[1, 12:] = True

    @jax.jit  # the three in one program: one compile, not one each (nor one per operation)
    def whole_chunked_and_by_hand(params, ids, mask):
        whole, chunked = (dpo.policy_logps(params, ids, mask, cfg, chunk=c) for c in (0, 4))
        logp = jax.nn.log_softmax(
            lm_head(params, forward_hidden(params, ids, cfg), cfg)[..., : cfg.vocab_size], axis=-1
        )
        by_hand = jnp.sum(jnp.take_along_axis(logp[:, :-1], ids[:, 1:, None], -1)[..., 0] * mask[:, 1:], axis=1)
        return whole, chunked, by_hand

    whole, chunked, by_hand = whole_chunked_and_by_hand(params, ids, mask)
    np.testing.assert_allclose(whole.total, by_hand, rtol=1e-6)
    np.testing.assert_allclose(chunked.total, by_hand, rtol=1e-6)
    np.testing.assert_array_equal(whole.count, [6, 10, 6, 6])
    with pytest.raises(ValueError, match="loss_chunk=5 does not divide"):  # when traced, before any compile
        policy_logps(params, ids, mask, cfg, chunk=5)


# ----------------------------------------------------------------------------------------------
# Parity with TRL 1.16.0


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """(policy, reference) transformers models and their olmax (params, params, fp32 config)."""
    pytest.importorskip("trl")
    import torch
    from transformers import Olmo3ForCausalLM

    from olmax.checkpoint.store import load_params
    from olmax.convert.hf import convert_from_hf

    tmp = tmp_path_factory.mktemp("dpo_models")
    hf_cfg = make_hf_config(vocab=VOCAB, n_layers=2)  # one windowed layer, one global
    policy = Olmo3ForCausalLM(hf_cfg)
    randomize_(policy, 0)
    reference = Olmo3ForCausalLM(hf_cfg)
    reference.load_state_dict(policy.state_dict())
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in reference.parameters():
            p.mul_(1 + 0.02 * torch.randn(p.shape, generator=gen))
    olmax = []
    for name, model in (("policy", policy), ("reference", reference)):
        model.save_pretrained(tmp / name)
        convert_from_hf(str(tmp / name), tmp / f"{name}-olmax")
        params, cfg, _ = load_params(tmp / f"{name}-olmax")
        olmax.append(params)
    return policy, reference, olmax[0], olmax[1], dataclasses.replace(cfg, compute_dtype="float32")


def preference_rows() -> list[dict]:
    rng = np.random.default_rng(0)
    words = lambda n: "".join(f" t{i}" for i in rng.integers(0, VOCAB - 2, n))  # noqa: E731
    return [dict(prompt=words(p).strip(), chosen=words(c), rejected=words(r)) for p, c, r in LENGTHS]


def trl_trainer(policy, reference, loss_type: str, out_dir):
    """TRL's DPOTrainer over a fresh copy of `policy`, on CPU, fp32, torch AdamW at its defaults with a
    constant learning rate, no clipping, one batch of all rows per step."""
    from datasets import Dataset
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import Olmo3ForCausalLM, PreTrainedTokenizerFast
    from trl import DPOConfig, DPOTrainer

    words = {f"t{i}": i for i in range(VOCAB - 2)} | {"<|endoftext|>": VOCAB - 2, "<|pad|>": VOCAB - 1}
    tokenizer = Tokenizer(models.WordLevel(words, unk_token="t0"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<|endoftext|>", pad_token="<|pad|>")
    model = Olmo3ForCausalLM(policy.config)
    model.load_state_dict(policy.state_dict())
    args = DPOConfig(
        output_dir=str(out_dir),
        beta=BETA,
        loss_type=[TRL_LOSS[loss_type]],
        use_cpu=True,
        bf16=False,
        gradient_checkpointing=False,
        max_length=None,
        pad_to_multiple_of=8,  # rows of 24 tokens: 3 chunks of 8
        per_device_train_batch_size=len(LENGTHS),
        learning_rate=LR,
        lr_scheduler_type="constant",
        optim="adamw_torch",
        max_grad_norm=0.0,
        max_steps=STEPS,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        seed=0,
        logging_steps=1,  # each step's loss, to show it unsaturated
    )
    dataset = Dataset.from_list(preference_rows())
    return DPOTrainer(model=model, ref_model=reference, args=args, train_dataset=dataset, processing_class=tokenizer)


def olmax_batch(batch) -> tuple[jnp.ndarray, jnp.ndarray]:
    return jnp.asarray(batch["input_ids"].numpy()), jnp.asarray(batch["completion_mask"].numpy().astype(bool))


def tolerances(policy: dpo.SequenceLogps, loss_type: str) -> tuple[np.ndarray, np.ndarray, float]:
    """(per row: a reward's, per pair: a loss's or margin's, a gradient's relative to its largest entry).

    `dpo_norm`: TOL, TOL, TOL. `dpo` sums ~10 tokens of ~8 nats each, and two fp32 forwards differ by up
    to ~3e-6 nats per token, so a summed reward is allowed TOL per token it sums, a pair TOL per token of
    its two rows, and a gradient TOL plus the largest pair's allowance (each pair's weight in the
    gradient, beta sigmoid(-beta margin), is off by at most the margin's error)."""
    pairs = policy.count.shape[0] // 2
    if loss_type == "dpo_norm":
        return np.full(2 * pairs, TOL), np.full(pairs, TOL), TOL
    rows = TOL * np.asarray(policy.count)
    pair = rows[:pairs] + rows[pairs:]
    return rows, pair, TOL + float(pair.max())


def hf_layout(tree, cfg) -> dict[str, np.ndarray]:
    """An olmax parameter-shaped tree under transformers' names and layouts, the vocabulary padding dropped."""
    from olmax.convert.hf import HF_NAMES
    from olmax.convert.tensors import torch_tensors

    return dict(torch_tensors(tree, cfg, HF_NAMES, "float32"))


@pytest.mark.parity
@pytest.mark.parametrize("loss_type", list(TRL_LOSS))
def test_per_pair_loss_and_rewards_match_trl(models, loss_type, tmp_path):
    """Each pair through TRL's `compute_loss` alone (its loss and logged rewards are then that pair's),
    against olmax's per-pair terms of the whole batch. TRL logs rewards over summed log-probs for both
    losses; olmax's `dpo_norm` rewards are over averaged ones (open-instruct's), so TRL's are divided by
    the response's token count from TRL's own mask."""
    import torch

    policy, reference, params, ref_params, cfg = models
    trainer = trl_trainer(policy, reference, loss_type, tmp_path)
    examples = [trainer.train_dataset[i] for i in range(len(LENGTHS))]
    want = {"loss": [], "chosen": [], "rejected": []}
    for example in examples:
        batch = trainer.data_collator([example])
        with torch.no_grad():
            want["loss"].append(trainer.compute_loss(trainer.model, batch).item())
        counts = batch["completion_mask"].sum(dim=1).numpy() if loss_type == "dpo_norm" else np.ones(2)
        want["chosen"].append(trainer._metrics["train"]["rewards/chosen"][-1] / counts[0])
        want["rejected"].append(trainer._metrics["train"]["rewards/rejected"][-1] / counts[1])

    ids, mask = olmax_batch(trainer.data_collator(examples))
    policy = policy_logps(params, ids, mask, cfg, chunk=0)
    terms = dpo.pair_terms(policy, reference_logps(ref_params, ids, mask, cfg, chunk=0), loss_type=loss_type, beta=BETA)
    row_tol, pair_tol, _ = tolerances(policy, loss_type)
    chosen_tol, rejected_tol = row_tol[: len(LENGTHS)], row_tol[len(LENGTHS) :]
    assert np.all(np.abs(np.asarray(terms.losses) - want["loss"]) <= pair_tol), want["loss"]
    assert np.all(np.abs(np.asarray(terms.chosen_rewards) - want["chosen"]) <= chosen_tol)
    assert np.all(np.abs(np.asarray(terms.rejected_rewards) - want["rejected"]) <= rejected_tol)
    assert 0.01 < min(want["loss"]) and max(want["loss"]) < 2.0  # neither saturated nor degenerate
    metrics = {k: float(v) / len(LENGTHS) for k, v in dpo.metric_sums(terms).items()}
    chosen, rejected = np.array(want["chosen"]), np.array(want["rejected"])
    assert metrics["rewards/accuracy"] == np.mean(chosen > rejected)
    assert abs(metrics["rewards/margins"] - np.mean(chosen - rejected)) <= np.mean(pair_tol)


@pytest.mark.parity
@pytest.mark.parametrize("loss_type", list(TRL_LOSS))
def test_gradients_and_five_adamw_steps_match_trl(models, loss_type, tmp_path):
    """TRL's `compute_loss` on the whole batch, backward, against jax.grad of olmax's `dpo_loss` divided
    by the pair count, in chunks of 8 positions: the loss, the logged metrics, and every parameter's
    gradient (relative to each tensor's largest entry; the vocabulary padding's gradient exactly 0).
    Then TRL's own `train` for 5 steps (torch AdamW: betas 0.9/0.999, eps 1e-8, weight decay 0,
    constant lr 1e-5, no clipping) against 5 steps of optax.adamw: every parameter within
    `adam_allowance` of TRL's, TRL's loss unsaturated at every step, and every tensor moved by Adam's
    steps, not by rounding (every step sees all rows, so the order TRL shuffles them in does not matter)."""
    import optax

    policy, reference, params, ref_params, cfg = models
    trainer = trl_trainer(policy, reference, loss_type, tmp_path)
    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(len(LENGTHS))])
    loss = trainer.compute_loss(trainer.model, batch)
    loss.backward()
    want = {name: p.grad.numpy() for name, p in trainer.model.named_parameters()}
    logged = {k: v[-1] for k, v in trainer._metrics["train"].items()}
    trainer.model.zero_grad()
    trainer.train()
    want_trained = {name: p.detach().numpy() for name, p in trainer.model.named_parameters()}

    ids, mask = olmax_batch(batch)
    reference = reference_logps(ref_params, ids, mask, cfg, chunk=0)
    pairs = len(LENGTHS)

    @jax.jit
    def loss_and_grads(params):
        def mean_loss(params):
            total, sums = dpo.dpo_loss(params, ids, mask, reference, cfg, loss_type=loss_type, chunk=8)
            return total / pairs, {k: v / pairs for k, v in sums.items()}

        return jax.value_and_grad(mean_loss, has_aux=True)(params)

    (value, metrics), grads = loss_and_grads(params)
    _, pair_tol, grad_tol = tolerances(dpo.SequenceLogps(*policy_logps(params, ids, mask, cfg, chunk=0)), loss_type)
    pair_tol = np.mean(pair_tol)
    assert abs(float(value) - loss.item()) <= pair_tol
    if loss_type == "dpo":  # TRL logs the rewards of `dpo` (summed log-probs) for both losses
        assert float(metrics["rewards/accuracy"]) == logged["rewards/accuracies"]
        assert abs(float(metrics["rewards/margins"]) - logged["rewards/margins"]) <= pair_tol
    for name, got in hf_layout(grads, cfg).items():
        scale = np.abs(want[name]).max()
        assert np.abs(got - want[name]).max() <= grad_tol * scale, (name, np.abs(got - want[name]).max(), scale)
    assert not np.any(np.asarray(grads["lm_head"])[:, cfg.vocab_size :])
    assert not np.any(np.asarray(grads["embed"])[cfg.vocab_size :])

    opt = optax.adamw(LR, b1=0.9, b2=0.999, eps=1e-8, weight_decay=0.0)

    @jax.jit  # the update and its application in one program, not one per leaf
    def adam_step(trained, grads, state):
        updates, state = opt.update(grads, state, trained)
        return optax.apply_updates(trained, updates), state

    trained, state = params, jax.jit(opt.init)(params)
    for _ in range(STEPS):
        trained, state = adam_step(trained, loss_and_grads(trained)[1], state)
    start = hf_layout(params, cfg)
    assert min(h["loss"] for h in trainer.state.log_history if "loss" in h) > 1e-3  # unsaturated throughout
    for name, got in hf_layout(trained, cfg).items():
        allowed = adam_allowance(want[name], grad_tol, want_trained[name])
        assert np.all(np.abs(got - want_trained[name]) <= allowed), (name, np.max(np.abs(got - want_trained[name])))
        assert np.abs(want_trained[name] - start[name]).max() > LR * STEPS / 2, name  # moved by Adam's steps


def adam_allowance(grad: np.ndarray, grad_tol: float, trained: np.ndarray) -> np.ndarray:
    """Per parameter: how far two float32 runs of STEPS AdamW steps may end apart, given the gradient at
    the start (TRL's) and the gradients' agreement (within grad_tol of the tensor's largest entry, as the
    test checks at the start). Adam moves a parameter by about lr a step whatever its gradient's size,
    so where the gradient is within that agreement of zero the two runs may step in opposite directions,
    2 lr apart a step; elsewhere a gradient known to a relative delta / |g| fixes the step to that
    relative error. Each step also rounds the parameter once on each side (an ulp)."""
    magnitude = np.abs(grad)
    delta = grad_tol * magnitude.max()
    relative = np.minimum(1.0, delta / np.maximum(magnitude, np.finfo(np.float32).tiny))
    return 2 * LR * STEPS * relative + STEPS * np.finfo(np.float32).eps * np.abs(trained)
