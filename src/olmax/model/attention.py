"""Causal (optionally sliding-window) attention behind one function, with selectable backends.

A window of W lets a token see itself and the W-1 tokens before it (OLMo-core, HF `sliding_window=W`).
Inputs are already rotated: q (batch, seq, n_heads, head_dim), k and v (batch, seq, n_kv_heads,
head_dim); query head h uses kv head h // (n_heads // n_kv_heads) (grouped-query attention).
Scores are scaled by 1/sqrt(head_dim) and the softmax runs in float32.
"""

from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp


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
    """The reference: explicit scores, mask and float32 softmax. Runs on any device."""
    b, t, h, d = q.shape
    kv = k.shape[2]
    q = q.reshape(b, t, kv, h // kv, d)
    scores = jnp.einsum("btkgd,bskd->bkgts", q, k, preferred_element_type=jnp.float32) * (d**-0.5)
    scores = jnp.where(causal_mask(t, window), scores, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
    out = jnp.einsum("bkgts,bskd->btkgd", probs, v)
    return out.reshape(b, t, h, d)


def _cudnn_attention(q, k, v, window):
    """cuDNN's fused attention (GPU). `local_window_size=(W-1, 0)` is the token plus W-1 before it."""
    return jax.nn.dot_product_attention(
        q, k, v,
        is_causal=True,
        local_window_size=None if window is None else (window - 1, 0),
        implementation="cudnn",
    )


def _splash_attention(q, k, v, window):
    raise NotImplementedError("splash attention backend")
