"""Context parallelism (mesh.context): every sequence split into contiguous chunks over the `context`
mesh axis, attention gathering keys and values over it. The reference is the same run without the
axis: on 8 fake CPU devices in float32, packed documents masked within themselves and a sliding
window shorter than the sequence (the small run: window 16 at 64 tokens, so each context chunk of 16
sees keys of the chunk before it), every step's CE loss with context 4 equals that with context 1
within 1e-5 relative (float32 summation order only: a query that lost or gained one key moves the
loss by > 1e-3), as do the model's gradients at the same parameters (every element, and the first
step's gradient norm), and a run saved with context 4 resumes with context 1 on the same losses.
Later steps' gradient norms are not compared at 1e-5: Adam divides each element's update by that
element's own gradient scale, so the 1e-7 summation-order differences of the first gradient become
parameter differences that move the third step's gradient norm by about 1e-5 (measured: 6e-8 at
step 1, 3e-6 at step 2, 1.1e-5 at step 3, while the CE stays within 1e-7 at every step).
Plus: the splash step compiled for a TPU topology with a context axis, the per-layer collectives,
the bad-input errors, and the tiny demo command."""

import re
from collections import Counter

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from small_run import SMALL, small_config

from olmax.config.io import apply_overrides
from olmax.config.mesh import MeshConfig
from olmax.config.recipes import get_recipe
from olmax.errors import ConfigError
from olmax.model import attention as attn
from olmax.model.olmo3 import forward, init_params
from olmax.model.sharding import logical_to_spec, make_mesh
from olmax.trainer.run import train

RTOL = 1e-5
KEYS = ["train/CE loss", "optim/total grad norm"]
# packed documents of the demo corpus, masked within themselves, absolute positions, float32
PACKED = ["data.packing=obfd", "data.doc_masking=true", "model.compute_dtype=float32", "mesh.fsdp=-1"]


def _cfg(tmp_path, context, *extra):
    return small_config(
        tmp_path, *PACKED, f"mesh.context={context}", "trainer.max_steps=3", "checkpoint.every=2", *extra
    )


def _config(*extra):
    """The small run's config for a test that reads no data (the model, a compile, a config check):
    without small_config's copy of the tokenized demo corpus."""
    return apply_overrides(get_recipe("tiny"), SMALL + list(extra))


def _max_rel(a_rows, b_rows, keys=KEYS):
    return max(abs(a[k] - b[k]) / abs(a[k]) for a, b in zip(a_rows, b_rows, strict=True) for k in keys)


@pytest.mark.slow  # ~25 s: three small runs; the default suite keeps the gradient comparison below
def test_context_4_trains_as_context_1_and_resumes_without_it(tmp_path):
    """Steps 1-2 with context 4 (saved at 2), then step 3 resumed with context 1: every step's CE
    loss, and the first step's gradient norm, as the run without a context axis."""
    reference = train(_cfg(tmp_path, 1), tmp_path / "context1", progress=False)
    rows = train(_cfg(tmp_path, 4), tmp_path / "context4", stop_at=2, progress=False)
    rows += train(_cfg(tmp_path, 1), tmp_path / "context4", progress=False)
    assert [r["step"] for r in rows] == [1, 2, 3]
    rel = _max_rel(reference, rows, ["train/CE loss"])
    print(f"context 4 (steps 1-2), then 1: max relative |delta| of the CE loss = {rel:.2e}")
    assert rel <= RTOL
    assert _max_rel(reference[:1], rows[:1]) <= RTOL  # same parameters: the gradient norm too


def test_gradients_equal_those_without_context():
    """The model's loss and its gradient for every parameter, under a mesh with context 4 against
    no mesh at all, on packed documents whose windowed layers reach into the previous chunk. (The
    vocabulary cut to 512: the output layer over dolma2's was most of the test's time, and only the
    attention splits the sequence.)"""
    cfg = _config(*PACKED, "mesh.context=4", "model.vocab_size=512")
    rng = np.random.default_rng(0)
    seq, rows = cfg.data.seq_len, 4
    tokens = jnp.asarray(rng.integers(0, cfg.model.vocab_size, (rows, seq)), jnp.int32)
    doc_lens = np.zeros((rows, seq), np.int32)
    for row, lens in enumerate([[20, 30, 14], [64], [5, 40, 19], [33, 31]]):
        doc_lens[row, : len(lens)] = lens
    segments = attn.segment_ids(jnp.asarray(doc_lens))
    params = jax.jit(init_params, static_argnums=0)(cfg.model, jax.random.key(0))

    def loss(params, tokens, segments):
        logp = jax.nn.log_softmax(forward(params, tokens, cfg.model, segments=segments)[:, :-1], axis=-1)
        return -jnp.mean(jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1))

    want_loss, want = jax.jit(jax.value_and_grad(loss))(params, tokens, segments)
    mesh = make_mesh(cfg.mesh)
    with jax.set_mesh(mesh):
        place = lambda x: jax.device_put(x, NamedSharding(mesh, logical_to_spec(("batch", "seq"), x.shape, mesh)))
        got_loss, got = jax.jit(jax.value_and_grad(loss))(params, place(tokens), place(segments))
    np.testing.assert_allclose(float(got_loss), float(want_loss), rtol=RTOL)
    for (path, g), w in zip(jax.tree_util.tree_leaves_with_path(got), jax.tree.leaves(want), strict=True):
        g, w = np.asarray(g), np.asarray(w)  # compared on the host: an eager op per leaf compiled a program each
        assert np.max(np.abs(g - w)) <= RTOL * np.max(np.abs(w)), jax.tree_util.keystr(path)


def _collectives(text: str) -> Counter:
    ops = Counter()
    for line in text.splitlines():
        m = re.search(r"= (\S+) (all-gather|reduce-scatter)(-start)?\(", line)
        if m:
            ops[(m.group(2), m.group(1).split("{")[0])] += 1
    return ops


@pytest.mark.parametrize("backend", ["xla", "splash"])
def test_attention_gathers_keys_and_values_once_per_layer(backend):
    """Forward and backward of one attention call under a mesh with context 2 (splash: the Pallas
    kernel in interpret mode): the outputs and q/k/v gradients of the call without a mesh, one
    all-gather each of K and V, and one reduce-scatter each of dK and dV."""
    rng = np.random.default_rng(0)
    q, k, v = (jnp.asarray(rng.standard_normal((2, 256, n, 32), np.float32)) for n in (4, 2, 2))
    segments = attn.segment_ids(jnp.asarray([[60, 100, 96] + [0] * 253, [200, 56] + [0] * 254], jnp.int32))
    weights = jnp.cos(jnp.arange(256.0))[None, :, None, None]

    def loss(q, k, v):
        return jnp.sum(attn.attention(q, k, v, window=100, backend=backend, segments=segments) * weights)

    grad = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))
    ref_loss, ref_grads = grad(q, k, v)
    mesh = make_mesh(MeshConfig(data=1, fsdp=2, context=2, tensor=2))
    with jax.set_mesh(mesh):
        step = grad.lower(q, k, v).compile()  # the program that runs is the one whose collectives are counted
        got_loss, got_grads = step(q, k, v)
        ops = _collectives(step.as_text())
    np.testing.assert_allclose(float(got_loss), float(ref_loss), rtol=1e-5)
    for got, want in zip(got_grads, ref_grads, strict=True):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-5, rtol=1e-5)
    # k and v per device: batch 1 of 2 (fsdp), 128 of 256 positions, 1 of 2 kv heads (tensor)
    assert ops[("all-gather", "f32[1,256,1,32]")] == 2, ops
    assert ops[("reduce-scatter", "f32[1,128,1,32]")] == 2, ops


def _mosaic_operands(lowered) -> list[int]:
    """The operand count of every Mosaic kernel call in a lowered (StableHLO) program."""
    calls = [line for line in lowered.as_text().splitlines() if "@tpu_custom_call(" in line]
    return [len(line.split("@tpu_custom_call(")[1].split(")")[0].split(",")) for line in calls]


def test_splash_step_compiles_for_a_tpu_topology_with_a_context_axis():
    """The masked train step with context 2 on a v5p slice's 8 devices (v5p:2x2x2), compiled by the TPU compiler:
    every attention is a Mosaic kernel that takes the segment ids (two operands more than the same
    step unmasked), and the keys and values of each layer are gathered over `context` once, their
    gradients reduce-scattered once."""
    from olmax.fit.chips import chip_of_topology, compiler_options
    from olmax.fit.compiler import MOSAIC_CALL, topology_devices
    from olmax.step.state import abstract_state
    from olmax.step.train_step import batch_sharding, make_train_step

    overrides = ["model.n_layers=2", "model.vocab_size=512", "data.seq_len=256", "model.compute_dtype=bfloat16"]
    lowered = {}
    for masking in ("true", "false"):
        cfg = _config(*overrides, f"data.doc_masking={masking}", "mesh.fsdp=-1", "mesh.context=2")
        mesh = make_mesh(cfg.mesh, topology_devices("v5p:2x2x2"))
        assert dict(mesh.shape) == {"data": 1, "fsdp": 4, "context": 2, "tensor": 1}
        with jax.set_mesh(mesh):
            ids = jax.ShapeDtypeStruct((8, 256), "int32", sharding=batch_sharding(cfg, mesh))
            batch = {"input_ids": ids, "doc_lens": ids} if masking == "true" else {"input_ids": ids}
            lowered[masking] = make_train_step(cfg, mesh).lower(abstract_state(cfg, mesh), batch)
    masked, plain = _mosaic_operands(lowered["true"]), _mosaic_operands(lowered["false"])
    assert len(masked) == len(plain) >= 6 and [n - 2 for n in masked] == plain, (masked, plain)
    with jax.set_mesh(mesh):
        text = lowered["true"].compile(compiler_options=compiler_options(chip_of_topology("v5p:2x2x2"))).as_text()
    assert text.count(MOSAIC_CALL) >= 6  # fwd, dq and dkv of the windowed and the global layer
    ops = _collectives(text)
    # per device: 2 instances (fsdp 4), 1 kv head of 32; K and V of both layers gathered to all 256
    # positions once (the splash call is not rematerialised), dK and dV scattered back to 128
    assert sum(n for (op, shape), n in ops.items() if op == "all-gather" and shape.startswith("bf16[2,256,")) == 4, ops
    assert (
        sum(n for (op, shape), n in ops.items() if op == "reduce-scatter" and shape.startswith("bf16[2,128,")) == 4
    ), ops


@pytest.mark.parametrize(
    "overrides, match",
    [
        (["mesh.context=3"], r"data.seq_len=64 is not divisible by mesh.context=3"),
        (["mesh.context=4", "trainer.loss_chunk=32"], r"trainer.loss_chunk=32 does not divide one context chunk"),
        (["mesh.context=4", "model.attention=splash", "data.seq_len=256"], r"q tile 64 .*seq_len=256 / mesh.context=4"),
        (["mesh.context=0"], r"mesh.context must be a positive integer or -1"),
        (["mesh.context=2", "model.attention=cudnn"], r"model.attention=cudnn has no context-parallel form"),
    ],
)
def test_config_refuses_what_a_context_axis_cannot_split(overrides, match):
    with pytest.raises(ConfigError, match=match):
        _config(*overrides)


def test_auto_never_runs_cudnn_over_a_context_axis():
    """cuDNN has no context-parallel form: auto on a GPU runs xla under a context axis, splash keeps
    its own on a TPU, and a named cudnn is refused, also by a direct call under a context mesh."""
    assert attn.resolve_backend("auto", "gpu", jnp.bfloat16, context=True) == "xla"
    assert attn.resolve_backend("auto", "tpu", jnp.bfloat16, context=True) == "splash"
    with pytest.raises(ValueError, match="'cudnn' cannot split the sequence over mesh.context"):
        attn.resolve_backend("cudnn", "gpu", jnp.bfloat16, context=True)
    q = jax.ShapeDtypeStruct((2, 256, 4, 32), jnp.bfloat16)
    call = lambda q: attn.attention(q, q, q, window=None, backend="cudnn")
    with jax.set_mesh(make_mesh(MeshConfig(data=1, fsdp=-1, context=2))):
        with pytest.raises(ValueError, match="'cudnn' cannot split the sequence over mesh.context"):
            jax.eval_shape(call, q)


def test_mesh_refuses_a_context_that_does_not_divide_the_devices():
    with pytest.raises(ConfigError, match="mesh.context=3 does not divide the 8 devices"):
        make_mesh(MeshConfig(data=1, fsdp=-1, context=3))


def test_auto_on_a_tpu_checks_the_splash_tiles_of_a_context_chunk():
    """`auto` is splash only once the platform is known: the mesh of a TPU topology refuses a
    context chunk shorter than splash's smallest tile (128) before anything is traced."""
    from olmax.fit.compiler import topology_devices
    from olmax.step.train_step import batch_layout

    cfg = _config("mesh.fsdp=-1", "mesh.context=2")  # 64 tokens: chunks of 32
    batch_layout(cfg, make_mesh(cfg.mesh))  # xla on CPU: any chunk
    with pytest.raises(ConfigError, match=r"q tile 32 .*seq_len=64 / mesh.context=2"):
        batch_layout(cfg, make_mesh(cfg.mesh, topology_devices("tpu7x:2x2x1")))


def test_cli_exits_2_on_a_context_it_cannot_use():
    import subprocess
    import sys

    from typer.testing import CliRunner

    from olmax.cli.common import app

    olmax = [sys.executable, "-c", "from olmax.cli import main; main()"]
    r = subprocess.run([*olmax, "config", "--recipe", "tiny", "mesh.context=3"], capture_output=True, text=True)
    assert r.returncode == 2 and "data.seq_len=256 is not divisible by mesh.context=3" in r.stderr
    r = CliRunner().invoke(app, ["compile-check", "--recipe", "tiny", "mesh.context=3", "data.seq_len=384"])
    assert r.exit_code == 2 and "mesh.context=3 does not divide the 8 devices" in r.output


@pytest.mark.slow  # test_context_4_trains_as_context_1_and_resumes_without_it trains packed and masked over context 4
def test_the_tiny_demo_runs_packed_and_masked_over_a_context_axis(tmp_path):
    """The README's command: the tiny recipe on the demo corpus, packed, masked within documents,
    each 512-token sequence split over 4 devices (shortened here to 2 steps of a 2-layer model on 2
    sequences: the output layer over dolma2's vocabulary is most of a step's time on a CPU)."""
    args = ["data.packing=obfd", "data.doc_masking=true", "mesh.context=4", "mesh.fsdp=-1", "data.seq_len=512"]
    work_dir = small_config(tmp_path).data.work_dir  # the tokenized demo corpus, copied for this test
    shortened = ["trainer.max_steps=2", "model.n_layers=2", "trainer.global_batch=2", "eval.every=0"]
    shortened.append(f"data.work_dir={work_dir}")
    cfg = apply_overrides(get_recipe("tiny"), args + shortened)
    rows = train(cfg, tmp_path / "run", progress=False)
    assert [r["step"] for r in rows] == [1, 2]
    assert all(np.isfinite(r["train/CE loss"]) for r in rows)
