"""Attention within packed documents (data.doc_masking): segment ids from the loader's doc_lens, the
masked `xla` and `splash` backends against a mask written out position by position, the model on a
packed instance against each document run alone, and a short packed training run.

A packed instance must give every document the logits it has alone: attention sees only its own
document, and RoPE scores depend on position differences only, so both `rope_positions` give the
same function; they differ in rounding (absolute positions reach larger angles) and in which table
entries are used, which `test_rope_tables_follow_rope_positions` pins down. Tolerances: fp32, as
tests/model/test_attention.py (1e-5), and 2e-5 on tiny-model logits (|logits| < ~2; a token that sees one
key of another document moves them by > 1e-2).
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec
from small_run import SMALL, small_config

from olmax.config.io import apply_overrides
from olmax.config.mesh import MeshConfig
from olmax.config.recipes import TINY, get_recipe
from olmax.errors import ConfigError
from olmax.model import attention as attn
from olmax.model.olmo3 import forward, init_params, rope_for
from olmax.model.rope import rope_tables
from olmax.model.sharding import make_mesh
from olmax.step.train_step import make_train_step
from olmax.trainer.run import train

TOL = dict(atol=1e-5, rtol=1e-5)
SEQ = 256
# Two rows of loader-layout doc_lens: documents, then one padding segment, then zeros to seq_len.
DOCS = [[50, 100, 90, 16], [130, 120, 6]]


def _doc_lens(docs=DOCS, seq=SEQ):
    out = np.zeros((len(docs), seq), np.int32)
    for row, lens in enumerate(docs):
        out[row, : len(lens)] = lens
    return jnp.asarray(out)


def _reference_mask(docs, seq, window):
    """(batch, seq, seq): query i sees key j when j <= i, i - j < window, and the same document,
    written out one position pair at a time."""
    mask = np.zeros((len(docs), seq, seq), bool)
    for row, lens in enumerate(docs):
        doc = np.repeat(np.arange(len(lens)), lens)
        for i in range(seq):
            for j in range(i + 1):
                mask[row, i, j] = doc[i] == doc[j] and (window is None or i - j < window)
    return jnp.asarray(mask)


def _qkv(seq=SEQ, heads=4, kv_heads=2, head_dim=32, batch=2, seed=0):
    rng = np.random.default_rng(seed)
    shapes = [(batch, seq, n, head_dim) for n in (heads, kv_heads, kv_heads)]
    return tuple(jnp.asarray(rng.standard_normal(s, np.float32)) for s in shapes)


def _close(actual, expected, **tol):
    np.testing.assert_allclose(np.asarray(actual, np.float32), np.asarray(expected, np.float32), **(tol or TOL))


def test_segment_ids_and_document_positions():
    lens = jnp.asarray([[3, 5, 8] + [0] * 13, [16] + [0] * 15], jnp.int32)
    seg = attn.segment_ids(lens)
    np.testing.assert_array_equal(seg[0], [0] * 3 + [1] * 5 + [2] * 8)
    np.testing.assert_array_equal(seg[1], [0] * 16)
    pos = attn.document_positions(seg)
    np.testing.assert_array_equal(pos[0], [*range(3), *range(5), *range(8)])
    np.testing.assert_array_equal(pos[1], range(16))


@pytest.mark.parametrize("window", [None, 64, 1])
def test_xla_masked_matches_the_reference_mask(window):
    """Forward and the custom VJP's gradients against jax.nn.dot_product_attention's plain XLA path
    given the written-out mask."""
    q, k, v = _qkv()
    seg = attn.segment_ids(_doc_lens())
    mask = _reference_mask(DOCS, SEQ, window)[:, None]
    weights = jnp.asarray(np.random.default_rng(1).standard_normal(q.shape, np.float32))

    def loss(fn, q, k, v):
        f = lambda q, k, v: jnp.sum(fn(q, k, v) * weights)
        return jax.value_and_grad(f, argnums=(0, 1, 2))(q, k, v)

    masked = lambda q, k, v: attn.attention(q, k, v, window=window, backend="xla", segments=seg)
    reference = lambda q, k, v: jax.nn.dot_product_attention(q, k, v, mask=mask, implementation="xla")
    got, want = jax.jit(lambda *qkv: (loss(masked, *qkv), loss(reference, *qkv)))(q, k, v)  # one program
    _close(got[0], want[0], rtol=1e-5, atol=1e-3)  # a sum of 65536 terms
    for g, w in zip(got[1], want[1]):
        _close(g, w)


@pytest.mark.parametrize("window", [None, 64])
def test_splash_masked_matches_xla(window):
    """Splash's SegmentIds in Pallas interpret mode: outputs and its own backward kernels."""
    q, k, v = _qkv()
    seg = attn.segment_ids(_doc_lens())
    weights = jnp.asarray(np.random.default_rng(1).standard_normal(q.shape, np.float32))

    def output_and_grads(backend, q, k, v):
        """The outputs, and the gradients of sum(outputs * weights), from one forward pass."""
        f = lambda q, k, v: attn.attention(q, k, v, window=window, backend=backend, segments=seg)
        out, pullback = jax.vjp(f, q, k, v)
        return out, pullback(weights)

    # one program for both backends (run op by op, each operation of the interpreted kernels compiled alone)
    both = jax.jit(lambda *qkv: (output_and_grads("splash", *qkv), output_and_grads("xla", *qkv)))
    (out, grads), (want_out, want_grads) = both(q, k, v)
    _close(out, want_out)
    for g, w in zip(grads, want_grads):
        _close(g, w, atol=2e-5, rtol=1e-5)


def test_splash_masked_under_a_mesh_runs_per_shard():
    """Segment ids enter the shard_map split over the batch like q, k and v."""
    q, k, v = _qkv(batch=8)
    docs = DOCS * 4
    seg = attn.segment_ids(_doc_lens(docs))
    run = lambda backend: jax.jit(lambda a, b, c, s: attn.attention(a, b, c, window=64, backend=backend, segments=s))
    mesh = make_mesh(MeshConfig(fsdp=-1))
    with jax.set_mesh(mesh):
        place = lambda x: jax.device_put(x, NamedSharding(mesh, PartitionSpec("fsdp")))
        out = run("splash")(place(q), place(k), place(v), place(seg))
    _close(out, run("xla")(q, k, v, seg))


# Two layers in one scanned group (global_every 2): a windowed layer (48) and a global one, as in every
# group of the 7B, through the same scan.
MODEL = dataclasses.replace(
    TINY,
    vocab_size=1000,
    n_layers=2,
    global_every=2,
    sliding_window=48,
    compute_dtype="float32",
    attention="xla",
)


@pytest.fixture(scope="module")
def params():
    return jax.jit(init_params, static_argnums=0)(MODEL, jax.random.key(0))


@pytest.fixture(scope="module")
def alone(params):
    """The packed instance's tokens, and the logits of each of its documents run alone: every document
    at the start of a row of its own, in one batch (what follows it in the row cannot reach it:
    causal, tests/model/test_model.py), with row 0 of the instance unmasked last."""
    tokens = np.random.default_rng(1).integers(0, MODEL.vocab_size, (2, SEQ), np.int32)  # numpy: no draw to compile
    rows = [(row, start, n) for row, lens in enumerate(DOCS) for start, n in zip(np.cumsum([0, *lens[:-1]]), lens)]
    batch = np.zeros((len(rows) + 1, SEQ), np.int32)
    for i, (row, start, n) in enumerate(rows):
        batch[i, :n] = tokens[row, start : start + n]
    batch[-1] = tokens[0]
    # no segments, xla; sliced on the host (an eager slice of a device array compiles a program per shape)
    logits = np.asarray(jax.jit(lambda p, t: forward(p, t, MODEL))(params, jnp.asarray(batch)))
    return tokens, [(row, start, n, logits[i, :n]) for i, (row, start, n) in enumerate(rows)], logits[-1]


# The backend's mask and the RoPE positions are independent code: the default run takes each backend
# with one kind of positions, the slow run the other two pairs.
@pytest.mark.parametrize(
    "backend,rope_positions",
    [
        ("xla", "document"),
        ("splash", "absolute"),
        pytest.param("xla", "absolute", marks=pytest.mark.slow),
        pytest.param("splash", "document", marks=pytest.mark.slow),
    ],
)
def test_packed_instance_gives_each_documents_own_logits(backend, rope_positions, params, alone):
    """Row 0 packs three documents and a padding segment; each document's logits equal those of the
    document run alone (no segments, xla), on the sliding (window 48) and the global layer."""
    cfg = dataclasses.replace(MODEL, rope_positions=rope_positions, attention=backend)
    tokens, documents, unmasked = alone
    seg = attn.segment_ids(_doc_lens())
    packed = np.asarray(jax.jit(lambda p, t, s: forward(p, t, cfg, segments=s))(params, tokens, seg))
    for row, start, n, want in documents:
        _close(packed[row, start : start + n], want, atol=2e-5, rtol=1e-5)
    assert np.max(np.abs(unmasked[60:] - packed[0, 60:])) > 1e-2  # the mask matters


def test_without_segments_the_model_is_unchanged(params):
    """One document per row given as segments: the logits of no segments, for both rope_positions
    (one program for the four forward passes)."""
    tokens = np.random.default_rng(1).integers(0, MODEL.vocab_size, (2, 64), np.int32)
    one_doc = attn.segment_ids(jnp.zeros((2, 64), jnp.int32).at[:, 0].set(64))

    @jax.jit
    def both(params, tokens, segments):
        out = []
        for rope_positions in ("absolute", "document"):
            cfg = dataclasses.replace(MODEL, rope_positions=rope_positions)
            out.append((forward(params, tokens, cfg, segments=segments), forward(params, tokens, cfg)))
        return out

    for with_segments, without in both(params, tokens, one_doc):
        _close(with_segments, without)


def test_rope_tables_follow_rope_positions():
    """absolute: positions 0..seq-1 for every row whatever the documents; document: each document's
    tokens take table rows 0, 1, ... from its start."""
    seg = attn.segment_ids(_doc_lens())
    cos, sin = rope_tables(MODEL, SEQ, False)
    absolute = rope_for(dataclasses.replace(MODEL, rope_positions="absolute"), SEQ, False, seg)
    np.testing.assert_array_equal(absolute[0], cos)
    np.testing.assert_array_equal(absolute[1], sin)
    doc_cos, doc_sin = rope_for(dataclasses.replace(MODEL, rope_positions="document"), SEQ, False, seg)
    # sliced on the host: an eager slice of a device array compiles a program per shape
    (doc_cos, doc_sin, cos, sin) = (np.asarray(x) for x in (doc_cos, doc_sin, cos, sin))
    for row, lens in enumerate(DOCS):
        starts = np.cumsum([0, *lens[:-1]])
        for start, n in zip(starts, lens):
            np.testing.assert_array_equal(doc_cos[row, start : start + n], cos[:n])
            np.testing.assert_array_equal(doc_sin[row, start : start + n], sin[:n])


def test_auto_never_drops_the_mask():
    """auto on a GPU would pick cuDNN, which takes no segment ids: with doc masking it runs xla; a
    named cudnn backend is refused."""
    assert attn.resolve_backend("auto", "gpu", jnp.bfloat16, doc_masking=True) == "xla"
    assert attn.resolve_backend("auto", "gpu", jnp.bfloat16) == "cudnn"
    assert attn.resolve_backend("auto", "tpu", jnp.bfloat16, doc_masking=True) == "splash"
    with pytest.raises(ValueError, match="'cudnn' cannot mask attention within documents"):
        attn.resolve_backend("cudnn", "gpu", jnp.bfloat16, doc_masking=True)


@pytest.mark.parametrize(
    "overrides,match",
    [
        (["data.doc_masking=true", "model.attention=cudnn"], "model.attention=cudnn cannot do"),
        (["model.rope_positions=document"], "model.rope_positions=document .* needs the documents"),
    ],
)
def test_config_refuses_masking_it_cannot_apply(overrides, match):
    with pytest.raises(ConfigError, match=match):  # at build time: olmax config and --dry-run refuse it too
        apply_overrides(get_recipe("tiny"), SMALL + overrides)  # the small run's config (no data read)


@pytest.mark.slow  # the default run trains packed and masked in test_context_parallel.py (context 4)
def test_packed_training_run_with_doc_masking(tmp_path):
    """The small run on the demo corpus, packed and masked within documents, document positions."""
    args = ["data.packing=obfd", "data.doc_masking=true", "model.rope_positions=document", "trainer.max_steps=3"]
    rows = train(small_config(tmp_path, *args, "checkpoint.every=3"), tmp_path / "run", progress=False)
    assert [r["step"] for r in rows] == [1, 2, 3]
    losses = [r["train/CE loss"] for r in rows]
    assert all(np.isfinite(losses)), losses


@pytest.mark.slow  # the default suite's 10 minutes (docs/testing.md)
def test_train_step_loss_is_each_documents_own(tmp_path):
    """The step's CE on a batch with doc_lens (8 devices, micro-batches of 2, so the segment ids go
    through the accumulation scan) equals the CE of the same labels with every document's logits from
    the document run alone: the batch's doc_lens reach attention and RoPE."""
    overrides = ["data.doc_masking=true", "model.compute_dtype=float32", "model.attention=xla"]
    overrides += ["model.rope_positions=document", "mesh.fsdp=-1", "trainer.micro_batch_size=1"]
    cfg = small_config(tmp_path, *overrides)
    seq, rows = cfg.data.seq_len, cfg.trainer.global_batch
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, cfg.model.vocab_size, (rows, seq)).astype(np.int32)
    docs = []
    for _ in range(rows):
        cuts = np.sort(rng.choice(np.arange(1, seq), size=rng.integers(0, 4), replace=False))
        docs.append(np.diff(np.concatenate([[0], cuts, [seq]])).tolist())
    mesh = make_mesh(cfg.mesh)
    with jax.set_mesh(mesh):
        from olmax.step.state import init_train_state
        from olmax.step.train_step import batch_sharding

        state = init_train_state(cfg, mesh, jax.random.key(0))
        params = jax.device_get(state.params)
        place = lambda x: jax.device_put(x, batch_sharding(cfg, mesh))
        batch = {"input_ids": place(tokens), "doc_lens": place(np.asarray(_doc_lens(docs, seq)))}
        _, metrics = make_train_step(cfg, mesh)(state, batch)
    alone = jax.jit(lambda p, t: forward(p, t, cfg.model))
    total = 0.0
    for row, lens in enumerate(docs):
        starts = np.cumsum([0, *lens[:-1]])
        logits = np.concatenate([alone(params, tokens[row : row + 1, s : s + n])[0] for s, n in zip(starts, lens)])
        logp = jax.nn.log_softmax(logits[:-1], axis=-1)
        total -= float(jnp.sum(jnp.take_along_axis(logp, tokens[row, 1:, None], axis=-1)))
    np.testing.assert_allclose(float(metrics["ce_loss"]), total / (rows * (seq - 1)), rtol=1e-5)


def _mosaic_operands(lowered) -> list[int]:
    """The operand count of every Mosaic kernel call in a lowered (StableHLO) program."""
    calls = [line for line in lowered.as_text().splitlines() if "@tpu_custom_call(" in line]
    return [len(line.split("@tpu_custom_call(")[1].split(")")[0].split(",")) for line in calls]


@pytest.mark.slow  # test_context_parallel.py compiles the same masked step, with a context axis, by default
def test_masked_splash_step_compiles_for_a_tpu_topology(tmp_path):
    """The train step with doc_lens, compiled ahead of time by the TPU compiler for Ironwood (no TPU
    needed): auto resolves to splash for the topology, and every kernel call (forward, dq and dkv of
    the windowed and the global layer) takes two more operands than unmasked, the q and kv segment ids."""
    from olmax.fit.chips import chip_of_topology, compiler_options
    from olmax.fit.compiler import MOSAIC_CALL, topology_devices
    from olmax.step.state import abstract_state
    from olmax.step.train_step import batch_sharding

    overrides = ["model.n_layers=2", "model.vocab_size=512", "data.seq_len=128", "model.compute_dtype=bfloat16"]
    lowered = {}
    for masking in ("true", "false"):
        cfg = small_config(tmp_path, *overrides, f"data.doc_masking={masking}", "mesh.fsdp=-1")
        mesh = make_mesh(cfg.mesh, topology_devices("tpu7x:2x2x1"))
        with jax.set_mesh(mesh):
            ids = jax.ShapeDtypeStruct((8, 128), "int32", sharding=batch_sharding(cfg, mesh))
            batch = {"input_ids": ids, "doc_lens": ids} if masking == "true" else {"input_ids": ids}
            lowered[masking] = make_train_step(cfg, mesh).lower(abstract_state(cfg, mesh), batch)
    masked, plain = _mosaic_operands(lowered["true"]), _mosaic_operands(lowered["false"])
    assert len(masked) == len(plain) >= 6 and [n - 2 for n in masked] == plain, (masked, plain)
    with jax.set_mesh(mesh):
        compiled = lowered["true"].compile(compiler_options=compiler_options(chip_of_topology("tpu7x:2x2x1")))
    assert compiled.as_text().count(MOSAIC_CALL) >= 6
