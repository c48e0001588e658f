"""Model invariants that need no external reference (parity with transformers and OLMo-core is in
test_parity.py): parameter counts, OLMo-core's init, causality, remat and sharding transparency."""

import dataclasses
import functools
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.ad_checkpoint import print_saved_residuals
from models import random_params

from olmax.config.mesh import MeshConfig
from olmax.config.recipes import OLMO3_7B, OLMO3_7B_HD256, OLMO3_32B, TINY
from olmax.config.remat import REMAT_TAGS, remat_policy_of
from olmax.model.olmo3 import (
    ParamSpec,
    block,
    checkpoint_policy,
    count_params,
    forward,
    init_params,
    param_shardings,
    param_specs,
    self_attention,
)
from olmax.model.rope import rope_tables
from olmax.model.sharding import make_mesh

# Three layers: one scanned group of two (a windowed layer and a global one) and an unrolled tail of one,
# the two ways the forward pass runs its layers
CFG = dataclasses.replace(TINY, vocab_size=1000, n_layers=3, global_every=2, sliding_window=8)
# One jitted init and forward for the module's tests: a call with a config and shapes another test
# used reuses its program instead of tracing and compiling it again.
init = jax.jit(init_params, static_argnums=0)
run_forward = jax.jit(forward, static_argnums=2)


def _tokens(b=8, t=32, seed=0):
    """A batch of 8 (what the sharded test's meshes divide): the forward tests share one program."""
    return np.random.default_rng(seed).integers(0, CFG.vocab_size, (b, t), np.int32)  # numpy: no draw to compile


def test_parameter_counts_match_olmo_core():
    # olmo_core TransformerConfig.olmo3_7B(vocab_size=100352).num_params (docs/reference.md, "Model")
    assert count_params(OLMO3_7B) == 7_298_617_344
    assert count_params(OLMO3_7B) - 100352 * 4096 == 6_887_575_552  # without the input embedding
    assert count_params(OLMO3_32B) == 32_234_279_936
    assert count_params(OLMO3_7B_HD256) == count_params(OLMO3_7B)


def test_init_is_truncated_normal_and_ones():
    params = init(CFG, jax.random.key(0))
    w = np.asarray(params["layers"]["gate_proj"])
    assert np.abs(w).max() <= 3 * 0.02 + 1e-7
    # std of N(0, 0.02) truncated at 3 std is 0.02 * 0.98658
    assert w.std() == pytest.approx(0.02 * 0.98658, rel=0.01)
    assert abs(w.mean()) < 5 * w.std() / np.sqrt(w.size)  # zero mean, 5 standard errors
    assert np.all(np.asarray(params["layers"]["q_norm"]) == 1) and np.all(np.asarray(params["final_norm"]) == 1)
    shapes = jax.tree.map(lambda s: s.shape, param_specs(CFG), is_leaf=lambda x: isinstance(x, ParamSpec))
    assert jax.tree.map(lambda a: a.shape, params) == shapes
    assert params["embed"].shape == (1024, 128)  # vocab padded to a multiple of 128


def test_logits_are_causal():
    params = random_params(CFG, jax.random.key(1))
    tokens = _tokens()
    changed = tokens.copy()
    changed[:, 20] = (tokens[:, 20] + 1) % CFG.vocab_size
    a, b = np.asarray(run_forward(params, tokens, CFG)), np.asarray(run_forward(params, changed, CFG))
    np.testing.assert_array_equal(a[:, :20], b[:, :20])
    assert not np.allclose(a[:, 20:], b[:, 20:])


@functools.cache
def _loss_and_grad(serial: bool, policy: Optional[str]):
    """Loss and gradients of the remat test's model (with documents in the serial case, so integer
    segment ids enter each block), without remat (policy None) or with `policy`: the reference of
    each serial flag is computed once per test process."""
    params = random_params(CFG, jax.random.key(2))
    tokens = _tokens(b=2)
    segments = np.broadcast_to(np.arange(tokens.shape[1], dtype=np.int32) // 12, tokens.shape) if serial else None
    cfg = CFG if policy is None else dataclasses.replace(CFG, remat=policy, remat_serial=serial)
    loss = lambda p: jnp.mean(jax.nn.logsumexp(forward(p, tokens, cfg, segments=segments), axis=-1))  # noqa: E731
    return jax.jit(jax.value_and_grad(loss))(params)


# One policy of each kind: nothing saved, the matmuls, named activations, host offload, and sets of
# tags written in the config (every tag is in one of them). The serial wrapper is the same code for
# every policy, so the default run takes each policy in one order and the slow run the other.
SLOW = pytest.mark.slow


@pytest.mark.parametrize(
    "policy,serial",
    [
        pytest.param("full", False, marks=SLOW),
        pytest.param("full", True, marks=SLOW),
        pytest.param("save_dots", False, marks=SLOW),
        pytest.param("save_dots", True, marks=SLOW),
        ("save_attn_mlp_inputs", False),
        pytest.param("save_attn_mlp_inputs", True, marks=SLOW),
        pytest.param("offload_qkv_proj", False, marks=SLOW),
        ("offload_qkv_proj", True),
        pytest.param("q_proj,k_proj,v_proj,attn_context", False, marks=SLOW),
        ("q_proj,k_proj,v_proj,attn_context", True),
        pytest.param("layer_input,o_proj,mlp_gate,mlp_up,mlp_down", False, marks=SLOW),
        pytest.param("layer_input,o_proj,mlp_gate,mlp_up,mlp_down", True, marks=SLOW),
    ],
)
def test_remat_changes_nothing(policy, serial):
    """Neither the policy nor the order of the backward pass (model.remat_serial: optimization
    barriers, and a custom VJP around each block) changes the loss or the gradients; with documents
    (integer segment ids enter each block) as without."""
    base_loss, base_grad = _loss_and_grad(serial, None)
    remat_loss, remat_grad = _loss_and_grad(serial, policy)
    assert remat_loss == pytest.approx(float(base_loss), rel=1e-6)
    for g0, g1 in zip(jax.tree.leaves(base_grad), jax.tree.leaves(remat_grad)):
        np.testing.assert_allclose(g1, g0, rtol=1e-5, atol=1e-7)


def test_serial_backward_ties_each_blocks_backward_pass():
    """model.remat_serial puts two optimization barriers in every block's backward pass (over the
    kept tensors and the incoming cotangent, and over the gradients going out) and none in the
    forward; the compiled effect on memory is tests/fit/test_compile_check.py's (slow)."""
    params, tokens = random_params(CFG, jax.random.key(2)), _tokens(b=2)

    def barriers(serial, grad):
        cfg = dataclasses.replace(CFG, remat="q_proj,k_proj,v_proj", remat_serial=serial)
        loss = lambda p: jnp.mean(forward(p, tokens, cfg))  # noqa: E731
        return jax.jit(jax.grad(loss) if grad else loss).lower(params).as_text().count("optimization_barrier")

    # CFG: 3 layers = one scanned group of 2 (one body) and a tail group of 1
    assert barriers(True, grad=True) - barriers(False, grad=True) == 2 * (2 + 1)
    assert barriers(True, grad=False) == barriers(False, grad=False)


@pytest.mark.parametrize("tag", REMAT_TAGS)
def test_each_tag_names_the_activation_its_policy_keeps(tag, capsys):
    """A policy of one tag keeps that block activation for the backward pass and no other (besides
    the block's arguments and RoPE tables, which jax.checkpoint always keeps). `attn_context` is what
    the attention backend's backward reads, named by the backend (the xla backend here): its output
    in its (batch, kv head, position x group, head_dim) layout and each row's log-sum-exp."""
    params = jax.tree.map(lambda w: w[0], random_params(CFG, jax.random.key(3))["layers"])
    x = jnp.asarray(np.random.default_rng(4).standard_normal((2, 16, CFG.d_model), np.float32))
    cos, sin = rope_tables(CFG, 16, False)
    attend = self_attention(CFG, None)
    run = jax.checkpoint(
        lambda p, x: block(CFG, p, x, cos, sin, attend)[0], policy=checkpoint_policy(remat_policy_of(tag))
    )
    q, kv, d, f = CFG.n_heads * CFG.head_dim, CFG.n_kv_heads * CFG.head_dim, CFG.d_model, CFG.mlp_hidden
    width = dict(layer_input=d, q_proj=q, k_proj=kv, v_proj=kv, o_proj=d, mlp_gate=f, mlp_up=f, mlp_down=d)
    kv_heads, rows = CFG.n_kv_heads, 16 * (CFG.n_heads // CFG.n_kv_heads)  # rows: (position, group)
    expected = (
        [f"f32[2,{kv_heads},{rows},{CFG.head_dim}] named '{tag}'", f"f32[2,{kv_heads},{rows},1] named '{tag}'"]
        if tag == "attn_context"
        else [f"f32[2,16,{width[tag]}] named '{tag}'"]
    )
    print_saved_residuals(run, params, x)
    kept = [line.split(" from ")[0] for line in capsys.readouterr().out.splitlines() if " named " in line]
    assert kept == expected


@pytest.fixture(scope="module")
def one_device():
    """The parameters the sharded test initialises, on one device, and their logits."""
    params = init(CFG, jax.random.key(3))
    return params, run_forward(params, _tokens(), CFG)


@pytest.mark.parametrize("mesh", [MeshConfig(data=1, fsdp=8, tensor=1), MeshConfig(data=2, fsdp=2, tensor=2)])
def test_sharded_forward_equals_single_device(mesh, one_device):
    mesh = make_mesh(mesh)
    shardings = param_shardings(CFG, mesh)
    sharded = jax.jit(init_params, static_argnums=0, out_shardings=shardings)(CFG, jax.random.key(3))
    assert sharded["layers"]["up_proj"].sharding.spec == jax.tree.leaves(shardings["layers"]["up_proj"])[0].spec
    local, want = one_device
    for a, b in zip(jax.tree.leaves(sharded), jax.tree.leaves(local), strict=True):
        np.testing.assert_array_equal(a, b)  # the same draws, only placed
    got = run_forward(sharded, _tokens(), CFG)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_bf16_compute_keeps_fp32_params_and_logits():
    cfg = dataclasses.replace(CFG, compute_dtype="bfloat16")
    assert all(p.dtype == jnp.float32 for p in jax.tree.leaves(jax.eval_shape(random_params, cfg, jax.random.key(4))))
    params = random_params(CFG, jax.random.key(4))  # the same draws (CFG's program, compiled once)
    tokens = _tokens()
    lo, hi = run_forward(params, tokens, cfg), run_forward(params, tokens, CFG)
    assert lo.dtype == jnp.float32
    diff = np.max(np.abs(np.asarray(lo) - np.asarray(hi)))
    assert diff < 0.05  # bf16 rounding, not a different function
    assert diff > 0  # and bf16 really was used
