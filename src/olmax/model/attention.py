"""Causal (optionally sliding-window) attention behind one function, with selectable backends.

A window of W lets a token see itself and the W-1 tokens before it (OLMo-core, HF `sliding_window=W`).
Inputs are already rotated: q (batch, seq, n_heads, head_dim), k and v (batch, seq, n_kv_heads,
head_dim); query head h uses kv head h // (n_heads // n_kv_heads) (grouped-query attention).
Scores are scaled by 1/sqrt(head_dim) and the softmax runs in float32.

Backends (docs/attention.md):
  xla     explicit scores and mask; the reference, runs anywhere.
  cudnn   jax.nn.dot_product_attention with implementation="cudnn" (NVIDIA GPU, bf16/fp16 only).
  splash  Pallas splash attention (TPU); on any other platform it runs in Pallas interpret mode,
          which is slow but exact, so tests can check it on CPU.
"""

from __future__ import annotations

import functools
from typing import Optional

import jax
import jax.numpy as jnp
from jax.experimental.pallas.ops.tpu import splash_attention as splash
from jax.sharding import PartitionSpec

from olmax.sharding import logical_to_spec


def attention(q, k, v, *, window: Optional[int], backend: str = "xla"):
    if backend == "xla":
        return _xla_attention(q, k, v, window)
    if backend == "cudnn":
        return _cudnn_attention(q, k, v, window)
    if backend == "splash":
        return _splash_attention(q, k, v, window)
    raise ValueError(f"unknown attention backend {backend!r}")


def causal_mask(seq_len: int, window: Optional[int]) -> jnp.ndarray:
    """(seq, seq) boolean: query i may attend to key j."""
    i = jnp.arange(seq_len)[:, None]
    j = jnp.arange(seq_len)[None, :]
    mask = j <= i
    if window is not None:
        mask = mask & (i - j < window)
    return mask


def _xla_attention(q, k, v, window):
    """The reference: explicit scores, mask and float32 softmax. Runs on any device.

    The batched matmuls are 4-D, (batch, kv head) x (group * t, d) rows: the query heads that share
    a kv head are stacked along the rows, and the mask is tiled to match. XLA:CPU runs this layout
    about 1.6x faster, forward and backward, than positions-first or 5-D (group as its own axis)
    einsums (docs/performance.md)."""
    b, t, h, d = q.shape
    kv = k.shape[2]
    g = h // kv
    q = q.reshape(b, t, kv, g, d).transpose(0, 2, 3, 1, 4).reshape(b, kv, g * t, d)
    k, v = k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)  # (batch, kv, s, d)
    scores = jnp.einsum("bkmd,bksd->bkms", q, k, preferred_element_type=jnp.float32) * (d**-0.5)
    scores = jnp.where(jnp.tile(causal_mask(t, window), (g, 1)), scores, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
    out = jnp.einsum("bkms,bksd->bkmd", probs, v)
    return out.reshape(b, kv, g, t, d).transpose(0, 3, 1, 2, 4).reshape(b, t, h, d)


def dot_product_attention(q, k, v, window: Optional[int], implementation: str):
    """jax.nn.dot_product_attention with OLMo 3's causal window. The `cudnn` backend is this with
    implementation="cudnn"; tests run the identical call with implementation="xla" on CPU.

    `local_window_size=(W-1, 0)`: W-1 keys to the left plus the token itself, none to the right.
    GQA needs no repeat: the function groups query head h onto kv head h // (n_heads // n_kv_heads).
    """
    return jax.nn.dot_product_attention(
        q, k, v,
        is_causal=True,
        local_window_size=None if window is None else (window - 1, 0),
        implementation=implementation,
    )


def _cudnn_attention(q, k, v, window):
    """cuDNN's fused flash attention (GPU). cuDNN has no float32 kernel."""
    if q.dtype not in (jnp.bfloat16, jnp.float16):
        raise ValueError(
            f"attention backend 'cudnn' needs bfloat16 or float16 inputs, got {q.dtype}; "
            "set model.compute_dtype=bfloat16 or use model.attention=xla"
        )
    return dot_product_attention(q, k, v, window, "cudnn")


# Splash attention tiles the (query, key) plane into blocks and skips blocks the mask empties, so a
# window layer does ~seq*W work instead of seq^2/2. 128 is the smallest key tile the kernel accepts
# (its NUM_LANES); larger blocks (MaxText defaults to 512) are faster on TPU and numerically the same.
SPLASH_BLOCK = 128


@functools.lru_cache(maxsize=None)
def _splash_kernel(seq_len: int, window: Optional[int], n_heads: int, interpret: bool):
    """The kernel for one (seq_len, window, heads) shape. Building it walks the mask block by block
    in numpy, so it is built once per shape (every layer and step reuses it), not once per call.

    The kernel holds its block-sparsity tables as arrays; they are made under
    `ensure_compile_time_eval` so a first call inside `jit` caches concrete arrays, not tracers that
    would leak into the next trace.
    """
    if seq_len % SPLASH_BLOCK:
        raise ValueError(
            f"attention backend 'splash' needs a sequence length that is a multiple of "
            f"{SPLASH_BLOCK} (its block size), got seq_len={seq_len}"
        )
    shape = (seq_len, seq_len)
    if window is None:
        mask = splash.CausalMask(shape)
    else:
        # LocalMask keeps key j for query i when i - left <= j <= i + right.
        mask = splash.LocalMask(shape, window_size=(window - 1, 0), offset=0)
    b = SPLASH_BLOCK
    blocks = splash.BlockSizes(
        block_q=b, block_kv=b, block_kv_compute=b,
        block_q_dkv=b, block_kv_dkv=b, block_kv_dkv_compute=b,  # backward blocks: enables jax.grad
        block_q_dq=b, block_kv_dq=b,
    )
    with jax.ensure_compile_time_eval():
        return splash.make_splash_mha(
            splash.MultiHeadMask([mask] * n_heads),
            block_sizes=blocks,
            head_shards=1,
            q_seq_shards=1,
            interpret=interpret,
        )


def _splash_attention(q, k, v, window):
    """Pallas splash attention, vmapped over batch. The kernel takes (heads, seq, head_dim), groups
    query head h onto kv head h // (n_heads // n_kv_heads) itself, and does not scale q.

    XLA cannot partition a Mosaic kernel, so under a device mesh (`jax.set_mesh`) the kernel runs
    per shard in a shard_map: batch split as the rules table splits "batch", heads over "tensor"
    when both the query and the kv head counts divide by it.
    """
    if window is not None and window < 1:
        raise ValueError(f"attention window must be at least 1, got {window}")
    _, t, h, d = q.shape
    q = q * jnp.asarray(d**-0.5, q.dtype)
    interpret = jax.default_backend() != "tpu"

    def run(q, k, v):
        kernel = _splash_kernel(t, window, q.shape[2], interpret)
        heads_first = lambda x: x.transpose(0, 2, 1, 3)
        return heads_first(jax.vmap(kernel)(heads_first(q), heads_first(k), heads_first(v)))

    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or mesh.size == 1:
        return run(q, k, v)
    q_spec = logical_to_spec(("batch", "seq", "q_heads", "head_dim"), q.shape, mesh)
    kv_spec = logical_to_spec(("batch", "seq", "kv_heads", "head_dim"), k.shape, mesh)
    if q_spec[2] != kv_spec[2]:  # GQA groups must stay whole on a shard: keep heads unsplit
        q_spec = kv_spec = PartitionSpec(q_spec[0], None, None, None)
    return jax.shard_map(run, mesh=mesh, in_specs=(q_spec, kv_spec, kv_spec), out_specs=q_spec,
                         check_vma=False)(q, k, v)
