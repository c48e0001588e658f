"""Causal (optionally sliding-window) attention behind one function, with selectable backends.

A window of W lets a token see itself and the W-1 tokens before it (OLMo-core, HF `sliding_window=W`).
With segment ids (batch, seq) int32 (`segment_ids`: one id per packed document), a token also sees
only keys of its own segment: causal AND window AND same document, OLMo-core's varlen attention over
`cu_doc_lens`. Without them (None) nothing changes: the same program as before.
Inputs are already rotated: q (batch, seq, n_heads, head_dim), k and v (batch, seq, n_kv_heads,
head_dim); query head h uses kv head h // (n_heads // n_kv_heads) (grouped-query attention).
Scores are scaled by 1/sqrt(head_dim) and the softmax runs in float32.

Backends (docs/attention.md), the table BACKENDS:
  xla     plain JAX, blockwise with a flash-style custom VJP; runs anywhere, the reference.
  cudnn   jax.nn.dot_product_attention with implementation="cudnn" (NVIDIA GPU, bf16/fp16 only);
          it takes no segment ids (jax 0.10.2's public call has no document mask), so it refuses them.
  splash  Pallas splash attention (TPU); on any other platform it runs in Pallas interpret mode,
          which is slow but exact, so tests can check it on CPU.
  auto    the fast kernel of the platform the step compiles for (`resolve_backend`).
"""

from __future__ import annotations

import contextlib
import functools
import logging
from typing import Callable, Optional

import jax
import jax.numpy as jnp
from jax.experimental.pallas.ops.tpu import splash_attention as splash
from jax.sharding import PartitionSpec

from olmax.config import MASKING_BACKENDS, SplashBlocks
from olmax.sharding import logical_to_spec

log = logging.getLogger(__name__)

# `auto`: the platform the step compiles for -> its backend. Any other platform (cpu) gets xla.
AUTO_BACKENDS = {"tpu": "splash", "gpu": "cudnn", "cuda": "cudnn"}


def resolve_backend(backend: str, platform: str, dtype=jnp.bfloat16, *, doc_masking: bool = False) -> str:
    """The backend that runs: `auto` becomes the platform's fast kernel (xla where that kernel
    cannot take the inputs: cuDNN has no float32 kernel and no document mask), any other name stays;
    a named backend that cannot mask within documents is an error when `doc_masking`."""
    if backend == "auto":
        name = AUTO_BACKENDS.get(platform, "xla")
        if name == "cudnn" and jnp.dtype(dtype) not in (jnp.bfloat16, jnp.float16):
            return "xla"
        if doc_masking and name not in MASKING_BACKENDS:
            log.warning(
                "attention: %s cannot mask within documents; auto runs the xla backend for data.doc_masking", name
            )
            return "xla"
        return name
    if backend not in BACKENDS:
        raise ValueError(f"unknown attention backend {backend!r}; known: auto, {', '.join(BACKENDS)}")
    if doc_masking and backend not in MASKING_BACKENDS:
        raise ValueError(
            f"attention backend {backend!r} cannot mask attention within documents (jax's cuDNN call takes no "
            f"segment ids): with data.doc_masking=true use model.attention=auto or one of {', '.join(MASKING_BACKENDS)}"
        )
    return backend


def segment_ids(doc_lens: jnp.ndarray) -> jnp.ndarray:
    """doc_lens (batch, seq) int32, each row the lengths of its segments in order then zeros (the
    loader's `doc_lens`: documents, then one segment for the padding) -> (batch, seq) int32: the index
    of the segment each token is in. Token t is in segment #{segments ending at or before t}."""
    ends = jnp.cumsum(doc_lens, axis=1)  # non-decreasing: trailing zeros repeat the total
    positions = jnp.arange(doc_lens.shape[1], dtype=ends.dtype)
    return jax.vmap(lambda e: jnp.searchsorted(e, positions, side="right"))(ends).astype(jnp.int32)


def document_positions(segments: jnp.ndarray) -> jnp.ndarray:
    """segment ids (batch, seq) -> (batch, seq) int32: each token's offset from the start of its segment
    (positions restarting at 0 on every document)."""
    pos = jnp.arange(segments.shape[1], dtype=jnp.int32)
    starts = jnp.concatenate([jnp.ones_like(segments[:, :1], bool), segments[:, 1:] != segments[:, :-1]], axis=1)
    return pos - jax.lax.cummax(jnp.where(starts, pos, 0), axis=1)


def target_platform() -> str:
    """The platform of the mesh the step is being built under (`jax.set_mesh`), which for an
    ahead-of-time compile is the target topology's, not the host's; without a mesh, the default
    backend's."""
    device = jax.sharding.get_abstract_mesh().abstract_device
    return device.platform if device is not None else jax.default_backend()


def attention(
    q,
    k,
    v,
    *,
    window: Optional[int],
    backend: str = "xla",
    splash_blocks: Optional[SplashBlocks] = None,
    segments: Optional[jnp.ndarray] = None,
):
    """backend: a BACKENDS name or `auto`. splash_blocks: the splash kernel's tiles (default
    SplashBlocks()). segments: (batch, seq) int32 segment ids (`segment_ids`), or None (no document mask)."""
    name = resolve_backend(backend, target_platform(), q.dtype, doc_masking=segments is not None)
    if name == "splash":
        return _splash_attention(q, k, v, window, splash_blocks or SplashBlocks(), segments)
    if name == "xla":
        return _xla_attention(q, k, v, window, segments)
    return BACKENDS[name](q, k, v, window)


def window_mask(i, j, window: Optional[int]):
    """Boolean, broadcasting query positions i against key positions j: may query i see key j?"""
    mask = j <= i
    return mask if window is None else mask & (i - j < window)


def causal_mask(seq_len: int, window: Optional[int]) -> jnp.ndarray:
    """(seq, seq) boolean: query i may attend to key j."""
    return window_mask(jnp.arange(seq_len)[:, None], jnp.arange(seq_len)[None, :], window)


# Query positions per block of the `xla` backend. 128 ran bench-small's attention (seq 1024,
# window 512) fwd+bwd faster than 64 or 256 on XLA:CPU (benchmarks/attention.py, docs/performance.md).
XLA_BLOCK = 128


def _blocks(seq_len: int, window: Optional[int], block: int):
    """Static plan: (first query, end query, first key) per query block. The keys a block may see
    form one band, [first query - window + 1, end query), so its scores are computed for that band
    only: the fully masked rest (the future, and beyond the window) is never touched."""
    return [
        (start, min(start + block, seq_len), 0 if window is None else max(0, start - window + 1))
        for start in range(0, seq_len, block)
    ]


_f32_einsum = functools.partial(jnp.einsum, preferred_element_type=jnp.float32)


def _block_scores(q, k, start, lo, window, group, segments):
    """Scaled, masked float32 scores of one block: rows ordered (position, group), keys from lo. The
    mask comes from iotas, which XLA fuses into the same loop as the scaling (no mask constants); with
    segment ids, a key of another segment is masked too (every row keeps at least its own token)."""
    s = _f32_einsum("bkmd,bksd->bkms", q, k) * q.shape[-1] ** -0.5
    i = start + jnp.arange(q.shape[2])[:, None] // group
    j = lo + jnp.arange(k.shape[2])[None, :]
    mask = window_mask(i, j, window)
    if segments is not None:
        seg_q = jnp.repeat(segments[:, start : start + q.shape[2] // group], group, axis=1)
        mask = mask & (seg_q[:, None, :, None] == segments[:, None, None, lo : lo + k.shape[2]])
    return jnp.where(mask, s, jnp.finfo(jnp.float32).min)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5))
def _banded_attention(q, k, v, segments, window, group):
    return _banded_forward(q, k, v, segments, window, group)[0]


def _banded_forward(q, k, v, segments, window, group):
    """q (batch, kv, seq * group, d), rows ordered (position, group); k, v (batch, kv, seq, d);
    segments (batch, seq) or None. Per query block: scores over its key band, a float32 softmax, and
    its log-sum-exp, which is all the backward pass keeps of the probabilities."""
    outs, lses = [], []
    for start, end, lo in _blocks(k.shape[2], window, XLA_BLOCK):
        s = _block_scores(q[:, :, start * group : end * group], k[:, :, lo:end], start, lo, window, group, segments)
        m = jnp.max(s, axis=-1, keepdims=True)
        p = jnp.exp(s - m)
        total = jnp.sum(p, axis=-1, keepdims=True)
        # Normalising the (rows, d) output rather than the (rows, keys) probabilities: one pass less.
        out = _f32_einsum("bkms,bksd->bkmd", p.astype(v.dtype), v[:, :, lo:end])
        outs.append((out / total).astype(v.dtype))
        lses.append(m + jnp.log(total))
    out = jnp.concatenate(outs, axis=2)
    return out, (q, k, v, segments, out, jnp.concatenate(lses, axis=2))


def _banded_backward(window, group, residuals, dout):
    """Flash-attention's backward, block by block: the probabilities are recomputed from q, k and the
    saved log-sum-exp with one exponential, and with D = rowsum(dout * out),
    dS = P * (dout V^T - D); dq = dS K, dk = dS^T q, dv = P^T dout (scale folded into dq and dk)."""
    q, k, v, segments, out, lse = residuals
    scale = q.shape[-1] ** -0.5
    delta = jnp.sum(dout.astype(jnp.float32) * out.astype(jnp.float32), axis=-1, keepdims=True)
    dq_blocks = []
    dk = jnp.zeros(k.shape, jnp.float32)
    dv = jnp.zeros(v.shape, jnp.float32)
    for start, end, lo in _blocks(k.shape[2], window, XLA_BLOCK):
        rows = slice(start * group, end * group)
        qb, kb, vb, do = q[:, :, rows], k[:, :, lo:end], v[:, :, lo:end], dout[:, :, rows]
        p = jnp.exp(_block_scores(qb, kb, start, lo, window, group, segments) - lse[:, :, rows])
        dp = _f32_einsum("bkmd,bksd->bkms", do, vb)
        ds = p * (dp - delta[:, :, rows]) * scale
        dq_blocks.append(_f32_einsum("bkms,bksd->bkmd", ds.astype(k.dtype), kb))
        dk = dk.at[:, :, lo:end].add(_f32_einsum("bkms,bkmd->bksd", ds.astype(q.dtype), qb))
        dv = dv.at[:, :, lo:end].add(_f32_einsum("bkms,bkmd->bksd", p.astype(do.dtype), do))
    dq = jnp.concatenate(dq_blocks, axis=2)
    # segment ids are integers: no cotangent (None)
    return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype), None


_banded_attention.defvjp(_banded_forward, _banded_backward)


def _xla_attention(q, k, v, window, segments=None):
    """Plain JAX, any device: blockwise over queries, each block against only the keys its causal
    window allows, with a flash-style custom VJP (`_banded_backward`). On XLA:CPU the time went into
    elementwise passes over the (seq, seq) float32 scores; this skips the masked part (more than
    half of it on a window-512 layer of 1024 tokens) and its backward takes one exponential pass
    instead of re-running and differentiating the softmax.

    Layout: (batch, kv head) x (position * group, d) 4-D batched matmuls, the query heads sharing a
    kv head stacked along the rows, which XLA:CPU runs faster than positions-first or 5-D einsums."""
    b, t, h, d = q.shape
    kv = k.shape[2]
    g = h // kv
    if window is not None and window < 1:
        raise ValueError(f"attention window must be at least 1, got {window}")
    q = q.reshape(b, t, kv, g, d).transpose(0, 2, 1, 3, 4).reshape(b, kv, t * g, d)
    k, v = k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)
    out = _banded_attention(q, k, v, segments, window, g)
    return out.reshape(b, kv, t, g, d).transpose(0, 2, 1, 3, 4).reshape(b, t, h, d)


def dot_product_attention(q, k, v, window: Optional[int], implementation: str):
    """jax.nn.dot_product_attention with OLMo 3's causal window. The `cudnn` backend is this with
    implementation="cudnn"; tests run the identical call with implementation="xla" on CPU.

    `local_window_size=(W-1, 0)`: W-1 keys to the left plus the token itself, none to the right.
    GQA needs no repeat: the function groups query head h onto kv head h // (n_heads // n_kv_heads).
    """
    return jax.nn.dot_product_attention(
        q,
        k,
        v,
        is_causal=True,
        local_window_size=None if window is None else (window - 1, 0),
        implementation=implementation,
    )


@contextlib.contextmanager
def cudnn_target(compute_capability: str):
    """Within: jax's cuDNN attention checks take the GPU generation to be `compute_capability`
    ("9.0"), the target's when the step is compiled ahead of time for a GPU this host lacks.

    jax 0.10.2 (jax/_src/cudnn/fused_attention_stablehlo.py, check_compute_capability and
    is_cuda_compute_capability_equal) asks the host's default backend for the capability; on a CPU
    host that is no GPU at all, so the checks treat the target as older than Hopper and refuse
    head_dim 256 ("The head dim must be <= 128"), which an H100 runs. Only these two checks change,
    and only while a step is traced for the target (olmax.compile_check)."""
    from jax._src.cudnn import fused_attention_stablehlo as cudnn_checks

    current = tuple(int(x) for x in compute_capability.split("."))
    at_least = lambda capability: current >= tuple(int(x) for x in capability.split("."))
    equal = lambda capability: current == tuple(int(x) for x in capability.split("."))
    saved = cudnn_checks.check_compute_capability, cudnn_checks.is_cuda_compute_capability_equal
    cudnn_checks.check_compute_capability, cudnn_checks.is_cuda_compute_capability_equal = at_least, equal
    try:
        yield
    finally:
        cudnn_checks.check_compute_capability, cudnn_checks.is_cuda_compute_capability_equal = saved


def _cudnn_attention(q, k, v, window):
    """cuDNN's fused flash attention (GPU). cuDNN has no float32 kernel."""
    if q.dtype not in (jnp.bfloat16, jnp.float16):
        raise ValueError(
            f"attention backend 'cudnn' needs bfloat16 or float16 inputs, got {q.dtype}; "
            "set model.compute_dtype=bfloat16 or use model.attention=xla"
        )
    return dot_product_attention(q, k, v, window, "cudnn")


# Splash attention tiles the (query, key) plane into blocks and skips blocks the mask empties, so a
# window layer does ~seq*W work instead of seq^2/2. The tiles are config (model.splash_blocks); a
# sequence shorter than a tile uses the sequence as the tile.


def _splash_kernel(seq_len: int, window: Optional[int], n_heads: int, blocks: SplashBlocks, interpret: bool):
    """The kernel for one shape, made inside the trace that calls it: its block-sparsity tables
    (numpy) enter that trace as constants, so nothing is placed on the host's default device (which
    an ahead-of-time compile for a TPU topology cannot use) and no tracer outlives its trace. The
    expensive part, walking the mask block by block, is cached by splash itself (its
    `_process_mask` keeps the last 12 masks), so every layer and step after the first reuses it.
    """
    q_block, kv_block, kv_compute = (min(b, seq_len) for b in (blocks.q, blocks.kv, blocks.kv_compute))
    for name, b in (("q", q_block), ("kv", kv_block), ("kv_compute", kv_compute)):
        if seq_len % b or b % 128:
            raise ValueError(
                f"attention backend 'splash': its {name} tile {b} (model.splash_blocks.{name}, at most "
                f"the sequence) must be a multiple of 128 that divides seq_len={seq_len}"
            )
    if kv_block % kv_compute:
        raise ValueError(f"model.splash_blocks.kv_compute={kv_compute} must divide model.splash_blocks.kv={kv_block}")
    shape = (seq_len, seq_len)
    if window is None:
        mask = splash.CausalMask(shape)
    else:
        # LocalMask keeps key j for query i when i - left <= j <= i + right.
        mask = splash.LocalMask(shape, window_size=(window - 1, 0), offset=0)
    sizes = splash.BlockSizes(
        block_q=q_block,
        block_kv=kv_block,
        block_kv_compute=kv_compute,
        # backward blocks (they enable jax.grad): the forward's tiles
        block_q_dkv=q_block,
        block_kv_dkv=kv_block,
        block_kv_dkv_compute=kv_compute,
        block_q_dq=q_block,
        block_kv_dq=kv_block,
    )
    return splash.make_splash_mha(
        splash.MultiHeadMask([mask] * n_heads),
        block_sizes=sizes,
        head_shards=1,
        q_seq_shards=1,
        interpret=interpret,
    )


def _splash_attention(q, k, v, window, blocks: SplashBlocks, segments=None):
    """Pallas splash attention, vmapped over batch. The kernel takes (heads, seq, head_dim), groups
    query head h onto kv head h // (n_heads // n_kv_heads) itself, and does not scale q. Segment ids
    go in as its `SegmentIds(q, kv)`, which the kernel AND-s with the causal/local mask.

    XLA cannot partition a Mosaic kernel, so under a device mesh (`jax.set_mesh`) the kernel runs
    per shard in a shard_map: batch split as the rules table splits "batch", heads over "tensor"
    when both the query and the kv head counts divide by it.
    """
    if window is not None and window < 1:
        raise ValueError(f"attention window must be at least 1, got {window}")
    _, t, h, d = q.shape
    q = q * jnp.asarray(d**-0.5, q.dtype)
    interpret = target_platform() != "tpu"

    def run(q, k, v, *segments):
        kernel = _splash_kernel(t, window, q.shape[2], blocks, interpret)
        heads_first = lambda x: x.transpose(0, 2, 1, 3)
        q, k, v = heads_first(q), heads_first(k), heads_first(v)
        if segments:
            out = jax.vmap(lambda q, k, v, s: kernel(q, k, v, segment_ids=splash.SegmentIds(s, s)))(q, k, v, *segments)
        else:
            out = jax.vmap(kernel)(q, k, v)
        return heads_first(out)

    args = (q, k, v) if segments is None else (q, k, v, segments)
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or mesh.size == 1:
        return run(*args)
    q_spec = logical_to_spec(("batch", "seq", "q_heads", "head_dim"), q.shape, mesh)
    kv_spec = logical_to_spec(("batch", "seq", "kv_heads", "head_dim"), k.shape, mesh)
    if q_spec[2] != kv_spec[2]:  # GQA groups must stay whole on a shard: keep heads unsplit
        q_spec = kv_spec = PartitionSpec(q_spec[0], None, None, None)
    specs = (q_spec, kv_spec, kv_spec, PartitionSpec(q_spec[0], None))[: len(args)]
    return jax.shard_map(run, mesh=mesh, in_specs=specs, out_specs=q_spec, check_vma=False)(*args)


BACKENDS: dict[str, Callable] = {
    "xla": _xla_attention,
    "cudnn": _cudnn_attention,
    "splash": _splash_attention,
}
