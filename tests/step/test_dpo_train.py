"""trainer.objective=dpo in the jitted, sharded train step: the step's loss, metrics, gradients and
parameters after one step equal `objectives.dpo.dpo_loss` called directly on the same pairs (chosen
block then rejected block), in fp32, on a dp=2 x fsdp=2 mesh of the simulated CPU devices in two
accumulation steps (slow: one device in two, dp=2 x fsdp=4 in one); and the configs it refuses."""

import functools
from dataclasses import asdict, replace

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from models import ONE_STEP_ADAMW, STEP_MODEL, one_train_step

from olmax.checkpoint.store import config_changes
from olmax.config.data import DataConfig
from olmax.config.dpo import DPOConfig
from olmax.config.experiment import ExperimentConfig
from olmax.config.io import apply_overrides
from olmax.config.mesh import MeshConfig
from olmax.config.recipes import get_recipe
from olmax.config.schedule import ScheduleConfig
from olmax.config.trainer import TrainerConfig
from olmax.errors import ConfigError
from olmax.model.olmo3 import init_params
from olmax.model.sharding import make_mesh
from olmax.objectives import dpo
from olmax.step.state import optimizer
from olmax.step.train_step import batch_layout

PAIRS, SEQ = 8, 16
BASE = ExperimentConfig(
    name="dpo-step-test",
    model=STEP_MODEL,
    data=DataConfig(seq_len=SEQ),
    optimizer=ONE_STEP_ADAMW,  # equal parameters after one step = equal gradients
    schedule=ScheduleConfig(name="constant", warmup_steps=0),
    trainer=TrainerConfig(global_batch=PAIRS, max_steps=10, objective="dpo", loss_chunk=8),
    dpo=DPOConfig(loss_type="dpo_norm", beta=5.0),
)


def _pairs():
    """(P, 2, seq) pairs: a shared prompt, responses of different lengths, right padding."""
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 250, (PAIRS, 2, SEQ), dtype=np.int32)
    mask = np.zeros((PAIRS, 2, SEQ), bool)
    for i in range(PAIRS):
        prompt = 3 + i % 4
        ids[i, 1, :prompt] = ids[i, 0, :prompt]
        for side in range(2):
            end = SEQ - (i + 3 * side) % 6
            mask[i, side, prompt:end] = True
            ids[i, side, end:] = 0
    reference = rng.normal(-40.0, 5.0, (PAIRS, 2)).astype(np.float32)
    return {"input_ids": ids, "response_mask": mask, "reference_logps": reference}


@functools.cache
def _direct(loss_type: str):
    """dpo_loss on the chosen-block-then-rejected-block rows, its gradient and one optimizer step."""
    params = jax.device_get(jax.jit(init_params, static_argnums=0)(BASE.model, jax.random.key(0)))
    batch = _pairs()

    def blocks(x):
        return jnp.concatenate([x[:, 0], x[:, 1]])

    def mean_loss(params):
        total, sums = dpo.dpo_loss(
            params,
            blocks(batch["input_ids"]),
            blocks(batch["response_mask"]),
            blocks(batch["reference_logps"]),
            BASE.model,
            loss_type=loss_type,
            beta=BASE.dpo.beta,
        )
        return total / PAIRS, {k: v / PAIRS for k, v in sums.items()}

    def one_step(params):
        (loss, metrics), grads = jax.value_and_grad(mean_loss, has_aux=True)(params)
        opt = optimizer(BASE)
        after, _, stats = opt.step(grads, opt.init(params), params, lr=BASE.optimizer.lr, loss=loss)
        return after, {"loss": loss, "grad_norm": stats.grad_norm, **metrics}

    after, metrics = jax.device_get(jax.jit(one_step)(params))
    return params, batch, metrics, after


LAYOUTS = {
    # 8 pairs on 4 batch shards in two accumulation steps: sharding and accumulation in one compile
    "dp2xfsdp2-accum2": (MeshConfig(data=2, fsdp=2), 1, 4, "dpo_norm"),
    # slow: each alone (one device in two accumulation steps, 8 shards in one), and the summed log-probs
    # (loss_type dpo) through the same path
    "one-device-accum2": (MeshConfig(data=1, fsdp=1), PAIRS // 2, 1, "dpo_norm"),
    "dp2xfsdp4": (MeshConfig(data=2, fsdp=4), None, 8, "dpo_norm"),
    "dp2xfsdp4-dpo": (MeshConfig(data=2, fsdp=4), None, 8, "dpo"),
}


@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=pytest.mark.slow) if i >= 1 else n for i, n in enumerate(LAYOUTS)]
)
def test_step_equals_dpo_loss(name):
    mesh, micro, n_devices, loss_type = LAYOUTS[name]
    cfg = replace(BASE, mesh=mesh, trainer=replace(BASE.trainer, micro_batch_size=micro), dpo=DPOConfig(loss_type))
    accum = batch_layout(cfg, make_mesh(mesh, jax.devices()[:n_devices])).accum_steps
    assert accum == (2 if "accum2" in name else 1)
    params, batch, expected, after = _direct(loss_type)
    stepped, metrics = one_train_step(cfg, n_devices, params, batch)
    # rewards are beta x (log-prob ratios of ~10 nats): their fp32 sums differ by ~1e-6 with the order
    scale = 1.0 + abs(float(expected["rewards/chosen"])) + abs(float(expected["rewards/rejected"]))
    for key in ("loss", "grad_norm", *dpo.METRICS):
        assert metrics[key] == pytest.approx(float(expected[key]), rel=1e-5, abs=1e-6 * scale), key
    assert metrics["tokens"] == 2 * PAIRS * SEQ and metrics["skipped"] == 0.0 and metrics["lr"] == 1.0
    assert 0.0 < metrics["rewards/accuracy"] < 1.0  # both kinds of pairs: the metric is not trivially right
    for (path, a), b, p in zip(
        jax.tree_util.tree_leaves_with_path(after), jax.tree.leaves(stepped), jax.tree.leaves(params)
    ):
        # each tensor's update, relative to its largest entry, plus the rounding of the parameter itself
        update, expected_update = b - p, a - p
        bound = 1e-5 * np.abs(expected_update).max() + 2 * np.finfo(np.float32).eps * np.abs(p).max()
        np.testing.assert_allclose(update, expected_update, rtol=0, atol=bound, err_msg=jax.tree_util.keystr(path))


@pytest.mark.parametrize(
    "override, message",
    [
        ("trainer.objective=rl", "trainer.objective='rl' is not one of lm, dpo"),
        ("dpo.loss_type=ipo", "dpo.loss_type='ipo' is not one of dpo_norm, dpo"),
        ("dpo.beta=0", "dpo.beta must be positive"),
        ("data.doc_masking=true", "trainer.objective=dpo does not take data.doc_masking=true"),
        ("optimizer.z_loss=1e-5", "trainer.objective=dpo does not take optimizer.z_loss=1e-05"),
        ("mesh.context=2", "trainer.objective=dpo does not take mesh.context=2"),
    ],
)
def test_bad_dpo_configs_name_the_knob(override, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(".", r"\.")):
        apply_overrides(BASE, [override])


def test_packing_is_refused():
    with pytest.raises(ConfigError, match="does not take data.packing=obfd"):
        replace(BASE, data=DataConfig(seq_len=SEQ, packing="obfd"))


@pytest.mark.parametrize(
    "name, lr, seq_len, layers",
    [
        ("olmo3_7b_think_dpo", 8e-8, 16384, 32),
        ("olmo3_7b_instruct_dpo", 1e-6, 16384, 32),
        ("olmo3_32b_think_dpo", 8e-8, 8192, 64),
        ("olmo3_32b_instruct_dpo", 1e-6, 8192, 64),
    ],
)
def test_dpo_recipes(name, lr, seq_len, layers):
    """AI2's OLMo 3 DPO settings (docs/post-training/dpo.md, "DPO in `olmax train`", "Recipes")."""
    cfg = get_recipe(name)
    assert cfg.trainer.objective == "dpo" and cfg.dpo == DPOConfig(loss_type="dpo_norm", beta=5.0)
    assert (cfg.optimizer.lr, cfg.optimizer.b1, cfg.optimizer.b2, cfg.optimizer.eps) == (lr, 0.9, 0.999, 1e-8)
    assert cfg.optimizer.weight_decay == 0.0 and not cfg.optimizer.skip_step
    assert (cfg.schedule.name, cfg.schedule.warmup_fraction, cfg.schedule.alpha_f) == ("linear", 0.1, 0.0)
    assert cfg.schedule.t_max_epochs == 1 and cfg.data.seq_len == seq_len and cfg.trainer.global_batch == 128
    assert cfg.model.rope_type == "yarn" and cfg.model.n_layers == layers  # the SFT model's (long-context)


def test_a_resume_may_not_change_the_objective():
    saved = asdict(replace(BASE, trainer=replace(BASE.trainer, objective="lm")))
    assert config_changes(saved, BASE) == ["trainer.objective lm -> dpo"]
    del saved["trainer"]["objective"]  # a checkpoint written before DPO: an LM run
    assert config_changes(saved, BASE) == ["trainer.objective lm -> dpo"]
