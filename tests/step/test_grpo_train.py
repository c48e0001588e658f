"""trainer.objective=grpo in the jitted, sharded train step: the step's loss, metrics, gradient norm and
parameters after one step equal `objectives.grpo.grpo_loss` over the whole batch (one token-mean group
per device micro-batch, open-instruct's aggregation) and one AdamW step applied by hand, in fp32, on a
dp=2 x fsdp=4 mesh of the 8 simulated CPU devices in two accumulation steps with old log-probs and TIS
(slow: one device in two accumulation steps, Think's TIS without old log-probs, Instruct's old log-probs
without TIS); make_policy_logps (the loop's old log-probs) against policy_token_logps; the batches and
configs it refuses; the RL recipes' numbers; and tiny_grpo's step compiled by olmax.fit.compiler.compile_step."""

import functools
import re
from dataclasses import replace

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from models import ONE_STEP_ADAMW, STEP_MODEL, one_train_step

from olmax.config.data import DataConfig
from olmax.config.experiment import ExperimentConfig
from olmax.config.grpo import GRPOConfig
from olmax.config.io import apply_overrides
from olmax.config.mesh import MeshConfig
from olmax.config.recipes import get_recipe
from olmax.config.schedule import ScheduleConfig
from olmax.config.trainer import TrainerConfig
from olmax.errors import ConfigError
from olmax.fit.compiler import compile_step
from olmax.model.attention import segment_ids
from olmax.model.olmo3 import init_params
from olmax.model.sharding import make_mesh
from olmax.objectives import grpo
from olmax.objectives.logps import policy_token_logps, scored_tokens
from olmax.rollout import groups
from olmax.rollout.policy_logps import make_policy_logps
from olmax.step.state import init_train_state, optimizer, state_shardings
from olmax.step.train_step import abstract_batch, batch_sharding, make_train_step

ROWS, SEQ = 16, 16
BASE = ExperimentConfig(
    name="grpo-step-test",
    # open-instruct restarts positions at every packed sequence
    model=replace(STEP_MODEL, rope_positions="document"),
    data=DataConfig(seq_len=SEQ, doc_masking=True),
    optimizer=ONE_STEP_ADAMW,
    schedule=ScheduleConfig(name="constant", warmup_steps=0),
    trainer=TrainerConfig(global_batch=ROWS, max_steps=10, objective="grpo", loss_chunk=8),
    grpo=GRPOConfig(max_prompt_len=4, max_response_len=8),
)
THINK = GRPOConfig(max_prompt_len=4, max_response_len=8, tis_cap=2.0)  # old log-probs: the step's own
INSTRUCT = GRPOConfig(max_prompt_len=4, max_response_len=8, mini_batches=4)  # old log-probs given, no TIS
BOTH = replace(INSTRUCT, tis_cap=2.0)  # every input the loss takes: old and sampler log-probs


def _rows():
    """Packed rows as open-instruct's pack_sequences makes them: one or two prompt + response sequences
    per row, then padding; responses of 8 tokens in the first rows down to 1 in the last, so the token
    mean of a micro-batch (a row, or half the batch) differs from the batch's."""
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 250, (ROWS, SEQ), dtype=np.int32)
    mask = np.zeros((ROWS, SEQ), bool)
    response_index = np.zeros((ROWS, SEQ), np.int32)
    doc_lens = np.zeros((ROWS, SEQ), np.int32)
    n = 0
    for b in range(ROWS):
        lens, at = [], 0
        for prompt, response in [(2 + b % 3, 8 - b // 2)] + ([(2, 3)] if b % 2 else []):
            mask[b, at + prompt : at + prompt + response] = True
            response_index[b, at + prompt : at + prompt + response] = n + 1
            n, at = n + 1, at + prompt + response
            lens.append(prompt + response)
        ids[b, at:] = 0
        lens.append(SEQ - at)  # the padding: a segment of its own, as the loader's doc_lens
        doc_lens[b, : len(lens)] = lens
    rewards = rng.choice([0.0, 10.0], n)
    per_token = groups.token_values(jnp.asarray(rewards - rewards.mean()) * rng.uniform(0.5, 2.0, n), response_index)
    return {
        "input_ids": ids,
        "response_mask": mask,
        "advantages": np.asarray(per_token),
        "doc_lens": doc_lens,
    }


@functools.cache
def _params():
    return jax.device_get(jax.jit(init_params, static_argnums=0)(BASE.model, jax.random.key(0)))


def _batch(rl: GRPOConfig):
    """Old log-probs (several mini-batches) 0.3 nats off the policy's, so ratios clip on both sides; the
    sampler's (TIS) 0.6 nats off, NaN on prompt tokens as open-instruct's. The freshly initialised policy
    is near uniform over the 250 tokens (logits ~1e-2): its log-probs are -log(250) to within ~0.05."""
    batch = _rows()
    rng = np.random.default_rng(1)

    def near(nats):
        return (-np.log(250.0) + nats * rng.normal(size=(ROWS, SEQ))).astype(np.float32)

    if rl.mini_batches > 1:
        batch["old_logps"] = near(0.3)
    if rl.tis_cap:
        batch["sampler_logps"] = np.where(batch["response_mask"], near(0.6), np.nan).astype(np.float32)
    return _params(), batch


@functools.cache
def _direct(rl: GRPOConfig, micro_batch_rows: int):
    """grpo_loss over the whole batch (one token-mean group per micro_batch_rows rows: one device's
    micro-batch), its gradient and one AdamW step; also the batch's plain token mean of the loss."""
    params, batch = _batch(rl)
    cfg = replace(BASE, grpo=rl)
    segments = segment_ids(batch["doc_lens"])

    def loss_of(params, rows):
        return grpo.grpo_loss(
            params,
            batch["input_ids"],
            batch["response_mask"],
            batch["advantages"],
            cfg.model,
            old_logps=batch.get("old_logps"),
            sampler_logps=batch.get("sampler_logps"),
            segments=segments,
            settings=grpo.LossSettings.of(rl),
            micro_batch_rows=rows,
        )

    def one_step(params):
        (loss, metrics), grads = jax.value_and_grad(loss_of, has_aux=True)(params, micro_batch_rows)
        opt = optimizer(cfg)
        after, _, stats = opt.step(grads, opt.init(params), params, lr=cfg.optimizer.lr, loss=loss)
        return after, {"loss": loss, "grad_norm": stats.grad_norm, **metrics}, loss_of(params, ROWS)[0]

    after, metrics, global_mean = jax.device_get(jax.jit(one_step)(params))
    return params, batch, metrics, after, float(global_mean)


# name: (mesh, micro_batch_size, devices, GRPO settings); micro-batch rows per device = ROWS / shards / accum
LAYOUTS = {
    # 16 rows on 8 batch shards in two accumulation steps: sharding, accumulation, TIS and clipping at once
    "dp2xfsdp4-accum2-both": (MeshConfig(data=2, fsdp=4), 1, 8, BOTH),
    # slow: the same code with one device (a layout of one shard, 8 rows per micro-batch) or with one of
    # the two log-prob inputs left out (a None the step passes through); dp2xfsdp4-accum2-both holds the claim
    "one-device-accum2-think": (MeshConfig(data=1, fsdp=1), ROWS // 2, 1, THINK),
    "one-device-accum2-instruct": (MeshConfig(data=1, fsdp=1), ROWS // 2, 1, INSTRUCT),
    "dp2xfsdp4-accum2-think": (MeshConfig(data=2, fsdp=4), 1, 8, THINK),
}


@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=pytest.mark.slow) if i >= 1 else n for i, n in enumerate(LAYOUTS)]
)
def test_step_equals_grpo_loss(name):
    mesh, micro, n_devices, rl = LAYOUTS[name]
    cfg = replace(BASE, mesh=mesh, trainer=replace(BASE.trainer, micro_batch_size=micro), grpo=rl)
    shards = mesh.data * mesh.fsdp
    micro_rows = micro or ROWS // shards
    assert ROWS // shards // micro_rows == 2  # two accumulation steps
    params, batch, expected, after, global_mean = _direct(rl, micro_rows)
    stepped, metrics = one_train_step(cfg, n_devices, params, batch)
    for key in ("loss", "grad_norm", *grpo.GRPO_METRICS):
        assert metrics[key] == pytest.approx(float(expected[key]), rel=1e-5, abs=1e-6), key
    # open-instruct's aggregation: a token mean per device micro-batch, not over the whole batch
    assert abs(metrics["loss"] - global_mean) > 100 * 1e-5 * abs(global_mean)
    scored = int(scored_tokens(batch["response_mask"]).sum())
    assert metrics["response_tokens"] == scored and metrics["tokens"] == ROWS * SEQ
    assert metrics["skipped"] == 0.0 and metrics["lr"] == 1.0
    # the checks are not vacuous: weights truncated with TIS; ratios clipped with old log-probs given,
    # never without them (old = the policy itself: r = 1)
    if rl.tis_cap:
        assert 0.0 < metrics["tis/truncated_frac"] and metrics["tis/weight_max"] == 2.0
    if rl.mini_batches > 1:
        assert metrics["policy/clipfrac_low"] > 0.0 and metrics["policy/clipfrac_high"] > 0.0
    else:
        assert metrics["policy/clipfrac_avg"] == 0.0
    for (path, a), b, p in zip(
        jax.tree_util.tree_leaves_with_path(after), jax.tree.leaves(stepped), jax.tree.leaves(params)
    ):
        # each tensor's update, relative to its largest entry, plus the rounding of the parameter itself
        update, expected_update = b - p, a - p
        bound = 1e-5 * np.abs(expected_update).max() + 2 * np.finfo(np.float32).eps * np.abs(p).max()
        np.testing.assert_allclose(update, expected_update, rtol=0, atol=bound, err_msg=jax.tree_util.keystr(path))


def test_policy_logps_are_the_steps_forward():
    """make_policy_logps, the old log-probs the loop computes before a rollout's first update, on dp2 x
    fsdp4 in two micro-batches = grpo.policy_token_logps over the whole batch, rows in the batch's order."""
    cfg = replace(BASE, mesh=MeshConfig(data=2, fsdp=4), trainer=replace(BASE.trainer, micro_batch_size=1))
    params, batch = _batch(INSTRUCT)
    mesh = make_mesh(cfg.mesh, jax.devices()[:8])
    with jax.set_mesh(mesh):
        placed = jax.device_put(params, state_shardings(cfg, mesh).params)
        got = make_policy_logps(cfg, mesh)(placed, {k: batch[k] for k in ("input_ids", "doc_lens")})
    assert got.sharding == batch_sharding(cfg, mesh)
    segments = segment_ids(batch["doc_lens"])
    temperature = cfg.grpo.temperature
    want = jax.jit(
        lambda p: policy_token_logps(
            p, batch["input_ids"], cfg.model, segments=segments, chunk=8, temperature=temperature
        )
    )
    np.testing.assert_allclose(np.asarray(got), np.asarray(want(params)), rtol=0, atol=1e-6)


def test_batch_errors_name_the_key():
    cfg = replace(BASE, grpo=THINK)
    params, batch = _batch(THINK)
    mesh = make_mesh(cfg.mesh, jax.devices()[:8])
    with jax.set_mesh(mesh):
        step = make_train_step(cfg, mesh)
        state = init_train_state(cfg, mesh, jax.random.key(0), params=params)
        for bad, message in [
            ({k: v for k, v in batch.items() if k != "sampler_logps"}, "no 'sampler_logps'"),
            ({k: v for k, v in batch.items() if k != "doc_lens"}, "no 'doc_lens'"),
            ({**batch, "old_logp": batch["doc_lens"]}, "unknown batch key 'old_logp'"),
            ({**batch, "advantages": batch["advantages"][:, :8]}, r"batch\['advantages'\] has shape \(16, 8\)"),
        ]:
            with pytest.raises(ValueError, match=message):
                step.lower(state, bad)


@pytest.mark.parametrize(
    "override, message",
    [
        ("trainer.objective=rl", "trainer.objective='rl' is not one of lm, dpo, grpo"),
        ("grpo.clip_low=1.0", "grpo.clip_low must be in [0, 1)"),
        ("grpo.samples_per_prompt=1", "grpo.samples_per_prompt must be at least 2"),
        ("grpo.no_resampling_pass_rate=0", "grpo.no_resampling_pass_rate must be in (0, 1]"),
        ("grpo.max_response_len=16", "grpo.max_prompt_len + grpo.max_response_len = 20 does not fit data.seq_len=16"),
        ("optimizer.z_loss=1e-5", "trainer.objective=grpo does not take optimizer.z_loss=1e-05"),
        ("data.instance_filter=true", "trainer.objective=grpo does not take data.instance_filter=true"),
        ("mesh.context=2", "trainer.objective=grpo does not take mesh.context=2"),
    ],
)
def test_bad_grpo_configs_name_the_knob(override, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        apply_overrides(BASE, [override])


def test_active_sampling_needs_the_filter():
    with pytest.raises(ConfigError, match="grpo.active_sampling refills"):
        GRPOConfig(active_sampling=True, filter_zero_spread=False)


@pytest.mark.parametrize(
    "name, layers, seq, response, tis, minis, active, stop, pass_rate, lr, steps",
    [
        ("olmo3_7b_think_rl", 32, 35_840, 32_768, 2.0, 1, False, (), None, 1e-6, 19_531),
        ("olmo3_7b_instruct_rl", 32, 11_264, 8_192, 0.0, 4, True, ("</answer>",), 0.875, 1e-6, 8_000),
        ("olmo3_32b_think_rl", 64, 35_840, 32_768, 2.0, 1, True, (), None, 2e-6, 19_531),
        ("olmo3_32b_instruct_rl", 64, 19_456, 16_384, 2.0, 1, True, (), None, 2e-6, 19_531),
    ],
)
def test_rl_recipes(name, layers, seq, response, tis, minis, active, stop, pass_rate, lr, steps):
    """open-instruct scripts/train/olmo3/{7b,32b}_{think,instruct}_rl.sh (docs/post-training/rl-recipes.md, "GRPO")."""
    cfg = get_recipe(name)
    rl = cfg.grpo
    assert cfg.trainer.objective == "grpo" and cfg.data.seq_len == seq and cfg.data.doc_masking
    assert cfg.model.n_layers == layers and cfg.trainer.max_steps == steps
    assert cfg.trainer.global_batch == 512 // minis
    assert (rl.prompts_per_step, rl.samples_per_prompt) == (64, 8)
    assert (rl.max_prompt_len, rl.max_response_len) == (2048, response)
    assert (rl.temperature, rl.clip_low, rl.clip_high, rl.beta, rl.normalise_std) == (1.0, 0.2, 0.272, 0.0, False)
    assert (rl.tis_cap, rl.mini_batches, rl.active_sampling, rl.stop) == (tis, minis, active, stop)
    assert rl.no_resampling_pass_rate == pass_rate
    opt = cfg.optimizer
    assert (opt.lr, opt.b1, opt.b2, opt.eps, opt.weight_decay, opt.max_grad_norm) == (lr, 0.9, 0.999, 1e-8, 0.0, 1.0)
    assert not opt.skip_step and cfg.schedule.name == "constant" and cfg.schedule.warmup_steps == 0
    assert cfg.model.rope_type == "yarn" and cfg.model.rope_positions == "document"
    # splash's tiles divide the packed row (35,840, 19,456 and 11,264 are multiples of 1024, not of 2048)
    cfg.model.splash_blocks.tiles(seq)


def test_tiny_grpo_compiles_on_8_devices():
    """compile_step builds the GRPO batch (the objective's fields, placed as the step places them): tiny_grpo
    with TIS, a KL term and 4 mini-batches, so every log-prob array of the batch is in it. Shrunk to one layer
    and rows of 32 (the batch's keys and placement do not depend on the sizes): the compile is the test's cost."""
    overrides = ["grpo.tis_cap=2.0", "grpo.beta=0.05", "grpo.mini_batches=4", "model.n_layers=1"]
    overrides += ["trainer.global_batch=8", "data.seq_len=32", "grpo.max_prompt_len=8", "grpo.max_response_len=8"]
    cfg = apply_overrides(get_recipe("tiny_grpo"), overrides)
    mesh = make_mesh(cfg.mesh, jax.devices()[:8])
    placed = batch_sharding(cfg, mesh)  # rows over data x fsdp, as the LM batch
    batch = abstract_batch(cfg, mesh)
    assert set(batch) == {*grpo.BATCH_KEYS, "doc_lens"}
    shape = (cfg.trainer.global_batch, cfg.data.seq_len)
    assert all(b.shape == shape and b.sharding == placed for b in batch.values())
    compiled = compile_step(cfg, mesh, {}, "8 cpu devices").compiled
    assert compiled.memory_analysis().argument_size_in_bytes > 0
