"""Continuing from another run's weights: one answer to "is this the same model?" for a parameters
checkpoint, a warm-start checkpoint and a resume; and a warm start that never holds the whole state on
one device."""

import dataclasses
import math

import jax
import numpy as np
import pytest
from small_run import SMALL

from olmax.checkpoint.store import RunCheckpoints, config_changes, save_params
from olmax.checkpoint.surgery import restore_state, warm_start
from olmax.config.io import apply_overrides, to_dict
from olmax.config.model import NOT_ARCHITECTURE, ModelConfig
from olmax.config.recipes import get_recipe
from olmax.errors import ConfigError
from olmax.model.olmo3 import param_specs
from olmax.model.sharding import make_mesh
from olmax.step.state import abstract_state
from olmax.trainer.start import new_run_state

# A stage-3-style start: YaRN on the global layers and a longer context, from stage-2 weights.
CONTEXT_EXTENSION = [
    "model.rope_type=yarn",
    "model.yarn_original_max_position=64",
    "model.max_position=512",
    "model.compute_dtype=float32",
    "model.remat=full",
]


def small_config(*extra):
    """The small run's model and mesh; no data is read (nothing here trains)."""
    return apply_overrides(get_recipe("tiny"), [*SMALL, *extra])


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """A run checkpoint (step 2, trained moments faked by random ones) and a parameters checkpoint."""
    tmp = tmp_path_factory.mktemp("continuation")
    cfg = small_config()
    mesh = make_mesh(cfg.mesh)
    with jax.set_mesh(mesh):
        # drawn on the host in the state's shapes and placed in its shardings (no program to compile):
        # random parameters and moments, zero counters and skip window, at step 2
        rng = np.random.default_rng(0)
        shapes = abstract_state(cfg, mesh)

        def draw(a):
            return rng.standard_normal(a.shape).astype(a.dtype)

        host = jax.tree.map(lambda a: np.zeros(a.shape, a.dtype), shapes)
        adam = host.opt_state.adam._replace(
            mu=jax.tree.map(draw, shapes.opt_state.adam.mu),
            nu=jax.tree.map(lambda a: np.abs(draw(a)), shapes.opt_state.adam.nu),
        )
        host = host._replace(
            step=np.int32(2), params=jax.tree.map(draw, shapes.params), opt_state=host.opt_state._replace(adam=adam)
        )
        state = jax.tree.map(lambda x, a: jax.device_put(x, a.sharding), host, shapes)
        ckpts = RunCheckpoints(tmp / "run", cfg)
        ckpts.save(2, state, {"batches": 2}, mesh)
        ckpts.close()
    save_params(tmp / "params", state.params, cfg.model, {})
    warm_start(tmp / "run", tmp / "warm", keep=("params", "moments"), reset_step=True)
    return tmp, cfg, state


def _start(tmp, init_from, *overrides):
    cfg = small_config(f"checkpoint.init_from={init_from}", *overrides)
    mesh = make_mesh(cfg.mesh)
    with jax.set_mesh(mesh):
        return new_run_state(cfg, mesh)[0]


@pytest.mark.parametrize("source", ["params", "warm"])
def test_a_context_extension_is_accepted_from_either_checkpoint(sources, source):
    tmp, _, state = sources
    started = _start(tmp, tmp / source, *CONTEXT_EXTENSION)
    for a, b in zip(jax.tree.leaves(state.params), jax.tree.leaves(started.params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


# one field of each kind a stage may not change: a width, a norm, the attention's window, the positions
ARCHITECTURE_CHANGES = [
    "model.mlp_hidden=256",
    "model.norm_eps=1e-5",
    "model.sliding_window=8",
    "model.rope_theta=10000.0",
]


@pytest.mark.parametrize("source", ["params", "warm"])
def test_an_architecture_change_is_refused_from_either_checkpoint(sources, source):
    """All four changes at once (one checkpoint read): the refusal names each of them."""
    tmp, _, _ = sources
    with pytest.raises(ConfigError, match="different model") as refused:
        _start(tmp, tmp / source, *ARCHITECTURE_CHANGES)
    changed = str(refused.value).split("different model", 1)[1]
    for change in ARCHITECTURE_CHANGES:
        assert change.split("=")[0].removeprefix("model.") + " " in changed, (change, changed)


def test_a_resume_lists_context_changes_and_refuses_architecture_changes(sources):
    tmp, cfg, _ = sources
    saved = to_dict(cfg)
    assert config_changes(saved, cfg) == []
    extended = config_changes(saved, apply_overrides(cfg, CONTEXT_EXTENSION))
    assert len(extended) == 1 and extended[0].startswith("model context ")  # allowed with --allow-config-change
    assert "rope_type default -> yarn" in extended[0] and "max_position 256 -> 512" in extended[0]
    wider = config_changes(saved, apply_overrides(cfg, ["model.mlp_hidden=256"]))
    assert wider == ["model architecture mlp_hidden 128 -> 256"]


def test_every_model_field_is_classified():
    """A new ModelConfig field is architecture unless NOT_ARCHITECTURE says otherwise; this lists the
    ones that are not, so adding one there is a visible decision."""
    names = {f.name for f in dataclasses.fields(ModelConfig)}
    assert NOT_ARCHITECTURE <= names
    assert NOT_ARCHITECTURE == {  # alphabetical
        "attention",
        "compute_dtype",
        "init_std",
        "max_position",
        "param_dtype",
        "remat",
        "remat_serial",  # the backward pass's order: memory, not values
        "rope_positions",  # positions across a packed instance: a context change (stage 3), as YaRN is
        "rope_type",
        "splash_blocks",
        "yarn_beta_fast",
        "yarn_beta_slow",
        "yarn_factor",
        "yarn_layers",
        "yarn_original_max_position",
    }


def test_warm_start_state_is_sharded_over_the_devices(sources):
    """restore_state (which warm_start passes the state through) shards parameters and both moments
    over every device: each device holds 1/8 of every matrix, never the whole state."""
    tmp, cfg, _ = sources
    state = restore_state(tmp / "run", 2, cfg)
    n = jax.device_count()
    assert n == 8
    embed = [("embed" in s.axes) for s in jax.tree.leaves(param_specs(cfg.model), is_leaf=lambda x: hasattr(x, "axes"))]
    assert sum(embed) == 9  # every matrix; the norm weights are small and replicated
    for tree in (state.params, state.opt_state.adam.mu, state.opt_state.adam.nu):
        for leaf, sharded in zip(jax.tree.leaves(tree), embed):
            shard = leaf.sharding.shard_shape(leaf.shape)
            assert math.prod(shard) * (n if sharded else 1) == math.prod(leaf.shape), (leaf.shape, shard)
    target = abstract_state(cfg, make_mesh(cfg.mesh))
    assert jax.tree.map(lambda a: a.shape, state) == jax.tree.map(lambda a: a.shape, target)
