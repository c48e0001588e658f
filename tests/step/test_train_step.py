"""The sharded train step on 8 fake CPU devices: the same losses (fp32, 1e-6 relative) whether the
global batch of 8 runs on 1 device in 8 accumulation steps or on 2x2x2 DP x FSDP x TP devices with 2
accumulation steps and the chunked output layer (slow: 8-way DP, 8-way FSDP, 2x4 DP x FSDP, 2x2x2
without accumulation, 2x2 with accumulation and the chunked output layer).

The batches carry what makes micro-batches unequal: pad tokens with pad masking on, and instances
removed by an instance mask. Only normalising by the label count of the WHOLE global batch keeps
the layouts equal."""

from dataclasses import replace
from functools import lru_cache

import jax
import numpy as np
import pytest
from models import STEP_MODEL

from olmax.config.data import DataConfig
from olmax.config.experiment import ExperimentConfig
from olmax.config.mesh import MeshConfig
from olmax.config.optimizer import OptimizerConfig
from olmax.config.schedule import ScheduleConfig
from olmax.config.trainer import TrainerConfig
from olmax.errors import ConfigError
from olmax.model.olmo3 import init_params
from olmax.model.sharding import make_mesh
from olmax.step.schedules import make_schedule
from olmax.step.state import init_train_state, state_shardings
from olmax.step.train_step import batch_layout, batch_sharding, make_train_step

N_STEPS = 3
PAD = 3
BASE = ExperimentConfig(
    name="train-step-test",
    model=STEP_MODEL,
    data=DataConfig(seq_len=16, pad_token_id=PAD, mask_pad_token=True),
    optimizer=OptimizerConfig(lr=3e-3),
    schedule=ScheduleConfig(warmup_steps=2),
    trainer=TrainerConfig(global_batch=8, max_steps=20),
)


def _batches():
    rng = np.random.default_rng(0)
    ids = [rng.integers(0, 250, (8, 16), dtype=np.int32) for _ in range(N_STEPS)]
    ids[1][:3, 9:] = PAD  # padded tails in the first micro-batches only
    masks = [np.ones(8, bool), np.array([True, False] + [True] * 6), np.array([True] * 7 + [False])]
    return [{"input_ids": i, "instance_mask": m} for i, m in zip(ids, masks)]


@lru_cache(maxsize=1)
def _initial_params():
    return jax.device_get(jax.jit(init_params, static_argnums=0)(BASE.model, jax.random.key(0)))


def _run(cfg, n_devices, batches=None):
    """Train on the batches; checks on the way that every step donates the state and keeps its layout."""
    mesh = make_mesh(cfg.mesh, jax.devices()[:n_devices])
    history = []
    with jax.set_mesh(mesh):  # as olmax.trainer.run runs it: activation constraints and per-shard kernels apply
        state = init_train_state(cfg, mesh, jax.random.key(0), params=_initial_params())
        step = make_train_step(cfg, mesh)
        for batch in batches or _batches():
            batch = dict(batch, input_ids=jax.device_put(batch["input_ids"], batch_sharding(cfg, mesh)))
            old_embed = state.params["embed"]
            state, metrics = step(state, batch)
            assert old_embed.is_deleted()
            history.append({k: float(v) for k, v in metrics.items()})
    for array, sharding in zip(jax.tree.leaves(state), jax.tree.leaves(state_shardings(cfg, mesh))):
        assert array.sharding.is_equivalent_to(sharding, array.ndim)
    return state, history


def _layout(mesh: MeshConfig, micro=None, loss_chunk=0):
    return replace(BASE, mesh=mesh, trainer=replace(BASE.trainer, micro_batch_size=micro, loss_chunk=loss_chunk))


@pytest.fixture(scope="module")
def reference():
    """One device, 8 accumulation steps of one instance, full logits."""
    cfg = _layout(MeshConfig(data=1, fsdp=1, tensor=1), micro=1)
    assert batch_layout(cfg, make_mesh(cfg.mesh, jax.devices()[:1])).accum_steps == 8
    return _run(cfg, 1)[1]


LAYOUTS = {
    "dp8": (_layout(MeshConfig(data=8, fsdp=1)), 8),
    "fsdp8": (_layout(MeshConfig(data=1, fsdp=8)), 8),
    "dp2xfsdp4": (_layout(MeshConfig(data=2, fsdp=4)), 8),
    "dp2xfsdp2xtp2": (_layout(MeshConfig(data=2, fsdp=2, tensor=2)), 8),
    "dp2xfsdp2-accum2-chunked": (_layout(MeshConfig(data=2, fsdp=2), micro=1, loss_chunk=4), 4),
    # every axis and both ways of splitting the work at once: one compile holds the claim in the default run
    "dp2xfsdp2xtp2-accum2-chunked": (_layout(MeshConfig(data=2, fsdp=2, tensor=2), micro=1, loss_chunk=4), 8),
}
# The default run takes the layout that has all of them (data x fsdp x tensor, two accumulation steps, the
# chunked output layer); each axis or feature alone, the slow run.
SLOW_LAYOUTS = ("dp8", "fsdp8", "dp2xfsdp4", "dp2xfsdp2xtp2", "dp2xfsdp2-accum2-chunked")


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in SLOW_LAYOUTS else n for n in LAYOUTS])
def test_same_losses_on_every_layout(reference, name):
    cfg, n_devices = LAYOUTS[name]
    accum = batch_layout(cfg, make_mesh(cfg.mesh, jax.devices()[:n_devices])).accum_steps
    assert accum == (2 if "accum2" in name else 1)  # the name says what the layout runs
    state, history = _run(cfg, n_devices)
    for ours, ref in zip(history, reference):
        for key in ("loss", "ce_loss"):
            assert ours[key] == pytest.approx(ref[key], rel=1e-6), (key, ours, ref)
        # z-loss is ~1e-5 x the loss and the gradient norm a sum of squares: fewer exact bits.
        assert ours["z_loss"] == pytest.approx(ref["z_loss"], rel=1e-5)
        assert ours["grad_norm"] == pytest.approx(ref["grad_norm"], rel=1e-5)
        assert ours["lr"] == ref["lr"] and ours["tokens"] == 8 * 16 and ours["skipped"] == 0.0
    assert int(state.step) == N_STEPS


def test_metrics_and_step_numbering(reference):
    schedule = make_schedule(BASE.schedule, lr=3e-3, max_steps=20, tokens_per_step=128)
    assert [h["lr"] for h in reference] == [float(schedule(s)) for s in range(1, N_STEPS + 1)]
    assert reference[0]["lr"] == pytest.approx(1.5e-3)  # step 1 of 2 warmup steps: numbering is 1-based
    for h in reference:
        assert h["loss"] == pytest.approx(h["ce_loss"] + h["z_loss"], rel=1e-7)
    assert len({h["loss"] for h in reference}) == N_STEPS  # the steps did change something

    # Batches without an instance_mask: the same as a mask that keeps everything.
    no_mask = [{"input_ids": b["input_ids"]} for b in _batches()[:1]]
    _, history = _run(_layout(MeshConfig(data=1, fsdp=1, tensor=1), micro=1), 1, no_mask)
    assert history[0] == reference[0]


def test_packed_data_leaves_padding_out_of_the_loss(reference):
    """data.packing=obfd: a target that is padding has no loss and no count (3.0.0's label_mask on a
    packed instance), exactly what mask_pad_token does for the reference; without either, the padded
    step differs."""
    one_device = _layout(MeshConfig(data=1, fsdp=1, tensor=1), micro=1)
    packed = replace(one_device, data=replace(BASE.data, mask_pad_token=False, packing="obfd"))
    assert _run(packed, 1)[1] == reference
    plain = replace(one_device, data=replace(BASE.data, mask_pad_token=False))
    history = _run(plain, 1)[1]
    assert history[0] == reference[0]  # the first batch has no padding
    assert history[1]["ce_loss"] != pytest.approx(reference[1]["ce_loss"], rel=1e-3)


def test_fsdp_shards_parameters_and_both_moments():
    cfg = _layout(MeshConfig(data=1, fsdp=8))
    shardings = state_shardings(cfg, make_mesh(cfg.mesh))
    for tree in (shardings.params, shardings.opt_state.adam.mu, shardings.opt_state.adam.nu):
        assert tree["embed"].spec == jax.sharding.PartitionSpec(None, "fsdp")
        assert tree["layers"]["q_proj"].spec == jax.sharding.PartitionSpec(None, "fsdp", None)


def test_batch_that_does_not_divide_is_an_error():
    mesh8 = make_mesh(MeshConfig(data=2, fsdp=4))
    with pytest.raises(ConfigError, match="global_batch=12 is not divisible"):
        batch_layout(replace(BASE, trainer=replace(BASE.trainer, global_batch=12)), mesh8)
    with pytest.raises(ConfigError, match="micro_batch_size=3 does not divide the per-device batch of 4"):
        batch_layout(replace(BASE, trainer=replace(BASE.trainer, global_batch=32, micro_batch_size=3)), mesh8)
    # a micro-batch larger than the per-device batch is capped at it (recipes set "at most 4")
    capped = batch_layout(replace(BASE, trainer=replace(BASE.trainer, global_batch=16, micro_batch_size=4)), mesh8)
    assert (capped.per_device, capped.micro_batch, capped.accum_steps) == (2, 2, 1)
    with pytest.raises(ConfigError, match="loss_chunk=5"):
        make_train_step(_layout(MeshConfig(data=2, fsdp=4), loss_chunk=5), mesh8)
