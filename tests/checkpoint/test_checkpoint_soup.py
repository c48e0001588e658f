"""`olmax ckpt soup`: the weighted average of checkpoints, in float32, as OLMo-core's merge script
(src/scripts/merge_core_checkpoints.py) computes it, checked against the mean computed in numpy.

The inputs are small run checkpoints with random parameters, moments, counters and skip windows,
written through RunCheckpoints (no training), so every array and counter differs between them."""

import json

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
from small_run import SMALL
from typer.testing import CliRunner

from olmax.checkpoint.inference import load_checkpoint
from olmax.checkpoint.store import RunCheckpoints, complete_steps, load_params, read_config, run_handlers
from olmax.checkpoint.surgery import (
    average,
    fsdp_mesh,
    inspect,
    is_warm_start,
    restore_state,
    soup,
    soup_source,
    warm_start,
)
from olmax.cli.common import app
from olmax.config.io import apply_overrides
from olmax.config.recipes import get_recipe
from olmax.step.optim import AdamWState, OptState, SkipWindow
from olmax.step.state import TrainState, abstract_state, state_shardings
from olmax.trainer.start import new_run_state

# A small vocabulary keeps each checkpoint ~1 MB; the rest is the shared small run's model.
TINY = [*SMALL, "model.vocab_size=256", "data.vocab_size=256", "checkpoint.keep=5"]


def config(*extra):
    return apply_overrides(get_recipe("tiny"), [*TINY, *extra])


def random_state(cfg, mesh, seed: int, step: int) -> TrainState:
    """A train state whose every array is random (moments too: fresh ones are all zeros)."""
    rng = np.random.default_rng(seed)
    shapes = abstract_state(cfg, mesh)

    def normal(a):
        return rng.standard_normal(a.shape).astype(a.dtype)

    params = jax.tree.map(normal, shapes.params)
    mu = jax.tree.map(normal, shapes.opt_state.adam.mu)
    nu = jax.tree.map(lambda a: np.abs(normal(a)), shapes.opt_state.adam.nu)
    w = cfg.optimizer.skip_window
    window = SkipWindow(rng.random(w, np.float32), rng.random(w, np.float32), np.int32(step))
    state = TrainState(np.int32(step), params, OptState(AdamWState(np.int32(step - 1), mu, nu), window))
    return jax.device_put(state, state_shardings(cfg, mesh))


def save(cfg, directory, seed_steps: list[tuple[int, int]]) -> dict:
    """Run checkpoints at the given (seed, step)s in `directory`; returns {step: state as numpy}."""
    mesh = fsdp_mesh()
    ckpts = RunCheckpoints(directory, cfg)
    states = {}
    try:
        for seed, step in seed_steps:
            state = random_state(cfg, mesh, seed, step)
            ckpts.save(step, state, {"batches": step, "seed": seed}, mesh)
            states[step] = jax.device_get(state)
    finally:
        ckpts.close()
    return states


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Run A with steps 3 and 6, run B with step 4, run C (another model) with step 2, run D (the
    model in bfloat16) with step 5, and a parameters checkpoint P (a params-only soup of A)."""
    tmp = tmp_path_factory.mktemp("soup")
    cfg = config()
    a = save(cfg, tmp / "A", [(1, 3), (2, 6)])
    b = save(cfg, tmp / "B", [(3, 4)])
    save(config("model.mlp_hidden=256"), tmp / "C", [(4, 2)])
    d = save(config("model.param_dtype=bfloat16"), tmp / "D", [(5, 5)])
    soup([str(tmp / "A")], tmp / "P", params_only=True)
    return tmp, cfg, {"A3": a[3], "A6": a[6], "B4": b[4], "D5": d[5]}


def assert_weighted_mean(actual, states, weights, pick):
    """`actual` (float32) is sum_i w_i * x_i of the `pick`ed arrays of `states` up to float32 rounding:
    within 1e-6 of sum_i |w_i * x_i|, the bound of a float32 sum of a few terms whatever their order
    or fusion (the reference is float64; a weight off by 1e-6 or a bfloat16 sum breaks it)."""
    terms = [jax.tree.map(lambda x, w=w: w * np.asarray(x, np.float64), pick(st)) for st, w in zip(states, weights)]
    exact = jax.tree.map(lambda *t: sum(t), *terms)
    scale = jax.tree.map(lambda *t: sum(map(np.abs, t)), *terms)
    for x, e, m in zip(jax.tree.leaves(actual), jax.tree.leaves(exact), jax.tree.leaves(scale), strict=True):
        x = np.asarray(x)
        assert x.dtype == np.float32 and x.shape == e.shape
        worst = np.max(np.abs(x - e) / np.maximum(m, np.finfo(np.float64).tiny))
        assert worst <= 1e-6, worst


def params_of(state):
    return state.params


def moments(state):
    return (state.params, state.opt_state.adam.mu, state.opt_state.adam.nu)


def run(*args):
    return CliRunner().invoke(app, ["ckpt", "soup", *map(str, args)])


def test_two_checkpoints_soup_to_their_mean(runs):
    """Two equal weights: each value is their mean rounded once to float32 (x/2 is exact), so it
    matches numpy's float64 mean within float32 rounding."""
    tmp, cfg, s = runs
    result = run(tmp / "A" / "3", tmp / "B", "--out", tmp / "two", "--params-only")
    assert result.exit_code == 0, result.output
    params, _, meta = load_params(tmp / "two")
    pair = s["A3"].params, s["B4"].params
    mean = jax.tree.map(lambda a, b: (np.asarray(a, np.float64) + np.asarray(b, np.float64)) / 2, *pair)
    for x, y in zip(jax.tree.leaves(params), jax.tree.leaves(mean), strict=True):
        assert x.dtype == np.float32
        np.testing.assert_allclose(np.asarray(x), y, rtol=1e-7, atol=0)
    assert meta["soup"]["checkpoints"] == [
        {"checkpoint": str(tmp / "A"), "step": 3, "weight": 0.5},
        {"checkpoint": str(tmp / "B"), "step": 4, "weight": 0.5},
    ]


def stored_dtypes(directory, step) -> set[str]:
    """The dtypes of the parameters as written (not as a loader casts them)."""
    options = ocp.CheckpointManagerOptions(create=False, read_only=True)
    mngr = ocp.CheckpointManager(directory, item_handlers=run_handlers(), options=options)
    try:
        return {str(a.dtype) for a in jax.tree.leaves(mngr.item_metadata(step)["params"])}
    finally:
        mngr.close()


def test_bfloat16_parameters_are_read_and_written_in_float32(runs):
    tmp, cfg, s = runs
    assert {x.dtype for x in jax.tree.leaves(s["D5"].params)} == {np.dtype("bfloat16")}
    soup([str(tmp / "B"), str(tmp / "D")], tmp / "B+D", params_only=True)
    soup([str(tmp / "D"), str(tmp / "B")], tmp / "D+B", params_only=True)
    assert stored_dtypes(tmp / "B+D", 4) == stored_dtypes(tmp / "D+B", 5) == {"float32"}
    params, _, _ = load_params(tmp / "B+D")  # the first's config: float32
    pair = s["B4"].params, s["D5"].params
    mean = jax.tree.map(lambda a, b: (np.asarray(a, np.float64) + np.asarray(b, np.float64)) / 2, *pair)
    for x, y in zip(jax.tree.leaves(params), jax.tree.leaves(mean), strict=True):
        np.testing.assert_allclose(np.asarray(x), y, rtol=1e-7, atol=0)  # bfloat16 read exactly, summed in float32


def test_whole_state_soup_averages_params_and_moments_and_keeps_the_first_counters(runs):
    tmp, cfg, s = runs
    result = run(tmp / "A", tmp / "A" / "3", tmp / "B", "--out", tmp / "full", "--json", tmp / "full.json")
    assert result.exit_code == 0, result.output
    summary = json.loads((tmp / "full.json").read_text())
    assert summary["step"] == 6 and not summary["params_only"]  # DIR alone: its newest step
    assert [c["step"] for c in summary["checkpoints"]] == [6, 3, 4]
    assert [c["weight"] for c in summary["checkpoints"]] == [1 / 3] * 3

    state = jax.device_get(restore_state(tmp / "full", 6, cfg))
    first = s["A6"]
    assert_weighted_mean(moments(state), [s["A6"], s["A3"], s["B4"]], [1 / 3] * 3, moments)
    assert int(state.step) == 6 and int(state.opt_state.adam.count) == int(first.opt_state.adam.count)
    for x, y in zip(state.opt_state.window, first.opt_state.window):
        np.testing.assert_array_equal(x, y)
    r = inspect(tmp / "full")
    assert r["data"] == {"batches": 6, "seed": 2}  # the first checkpoint's loader state
    assert r["meta"]["warm_start"]["from_step"] == 6 and not r["meta"]["warm_start"]["reset_step"]
    assert {a["dtype"] for a in [*r["params"].values(), *r["opt_state"].values()]} >= {"float32"}

    # checkpoint.init_from=soup: the train state it holds, and the first checkpoint's data position
    init, data_state = new_run_state(config(f"checkpoint.init_from={tmp / 'full'}"), fsdp_mesh())
    for x, y in zip(jax.tree.leaves(jax.device_get(init)), jax.tree.leaves(state), strict=True):
        np.testing.assert_array_equal(x, y)
    assert data_state == {"batches": 6, "seed": 2}

    # a new stage from the soup: olmax ckpt warm-start SOUP DST --reset-step
    new_stage = warm_start(tmp / "full", tmp / "stage", reset_step=True)
    assert new_stage["source_step"] == 6 and new_stage["adam_count"] == int(first.opt_state.adam.count)
    assert inspect(tmp / "stage")["step"] == 0

    # its parameters alone make a parameters checkpoint, not another warm start
    soup([str(tmp / "full")], tmp / "full_params", params_only=True)
    assert not is_warm_start(tmp / "full_params")
    params, _, _ = load_params(tmp / "full_params")
    for x, y in zip(jax.tree.leaves(params), jax.tree.leaves(state.params), strict=True):
        np.testing.assert_array_equal(x, y)  # one checkpoint at weight 1: itself


def test_weighted_params_only_soup_loads_for_eval_and_training(runs):
    tmp, cfg, s = runs
    result = run(tmp / "A" / "6", tmp / "A" / "3", tmp / "B", "--out", tmp / "w", "--weights", "2,1,1", "--params-only")
    assert result.exit_code == 0, result.output
    inputs, normalised = [s["A6"], s["A3"], s["B4"]], [0.5, 0.25, 0.25]

    assert complete_steps(tmp / "w") == [6] and read_config(tmp / "w")[1]["soup"]["params_only"]
    assert sorted(p.name for p in (tmp / "w" / "6").iterdir() if p.is_dir()) == ["config", "meta", "params"]
    mesh = fsdp_mesh()
    params, model, meta = load_checkpoint(tmp / "w", mesh)  # the eval and generate loader
    assert model == cfg.model and meta["step"] == 6
    assert_weighted_mean(jax.device_get(params), inputs, normalised, params_of)
    init, data_state = new_run_state(config(f"checkpoint.init_from={tmp / 'w'}"), mesh)
    assert_weighted_mean(jax.device_get(init.params), inputs, normalised, params_of)
    assert int(init.step) == 0 and int(init.opt_state.adam.count) == 0 and data_state is None  # a fresh optimizer


def test_the_soup_is_computed_sharded_over_the_devices(runs):
    """Each array is read, summed and kept in 1/8 shards on 8 devices, never whole on one."""
    tmp, cfg, s = runs
    assert jax.device_count() == 8
    mesh = fsdp_mesh()
    target = abstract_state(cfg, mesh).params
    with jax.set_mesh(mesh):
        total, _ = average(
            [soup_source(str(tmp / "A")), soup_source(str(tmp / "B"))],
            [0.5, 0.5],
            {"params": target},
            lambda items: (items["params"], None),
        )
    for x, t in zip(jax.tree.leaves(total), jax.tree.leaves(target), strict=True):
        assert x.sharding.is_equivalent_to(t.sharding, x.ndim)
        assert x.addressable_shards[0].data.shape == t.sharding.shard_shape(t.shape)
        if x.size >= 4096:  # every matrix (the norm weights, 64 wide, stay replicated)
            assert x.addressable_shards[0].data.size * 8 == x.size, x.shape
    assert_weighted_mean(jax.device_get(total), [s["A6"], s["B4"]], [0.5, 0.5], params_of)


@pytest.mark.parametrize(
    "args, message",
    [
        (["A", "C"], "a different model (mlp_hidden 128 -> 256"),
        (["A/7", "B"], "has no checkpoint at step 7; it has steps [3, 6]"),
        (["A", "nowhere"], "nowhere does not exist"),
        (["A", "B", "--weights", "1"], "got 1 weights for 2 checkpoints"),
        (["A", "B", "--weights", "1,0"], "weights must be positive numbers, got 0.0"),
        (["A", "B", "--weights", "1,-2"], "weights must be positive numbers, got -2.0"),
        (["A", "B", "--weights", "1,x"], "--weights must be numbers separated by commas"),
        (["A", "P"], "P step 6 holds no optimizer state; soup the parameters only (--params-only)"),
        (["A", "B", "--out", "A"], "A is not empty; choose a new directory for the soup"),
    ],
)
def test_bad_input_is_refused_with_exit_2(runs, args, message):
    tmp = runs[0]
    args = [str(tmp / a) if a[:1].isupper() or a == "nowhere" else a for a in args]
    if "--out" not in args:
        args += ["--out", str(tmp / "never")]
    result = run(*args)
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.split()), result.output
    assert not (tmp / "never").exists()
