"""The embedding lookup under a mesh (olmax.model.sharding.lookup_rows): the same rows and the same gradient
as on one device on every layout, and the HSDP layout (data and fsdp both > 1) compiles without moving
a whole activation or a whole table: XLA's own layout of `table[ids]` gathered the whole cotangent of
the lookup on every device in the backward pass ("Involuntary full rematerialization"), or, with XLA's
GPU compiler, the whole table for the forward pass."""

import re
from dataclasses import replace

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from models import tiny_eval_model

from olmax.config.mesh import MeshConfig
from olmax.config.recipes import get_recipe
from olmax.model.olmo3 import forward_hidden, init_params, param_shardings
from olmax.model.sharding import logical_to_spec, lookup_rows, make_mesh
from olmax.objectives.cross_entropy import output_loss
from olmax.step.state import abstract_state
from olmax.step.train_step import batch_sharding, make_train_step

MESHES = {
    "dp2xfsdp4": MeshConfig(data=2, fsdp=4),
    "fsdp8": MeshConfig(data=1, fsdp=8),  # pure FSDP and pure data parallelism: the plain lookup
    "dp2xfsdp2xtp2": MeshConfig(data=2, fsdp=2, tensor=2),  # the vocabulary split over tensor
    "dp2xfsdp2xcp2": MeshConfig(data=2, fsdp=2, context=2),  # the sequences split over context
    "dp8": MeshConfig(data=8, fsdp=1),
}


def _placed(x, axes, mesh):
    return jax.device_put(x, NamedSharding(mesh, logical_to_spec(axes, x.shape, mesh)))


@pytest.mark.parametrize("name", MESHES)
def test_lookup_rows_and_gradient_equal_one_device(name):
    rng = np.random.default_rng(0)  # numpy's draws: no program to compile for them
    table = jnp.asarray(rng.standard_normal((256, 32), np.float32))
    ids = jnp.asarray(rng.integers(0, 40, (8, 16), np.int32))  # few distinct ids: repeats sum in the gradient
    weights = jnp.asarray(rng.standard_normal((8, 16, 32), np.float32))
    loss = lambda t, i: (lookup_rows(t, i, jnp.float32) * weights).sum()
    mesh = make_mesh(MESHES[name])
    with jax.set_mesh(mesh):
        t, i = _placed(table, ("vocab", "embed"), mesh), _placed(ids, ("batch", "seq"), mesh)
        rows, grad = jax.jit(lambda t, i: (lookup_rows(t, i, jnp.float32), jax.grad(loss)(t, i)))(t, i)  # one program
    np.testing.assert_array_equal(rows, table[ids])  # a gather moves values: exact
    if MESHES[name].data > 1 and MESHES[name].fsdp > 1:  # HSDP: the shard_map's gradient, in the table's layout
        assert grad.sharding.is_equivalent_to(t.sharding, 2)
    # sums of up to ~30 repeats, in another order: float32 rounding, nothing more
    np.testing.assert_allclose(grad, jax.grad(loss)(table, ids), rtol=1e-6, atol=1e-6)


# The tiny recipe with one small layer (the evaluation tests' model), over a vocabulary that every
# mesh axis divides
SMALL = replace(
    get_recipe("tiny"), model=tiny_eval_model(vocab_size=256, n_layers=1, n_heads=4, n_kv_heads=2, head_dim=8)
)


def test_model_embedding_gradient_on_hsdp_equals_one_device():
    """The whole model's loss on data 2 x fsdp 4 (HSDP) against one device: every parameter's gradient,
    the embedding's first."""
    cfg = SMALL.model
    params = jax.jit(init_params, static_argnums=0)(cfg, jax.random.key(0))
    tokens = np.random.default_rng(1).integers(0, cfg.vocab_size, (8, 16), np.int32)
    labels = np.roll(tokens, -1, axis=1)

    def loss(params, tokens):
        return output_loss(params, forward_hidden(params, tokens, cfg), labels, cfg, chunk=0, z_loss=1e-4)[0]

    expected = jax.jit(jax.grad(loss))(params, tokens)
    mesh = make_mesh(MeshConfig(data=2, fsdp=4))
    with jax.set_mesh(mesh):
        sharded = jax.device_put(params, param_shardings(cfg, mesh))
        grads = jax.jit(jax.grad(loss))(sharded, _placed(tokens, ("batch", "seq"), mesh))
    for (path, ours), ref in zip(jax.tree_util.tree_leaves_with_path(grads), jax.tree.leaves(expected)):
        # float32 sums in another order: measured below 5e-7 of each gradient's largest entry
        scale = float(np.abs(ref).max())
        np.testing.assert_allclose(ours, ref, rtol=1e-6, atol=1e-6 * scale, err_msg=jax.tree_util.keystr(path))


def _step_hlo(cfg, devices, options=None) -> str:
    """The compiled train step's HLO for abstract state and batch on these devices."""
    mesh = make_mesh(cfg.mesh, devices)
    with jax.set_mesh(mesh):
        state = abstract_state(cfg, mesh)
        shape = (cfg.trainer.global_batch, cfg.data.seq_len)
        batch = {"input_ids": jax.ShapeDtypeStruct(shape, jnp.int32, sharding=batch_sharding(cfg, mesh))}
        return make_train_step(cfg, mesh).lower(state, batch).compile(compiler_options=options).as_text()


def _gathers_of(hlo: str, dims) -> list[str]:
    """The all-gathers in the HLO whose result has these dimensions (any dtype)."""
    shape = "[" + ",".join(map(str, dims)) + "]"
    return [line for line in hlo.splitlines() if re.search(r"all-gather(-start)?\(", line) and shape in line]


# HSDP compiles with the real vocabulary: XLA lays out the lookup of a small table otherwise
HSDP = replace(SMALL, model=replace(SMALL.model, vocab_size=get_recipe("tiny").model.vocab_size))


def test_hsdp_moves_no_whole_activation_or_table(capfd):
    cfg = replace(HSDP, mesh=MeshConfig(data=2, fsdp=4))
    hlo = _step_hlo(cfg, jax.devices()[:8])
    rows, d = cfg.trainer.global_batch, cfg.model.d_model  # one micro-batch of 1 per device
    assert _gathers_of(hlo, (rows, cfg.data.seq_len, d)) == []  # XLA's backward pass gathered this
    assert _gathers_of(hlo, (cfg.model.padded_vocab_size, d)) == []
    assert "Involuntary full rematerialization" not in capfd.readouterr().err
    assert re.search(r"all-to-all(-start)?\(", hlo)  # the lookup's rows and their cotangent move once


def test_hsdp_on_gpu_moves_no_whole_activation_or_table(capfd):
    """XLA's GPU compiler, two nodes of 8 H100s as HSDP (fsdp within a node, data across)."""
    pytest.importorskip("jax_cuda12_plugin", reason="needs the gpu-compile extra (make setup-test)")
    from olmax.fit.chips import compiler_options, get_chip
    from olmax.fit.compiler import topology_devices

    cfg = replace(
        HSDP,
        model=replace(HSDP.model, compute_dtype="bfloat16", attention="xla"),
        mesh=MeshConfig(data=2, fsdp=8),
        trainer=replace(HSDP.trainer, global_batch=16),
    )
    hlo = _step_hlo(cfg, topology_devices("h100:2x8"), compiler_options(get_chip("h100")))
    d = cfg.model.d_model
    assert _gathers_of(hlo, (cfg.model.padded_vocab_size, d)) == []  # XLA's lookup gathered this
    assert _gathers_of(hlo, (16, cfg.data.seq_len, d)) == []
    assert "Involuntary full rematerialization" not in capfd.readouterr().err
