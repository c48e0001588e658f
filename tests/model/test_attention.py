"""The attention backends against the `xla` reference (olmax.model.attention).

`xla` (blockwise, with its own custom VJP) is checked here against jax.nn.dot_product_attention's
plain XLA path, outputs and the gradients of q, k and v, and against transformers' and OLMo-core's
models by the parity tests; every other backend must reproduce it on CPU:
  splash  the real Pallas kernel, run in Pallas interpret mode (the same kernel body and block
          skipping, executed by XLA:CPU instead of compiled by Mosaic for a TPU);
  cudnn   the exact jax.nn.dot_product_attention call of the cudnn backend, with
          implementation="xla" (cuDNN itself needs a GPU; see docs/attention.md).

Tolerance (fp32): 1e-5 absolute and relative. Outputs are softmax-weighted means of v (|v| < ~5);
the backends differ only in summation order (splash's online softmax over blocks of 128) and in
scaling q before the dot product instead of the scores after it, each a few fp32 ulps (measured
max 6e-7). Moving the window edge by one token, the smallest real bug, changes outputs by > 0.4 on
these inputs (`test_tolerance_detects_off_by_one_window`).
"""

import dataclasses
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec

from olmax.config.mesh import MeshConfig
from olmax.config.model import ATTENTION_BACKENDS, SplashBlocks
from olmax.config.recipes import get_recipe
from olmax.model import attention as attn
from olmax.model.olmo3 import forward, init_params
from olmax.model.sharding import make_mesh

TOL = dict(atol=1e-5, rtol=1e-5)

# The calls the tests compare, each compiled as one program (per shapes and static arguments, and
# shared by the tests that make the same call): run eagerly, XLA:CPU compiles every operation of the
# xla backend on its own, ~1 s a call on the test machine against ~0.2 s. Calls that one test (or
# fixture) compares run together in one program: compiled one program per call, four splash
# kernels took twice the compile time of the four in one program.
attention = jax.jit(attn.attention, static_argnames=("window", "backend", "splash_blocks"))

# (seq, n_heads, n_kv_heads, head_dim, window); window None = global causal.
CASES = [
    (256, 4, 2, 32, None),  # global, GQA
    (256, 4, 4, 64, None),  # global, MHA
    (256, 4, 2, 32, 64),  # window inside one 128-block, GQA
    (256, 4, 4, 64, 100),  # odd window, MHA
    (256, 4, 2, 64, 100),  # odd window, GQA, head_dim 64
    (256, 2, 1, 32, 1),  # the token alone (output = its own v), one kv head for both q heads
]


def _qkv(seq, n_heads, n_kv_heads, head_dim, *, batch=2, dtype=jnp.float32, seed=0):
    """Standard-normal q, k, v (numpy's generator: no per-shape jax compile)."""
    rng = np.random.default_rng(seed)
    shapes = [(batch, seq, n, head_dim) for n in (n_heads, n_kv_heads, n_kv_heads)]
    return tuple(jnp.asarray(rng.standard_normal(s, np.float32), dtype) for s in shapes)


def _close(actual, expected, **tol):
    np.testing.assert_allclose(np.asarray(actual, np.float32), np.asarray(expected, np.float32), **(tol or TOL))


@pytest.fixture(scope="module")
def outputs():
    """For each of CASES (its `_qkv` inputs): the splash output, the cudnn backend's call run by
    dot_product_attention's XLA path, and the xla output, all from one program."""

    @jax.jit
    def run(inputs):
        return [
            (
                attn.attention(q, k, v, window=window, backend="splash"),
                attn.dot_product_attention(q, k, v, window, "xla"),
                attn.attention(q, k, v, window=window, backend="xla"),
            )
            for (q, k, v), (*_, window) in zip(inputs, CASES, strict=True)
        ]

    return dict(zip(CASES, run([_qkv(*case[:4]) for case in CASES]), strict=True))


@pytest.mark.parametrize("seq,heads,kv_heads,head_dim,window", CASES)
def test_splash_matches_xla(seq, heads, kv_heads, head_dim, window, outputs):
    splash, _, xla = outputs[seq, heads, kv_heads, head_dim, window]
    _close(splash, xla)


@pytest.mark.parametrize("seq,heads,kv_heads,head_dim,window", CASES)
def test_cudnn_call_matches_xla(seq, heads, kv_heads, head_dim, window, outputs):
    """The cudnn backend's argument mapping (window, causal, GQA), run by dot_product_attention's XLA path."""
    _, cudnn_call, xla = outputs[seq, heads, kv_heads, head_dim, window]
    _close(cudnn_call, xla)


# (seq, n_heads, n_kv_heads, head_dim, window, block): seq and window off the block grid, windows
# narrower and wider than a block, GQA and MHA, block 128 (the production value) and smaller ones.
BLOCKWISE_CASES = [
    (200, 4, 2, 32, None, 64),  # global GQA, last block 8 rows
    (200, 4, 2, 32, 50, 32),  # window < block, neither divides the other nor the sequence
    (256, 4, 4, 64, 100, 64),  # window spans two blocks, MHA
    (300, 4, 2, 64, 100, 128),  # production block, seq not a multiple of it
    (256, 6, 2, 32, 1000, 128),  # window wider than the sequence, group of 3
    (96, 2, 1, 32, 1, 32),  # the token alone
]


def _out_and_grads(fn, w, qkv):
    """fn's outputs and the gradients of sum(w * outputs) with respect to q, k and v, from one
    forward pass (one program: the compile is most of these tests' time)."""
    out, pullback = jax.vjp(fn, *qkv)
    return out, pullback(w)


@pytest.mark.parametrize("seq,heads,kv_heads,head_dim,window,block", BLOCKWISE_CASES)
def test_xla_blockwise_matches_plain_attention_forward_and_gradients(
    seq, heads, kv_heads, head_dim, window, block, monkeypatch
):
    """Outputs within 1e-5; each gradient within 1e-5 of its largest entry (entries reach ~5). The
    reference materialises the whole (seq, seq) softmax and is differentiated by autodiff."""
    monkeypatch.setattr(attn, "XLA_BLOCK", block)
    q, k, v = _qkv(seq, heads, kv_heads, head_dim, batch=1)
    w = jnp.asarray(np.random.default_rng(1).standard_normal(q.shape, np.float32))
    blockwise = lambda q, k, v: attn.attention(q, k, v, window=window, backend="xla")
    plain = lambda q, k, v: attn.dot_product_attention(q, k, v, window, "xla")
    (out, grads), (ref_out, ref_grads) = jax.jit(
        lambda *qkv: (_out_and_grads(blockwise, w, qkv), _out_and_grads(plain, w, qkv))
    )(q, k, v)
    _close(out, ref_out)
    for name, got, want in zip("qkv", grads, ref_grads):
        scale = max(float(np.abs(want).max()), 1.0)  # window 1: dq and dk are exactly 0
        np.testing.assert_allclose(got, want, atol=1e-5 * scale, rtol=0, err_msg=f"d{name}")


@pytest.mark.parametrize("seq,window,block", [(1024, 512, 128), (200, 50, 32), (200, None, 64)])
def test_blockwise_plan_covers_the_mask(seq, window, block):
    """The query blocks tile the sequence and every key a query may see lies in its block's band.
    On bench-small's windowed layers (seq 1024, window 512) the bands hold 47% of the (seq, seq)
    scores: the rest is never computed."""
    mask = np.asarray(attn.causal_mask(seq, window))
    plan = attn._blocks(seq, seq, window, block, None)
    assert [start for start, *_ in plan] == list(range(0, seq, block)) and plan[-1][1] == seq
    for start, end, lo, width in plan:
        assert end - start <= block and lo + width == end
        assert not mask[start:end, :lo].any() and not mask[start:end, end:].any()
        assert mask[start:end, lo].any() or lo == 0  # the band starts at the first key in reach
    if (seq, window) == (1024, 512):
        band = sum((end - start) * width for start, end, _, width in plan)
        assert band / seq**2 == pytest.approx(0.468, abs=1e-3)


@pytest.mark.parametrize("seq,window,chunks", [(1024, 512, 4), (1024, 100, 8), (512, None, 4)])
def test_blockwise_plan_of_a_context_chunk_covers_its_mask(seq, window, chunks):
    """Under context parallelism a chunk's place is known only on its device: every chunk's plan
    (bands of one width for all chunks, starting where the chunk's offset puts them) covers the
    keys each of its queries may see, within the gathered sequence."""
    mask = np.asarray(attn.causal_mask(seq, window))
    q_len = seq // chunks
    for c in range(chunks):
        offset = c * q_len
        for start, end, lo, width in attn._blocks(q_len, seq, window, 128, jnp.int32(offset)):
            lo = int(lo)
            assert 0 <= lo and lo + width <= seq
            rows = mask[offset + start : offset + end]
            assert not rows[:, :lo].any() and not rows[:, lo + width :].any()


def _widths(plan) -> list[int]:
    return sorted({width for *_, width in plan})


@pytest.mark.parametrize(
    "q_len,k_len,window,offset",
    [(4096, 4096, None, None), (4096, 4096, 1000, None), (8192, 65536, None, 7), (8192, 65536, 4096, 7)],
)
def test_long_plans_hold_at_most_the_width_limit_and_cover_the_mask(q_len, k_len, window, offset):
    """Long plans (32 and 64 blocks; the last: 7B stage 3's chunk of 8192 queries against 65,536
    gathered keys, as the last chunk) keep at most XLA_BAND_WIDTHS widths, in runs of consecutive
    blocks, and every band still holds the keys its queries may see and lies within the keys."""
    first = None if offset is None else offset * q_len
    plan = attn._blocks(q_len, k_len, window, 128, None if offset is None else jnp.int32(first))
    assert len(_widths(plan)) <= attn.XLA_BAND_WIDTHS
    runs = [width for width, _ in itertools.groupby(width for *_, width in plan)]
    assert len(runs) == len(set(runs)) <= attn.XLA_BAND_WIDTHS
    for start, end, lo, width in plan:
        lo = int(lo)
        i_first, i_last = (first or 0) + start, (first or 0) + end - 1  # the block's global query positions
        needed_lo = 0 if window is None else max(0, i_first - window + 1)
        assert 0 <= lo <= needed_lo and i_last < lo + width <= k_len


def test_long_causal_plan_widens_bands_by_at_most_an_eighth():
    """Without context, the 64 blocks of a global layer at 8192 tokens run in 8 widths, each that of
    the last of 8 consecutive blocks: 64 * (1 + ... + 8) block pairs against 1 + ... + 64 with a band
    per block, 9/8 * 64/65 as many scores (docs/attention.md)."""
    plan = attn._blocks(8192, 8192, None, 128, None)
    assert [width for *_, width in plan] == [1024 * (i // 8 + 1) for i in range(64)]
    scores = sum((end - start) * width for start, end, _, width in plan)
    exact = sum((end - start) * end for start, end, *_ in plan)
    assert scores / exact == pytest.approx(9 / 8 * 64 / 65, rel=1e-9)


def _document_mask(docs, seq, window):
    """(batch, 1, seq, seq): causal, within the window and within each row's documents (lengths)."""
    doc = np.stack([np.repeat(np.arange(len(lens)), lens) for lens in docs])
    i, j = np.arange(seq)[:, None], np.arange(seq)[None, :]
    mask = (j <= i) & ((i - j < window) if window else True) & (doc[:, :, None] == doc[:, None, :])
    return jnp.asarray(mask[:, None])


def _losses_and_grads(q, k, v, *fns):
    """For each fn: sum(w * fn(q, k, v)) and its q/k/v gradients, all fns in one program."""
    w = jnp.asarray(np.random.default_rng(1).standard_normal(q.shape, np.float32))
    value_and_grad = lambda fn: jax.value_and_grad(lambda *qkv: jnp.sum(w * fn(*qkv)), argnums=(0, 1, 2))
    return jax.jit(lambda *qkv: [value_and_grad(fn)(*qkv) for fn in fns])(q, k, v)


def _grads_close(got, want):
    for name, g, w in zip("qkv", got, want, strict=True):
        scale = max(float(np.abs(w).max()), 1.0)  # window 1: dq and dk are exactly 0
        np.testing.assert_allclose(g, w, atol=1e-5 * scale, rtol=0, err_msg=f"d{name}")


LONG_DOCS = [[150, 170, 80], [400]]
# The width limit these tests compile under: the merging of `_band_widths` is the same code at any
# limit (the long plans above keep the real one), and a program holds a scanned block per width, so
# a limit of 3 compiles far less than XLA_BAND_WIDTHS' 8 while the global and the windowed plan
# below are both cut to it.
WIDTH_LIMIT = 3


@pytest.mark.parametrize("window", [None, 50, 1])
def test_xla_plan_past_the_width_limit_matches_the_reference(window, monkeypatch):
    """Blocks of 16 queries over 400 tokens (25 blocks, more widths than the limit): bands widened
    and run as scans, with documents, GQA 4/2: the loss and q/k/v gradients of
    jax.nn.dot_product_attention given the mask written out."""
    monkeypatch.setattr(attn, "XLA_BLOCK", 16)
    monkeypatch.setattr(attn, "XLA_BAND_WIDTHS", WIDTH_LIMIT)
    plan = attn._blocks(400, 400, window, 16, None)
    assert len(plan) == 25 and max(len(list(run)) for _, run in itertools.groupby(w for *_, w in plan)) > 1
    assert len(_widths(plan)) <= WIDTH_LIMIT
    q, k, v = _qkv(400, 4, 2, 32)
    segments = attn.segment_ids(jnp.asarray([lens + [0] * (400 - len(lens)) for lens in LONG_DOCS], jnp.int32))
    mask = _document_mask(LONG_DOCS, 400, window)
    got, want = _losses_and_grads(
        q,
        k,
        v,
        lambda q, k, v: attn.attention(q, k, v, window=window, backend="xla", segments=segments),
        lambda q, k, v: jax.nn.dot_product_attention(q, k, v, mask=mask, implementation="xla"),
    )
    np.testing.assert_allclose(float(got[0]), float(want[0]), rtol=1e-5)
    _grads_close(got[1], want[1])


@pytest.mark.parametrize("window", [None, 100])
def test_xla_context_chunks_past_the_width_limit_match_the_reference(window, monkeypatch):
    """Context 4 over 512 tokens with blocks of 8 queries: 16 blocks per chunk at a traced offset, the
    global layer's 16 widths cut to the limit and the window's one width a scan of 16 blocks; the
    loss and q/k/v gradients of jax.nn.dot_product_attention without a mesh given the mask."""
    monkeypatch.setattr(attn, "XLA_BLOCK", 8)
    monkeypatch.setattr(attn, "XLA_BAND_WIDTHS", WIDTH_LIMIT)
    docs = [[100, 300, 112], [512]]
    q, k, v = _qkv(512, 4, 2, 32)
    segments = attn.segment_ids(jnp.asarray([lens + [0] * (512 - len(lens)) for lens in docs], jnp.int32))
    mask = _document_mask(docs, 512, window)
    (want,) = _losses_and_grads(
        q, k, v, lambda q, k, v: jax.nn.dot_product_attention(q, k, v, mask=mask, implementation="xla")
    )
    mesh = make_mesh(MeshConfig(data=1, fsdp=2, context=4, tensor=1))
    with jax.set_mesh(mesh):
        (got,) = _losses_and_grads(
            q, k, v, lambda q, k, v: attn.attention(q, k, v, window=window, backend="xla", segments=segments)
        )
    np.testing.assert_allclose(float(got[0]), float(want[0]), rtol=1e-5)
    _grads_close(got[1], want[1])


def test_xla_bfloat16_keeps_dtype_and_stays_close():
    """bf16 inputs: output and gradients come back in bf16, the output within ~2 bf16 ulps of fp32."""
    q, k, v = _qkv(256, 4, 2, 64, dtype=jnp.bfloat16)
    xla = lambda q, k, v: attn.attention(q, k, v, window=100, backend="xla")
    out, grads = jax.jit(lambda *qkv: _out_and_grads(xla, jnp.ones(q.shape, jnp.bfloat16), qkv))(q, k, v)
    ref = attention(*(x.astype(jnp.float32) for x in (q, k, v)), window=100, backend="xla")
    assert out.dtype == jnp.bfloat16
    _close(out, ref, atol=2e-2, rtol=0)
    assert all(g.dtype == jnp.bfloat16 and np.isfinite(np.asarray(g, np.float32)).all() for g in grads)


def test_window_one_sees_only_itself(outputs):
    _, _, v = _qkv(256, 2, 1, 32)
    _close(outputs[256, 2, 1, 32, 1][2], jnp.repeat(v, 2, axis=2))


def test_window_wider_than_sequence_is_global(outputs):
    q, k, v = _qkv(256, 4, 2, 32)
    _close(attention(q, k, v, window=1000, backend="splash"), outputs[256, 4, 2, 32, None][2])


def test_reference_groups_query_heads_like_repeat_kv(outputs):
    """Query head h reads kv head h // (n_heads // n_kv_heads): GQA equals MHA on kv repeated
    head by head (HF's repeat_kv), not tiled."""
    q, k, v = _qkv(256, 4, 2, 32)
    gqa = outputs[256, 4, 2, 32, 64][2]
    mha = attention(q, jnp.repeat(k, 2, axis=2), jnp.repeat(v, 2, axis=2), window=64, backend="xla")
    tiled = attention(q, jnp.tile(k, (1, 1, 2, 1)), jnp.tile(v, (1, 1, 2, 1)), window=64, backend="xla")
    _close(gqa, mha)
    assert np.abs(np.asarray(gqa) - np.asarray(tiled)).max() > 0.1


@pytest.mark.parametrize("head_dim,window", [(32, 64), (64, 100)])  # two of CASES: their xla output reused
def test_tolerance_detects_off_by_one_window(head_dim, window, outputs):
    q, k, v = _qkv(256, 4, 2, head_dim)
    exact = outputs[256, 4, 2, head_dim, window][2]
    wrong = (window - 1, window + 1)
    for off in jax.jit(lambda *qkv: [attn.attention(*qkv, window=w, backend="splash") for w in wrong])(q, k, v):
        assert np.abs(np.asarray(off) - np.asarray(exact)).max() > 1e4 * TOL["atol"]


def test_splash_bfloat16_close_to_float32():
    """The production dtype: splash in bf16 stays within ~2 bf16 ulps (|out| < 4) of the fp32 result."""
    q, k, v = _qkv(256, 4, 2, 64, dtype=jnp.bfloat16)
    out = attention(q, k, v, window=100, backend="splash")
    assert out.dtype == jnp.bfloat16
    ref = attention(*(x.astype(jnp.float32) for x in (q, k, v)), window=100, backend="xla")
    _close(out, ref, atol=2e-2, rtol=0)


def test_splash_gradients_match_xla():
    """The kernel's own backward (dq and dkv kernels, custom VJP) in interpret mode. Gradients reach
    ~6 here; measured differences <= 2e-6, so the fp32 tolerance holds."""
    q, k, v = _qkv(256, 4, 2, 32, batch=1)
    w = jnp.asarray(
        np.random.default_rng(1).standard_normal(q.shape, np.float32)
    )  # a loss that weights every output differently

    def grads(backend, q, k, v):
        loss = lambda q, k, v: jnp.sum(w * attn.attention(q, k, v, window=100, backend=backend))
        return jax.grad(loss, argnums=(0, 1, 2))(q, k, v)

    splash, xla = jax.jit(lambda *qkv: (grads("splash", *qkv), grads("xla", *qkv)))(q, k, v)  # one program
    for name, got, want in zip("qkv", splash, xla):
        np.testing.assert_allclose(got, want, **TOL, err_msg=f"d{name}")


def test_splash_kernel_reusable_across_traces():
    q, k, v = _qkv(256, 4, 2, 32, batch=1)
    first = jax.jit(lambda q, k, v: attn.attention(q, k, v, window=64, backend="splash"))(q, k, v)
    # A second trace of the same shape: nothing of the first trace (tracers) may leak into it.
    second = jax.jit(lambda q, k, v: 2.0 * attn.attention(q, k, v, window=64, backend="splash"))(q, k, v)
    _close(second, 2.0 * first)


def test_splash_block_sizes_do_not_change_the_result(outputs):
    """Tiles (q, kv, kv_compute) of 128 and 256 against the xla output (the default tiles are
    test_splash_matches_xla's: one 256 tile at these shapes)."""
    q, k, v = _qkv(256, 4, 2, 32)
    tiles = [SplashBlocks(128, 128, 128), SplashBlocks(256, 128, 128), SplashBlocks(256, 256, 128)]
    run = lambda *qkv: [attn.attention(*qkv, window=64, backend="splash", splash_blocks=b) for b in tiles]
    for blocks, out in zip(tiles, jax.jit(run)(q, k, v), strict=True):
        np.testing.assert_allclose(out, outputs[256, 4, 2, 32, 64][2], **TOL, err_msg=str(blocks))


def test_splash_rejects_a_tile_that_does_not_divide_the_sequence():
    q, k, v = _qkv(384, 4, 2, 32, batch=1)
    with pytest.raises(ValueError, match=r"model.splash_blocks.q.*seq_len=384"):
        attn.attention(q, k, v, window=64, backend="splash", splash_blocks=SplashBlocks(256, 128, 128))


def test_backend_table_is_the_configs_list():
    assert set(attn.BACKENDS) | {"auto"} == set(ATTENTION_BACKENDS)


@pytest.mark.parametrize(
    "platform, dtype, want",
    [
        ("tpu", jnp.bfloat16, "splash"),
        ("tpu", jnp.float32, "splash"),
        ("gpu", jnp.bfloat16, "cudnn"),
        ("cuda", jnp.float16, "cudnn"),
        ("gpu", jnp.float32, "xla"),  # cuDNN has no float32 kernel
        ("cpu", jnp.bfloat16, "xla"),
    ],
)
def test_auto_resolves_by_platform(platform, dtype, want):
    assert attn.resolve_backend("auto", platform, dtype) == want
    assert attn.resolve_backend("xla", platform, dtype) == "xla"  # a named backend is kept


def test_auto_runs_xla_on_cpu():
    q, k, v = _qkv(128, 2, 1, 32, batch=1)
    assert attn.target_platform() == "cpu"
    _close(attention(q, k, v, window=64, backend="auto"), attention(q, k, v, window=64, backend="xla"))


def test_target_platform_is_the_meshs_not_the_hosts():
    """Under a mesh of (abstract) TPU devices, `auto` resolves for the TPU although JAX runs on CPU."""
    from olmax.fit.compiler import topology_devices

    devices = topology_devices("v5p:2x2x1")
    seen = []

    def f(x):
        seen.append(attn.target_platform())
        return x

    with jax.set_mesh(make_mesh(MeshConfig(), devices)):
        jax.jit(f).trace(jax.ShapeDtypeStruct((4,), jnp.float32))
    assert seen == ["tpu"] and jax.default_backend() == "cpu"


def test_splash_rejects_sequence_not_multiple_of_block():
    q, k, v = _qkv(200, 4, 2, 32, batch=1)
    with pytest.raises(ValueError, match="seq_len=200"):
        attn.attention(q, k, v, window=64, backend="splash")


def test_cudnn_rejects_float32():
    q, k, v = _qkv(128, 2, 1, 32, batch=1)
    with pytest.raises(ValueError, match="bfloat16 or float16"):
        attn.attention(q, k, v, window=None, backend="cudnn")


def test_unknown_backend_is_an_error():
    q, k, v = _qkv(128, 2, 1, 32, batch=1)
    with pytest.raises(ValueError, match="flash"):
        attn.attention(q, k, v, window=None, backend="flash")


def test_tiny_model_with_splash_matches_xla():
    """The tiny OLMo 3 (GQA 4/2, fp32) at seq 256, cut to its first two layers in one scanned group
    (global_every 2): a layer windowed at 64 and a global one, as every group of the recipe's. The
    vocabulary is cut to 1024: attention never sees it, and initialising the 100k-row embedding and
    LM head costs ~10 s on the test machine."""
    cfg = dataclasses.replace(get_recipe("tiny").model, vocab_size=1024, n_layers=2, global_every=2)
    params = jax.jit(init_params, static_argnums=0)(cfg, jax.random.key(0))
    tokens = np.random.default_rng(1).integers(0, cfg.vocab_size, (1, 256), np.int32)
    splash_cfg = dataclasses.replace(cfg, attention="splash")
    got, want = jax.jit(lambda p, t: (forward(p, t, splash_cfg), forward(p, t, cfg)))(params, tokens)
    _close(got, want)


@pytest.mark.parametrize("mesh_cfg", [MeshConfig(data=2, fsdp=2, tensor=2), MeshConfig(data=1, fsdp=8, tensor=1)])
def test_splash_under_a_mesh_runs_per_shard(mesh_cfg):
    """On TPU a Mosaic kernel cannot be partitioned by XLA: under a mesh splash runs in a shard_map
    (batch over data x fsdp, heads over tensor). Interpret mode would hide a missing shard_map, so
    this checks the shard_map path itself gives the reference result."""
    mesh = make_mesh(mesh_cfg)
    q, k, v = _qkv(256, 4, 2, 32, batch=8)
    ref = attention(q, k, v, window=100, backend="xla")
    with jax.set_mesh(mesh):
        batch = NamedSharding(mesh, PartitionSpec(("data", "fsdp")))
        q, k, v = (jax.device_put(x, batch) for x in (q, k, v))
        out = jax.jit(lambda a, b, c: attn.attention(a, b, c, window=100, backend="splash"))(q, k, v)
    _close(out, ref)
