"""Mixed precision as OLMo-core 3.0.0 trains: FSDP with `param_dtype=bfloat16` (the weights gathered and
used in bf16) and `reduce_dtype=float32` (every gradient summed across devices in float32).

The dtype a collective moves shows only in HLO compiled for an accelerator: XLA's CPU compiler widens
bf16 collectives to float32, whatever the program asks. So the train step here compiles, as
compile-check does, for an 8-chip v5p slice (v5p:2x2x2) that libtpu describes (no TPU needed), and the test
reads the compiled program's collectives. A bf16 weight-gradient dot (autodiff's, of a bf16 matmul)
shows as bf16 reduce-scatters and all-reduces of the block weights; `olmo3.dense` makes them float32.
"""

from __future__ import annotations

import re
from collections import Counter

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from olmax.config.data import DataConfig
from olmax.config.experiment import ExperimentConfig
from olmax.config.mesh import MeshConfig
from olmax.config.model import ModelConfig
from olmax.config.trainer import TrainerConfig
from olmax.fit.chips import chip_of_topology, compiler_options
from olmax.fit.compiler import topology_devices
from olmax.model.olmo3 import dense, rounded
from olmax.model.sharding import make_mesh
from olmax.step.state import abstract_state
from olmax.step.train_step import batch_sharding, make_train_step

TOPOLOGY = "v5p:2x2x2"
VOCAB = 512  # no block weight has a dimension of this size
# 5 layers: one scanned group of 4 and one layer after the scan; every width a multiple of 128 (TPU tiles)
MODEL = ModelConfig(
    vocab_size=VOCAB,
    d_model=256,
    n_layers=5,
    n_heads=2,
    n_kv_heads=1,
    head_dim=128,
    mlp_hidden=384,
    sliding_window=64,
    compute_dtype="bfloat16",
    attention="xla",
)
MATRICES = 7  # q, k, v, o, gate, up, down


def _collectives(mesh: MeshConfig) -> Counter:
    """(kind, dtype, shape) -> count of every array the compiled bf16 train step gathers or sums across
    devices (a combined collective counts each of its arrays)."""
    cfg = ExperimentConfig(
        name="grad-dtype",
        model=MODEL,
        data=DataConfig(seq_len=128),
        trainer=TrainerConfig(global_batch=8, max_steps=10),
        mesh=mesh,
    )
    devices = topology_devices(TOPOLOGY)
    device_mesh = make_mesh(cfg.mesh, devices)
    with jax.set_mesh(device_mesh):
        rows = jax.ShapeDtypeStruct((8, 128), "int32", sharding=batch_sharding(cfg, device_mesh))
        lowered = make_train_step(cfg, device_mesh).lower(abstract_state(cfg, device_mesh), {"input_ids": rows})
        hlo = lowered.compile(compiler_options(chip_of_topology(TOPOLOGY))).as_text()
    found = Counter()
    for line in hlo.splitlines():
        m = re.search(r"= (.*?) (all-gather|all-reduce|reduce-scatter)(?:-start)?\(", line)
        if m:
            for dtype, dims in re.findall(r"(\w+)\[([\d,]*)\]", m.group(1)):
                shape = tuple(int(d) for d in dims.split(",") if d)
                found[(m.group(2), dtype, shape)] += 1
    return found


def _block_arrays(found: Counter, kinds: tuple[str, ...]) -> Counter:
    """dtype -> count of the floating arrays of these collective kinds that belong to the blocks: the
    embedding and LM head are the arrays with a vocabulary dimension, scalars are the loss's sums."""
    out = Counter()
    for (kind, dtype, shape), n in found.items():
        if kind in kinds and dtype in ("bf16", "f32") and shape and VOCAB not in shape:
            out[dtype] += n
    return out


# HSDP holds both collectives (FSDP's reduce-scatter, the data axis's all-reduce); FSDP alone in the slow run
@pytest.mark.parametrize(
    "mesh",
    [pytest.param(MeshConfig(data=1, fsdp=8), marks=pytest.mark.slow), MeshConfig(data=2, fsdp=4)],
    ids=["fsdp8", "dp2xfsdp4"],
)
def test_block_gradients_are_summed_in_float32_and_weights_gathered_in_bf16(mesh):
    found = _collectives(mesh)
    summed = _block_arrays(found, ("reduce-scatter", "all-reduce"))
    assert summed["bf16"] == 0, sorted(k for k in found if k[1] == "bf16" and k[0] != "all-gather")
    assert summed["f32"] >= MATRICES * MODEL.n_layers  # at least one sum of every layer's every matrix
    gathered = _block_arrays(found, ("all-gather",))
    assert gathered["f32"] == 0, sorted(k for k in found if k[1] == "f32" and k[0] == "all-gather")
    assert gathered["bf16"] >= MATRICES * MODEL.n_layers
    # nothing at all is summed in bf16: the embedding's gradient (olmax.model.sharding.lookup_rows) neither
    bf16_sums = sorted(k for k in found if k[1] == "bf16" and k[0] in ("reduce-scatter", "all-reduce"))
    assert bf16_sums == []


def test_dense_is_a_bf16_matmul_with_a_float32_weight_gradient():
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((2, 64, 48)), jnp.bfloat16)
    w = jnp.asarray(rng.standard_normal((48, 32)) * 0.1, jnp.float32)
    dy = jnp.asarray(rng.standard_normal((2, 64, 32)), jnp.bfloat16)

    y, vjp = jax.vjp(dense, x, w)
    dx, dw = vjp(dy)
    ref_y, ref_vjp = jax.vjp(lambda x, w: x @ w.astype(jnp.bfloat16), x, w)
    ref_dx, _ = ref_vjp(dy)
    # the forward and dx are autodiff's bf16 matmuls, to the bit
    assert y.dtype == dx.dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(y, np.float32), np.asarray(ref_y, np.float32))
    np.testing.assert_array_equal(np.asarray(dx, np.float32), np.asarray(ref_dx, np.float32))
    # dw: the float32 sum over all 128 tokens of the bf16 operands' products, not rounded to bf16
    exact = np.einsum("bti,bto->io", np.asarray(x, np.float64), np.asarray(dy, np.float64))
    assert dw.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(dw), exact, rtol=1e-5, atol=1e-5)
    bf16_error = np.abs(np.asarray(jnp.asarray(exact, jnp.bfloat16), np.float64) - exact).max()
    assert np.abs(np.asarray(dw, np.float64) - exact).max() < bf16_error / 10


def test_rounded_weight_has_the_bf16_value_and_the_unrounded_gradient():
    w = jnp.asarray([1.0 + 2.0**-10, 0.3, -2.5], jnp.float32)
    g = jnp.asarray([1.0 + 2.0**-12, 0.1, 3.0], jnp.float32)
    value, vjp = jax.vjp(lambda w: rounded(w, jnp.bfloat16), w)
    assert value.dtype == jnp.float32
    np.testing.assert_array_equal(value, w.astype(jnp.bfloat16).astype(jnp.float32))
    np.testing.assert_array_equal(vjp(g)[0], g)  # through unchanged: not rounded to bf16 on the way
