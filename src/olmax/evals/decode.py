"""The model pass with a key/value cache, on olmax.model.olmo3's own block (for olmax.evals.generate).

`cached_forward(params, cache, tokens, start, cfg)` runs `tokens` (batch, T) whose row b sits at
positions start[b] .. start[b] + T - 1, writes their keys and values into the cache at those
positions, and attends each query to the cached keys it may see: key position j is visible from
query position i when j <= i and, on a sliding-window layer, i - j < window (the token and the W-1
before it, as in training). A prefill is one call with start = 0 and right-padded prompts; each
decoding step is one call with T = 1, so generating n tokens costs n single-token passes over the
cache instead of n growing full forwards (linear in n, not quadratic).

Right padding is harmless: a row's padded positions hold garbage keys only until that row's own
generated tokens overwrite them, and a query never sees a position beyond its own.

Each layer runs `olmax.model.olmo3.block`, the block training uses, with an `attend` that reads and
writes the cache; tests/test_evals_decode.py checks the logits of prefill and of every decoding step
against `olmax.model.olmo3.forward` on the full sequence, with a window shorter than the sequence.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from olmax.config import ModelConfig
from olmax.model.olmo3 import block, final_norm, lm_head
from olmax.model.rope import rope_tables


def init_cache(cfg: ModelConfig, batch: int, length: int) -> dict:
    shape = (cfg.n_layers, batch, length, cfg.n_kv_heads, cfg.head_dim)
    dtype = jnp.dtype(cfg.compute_dtype)
    return {"k": jnp.zeros(shape, dtype), "v": jnp.zeros(shape, dtype)}


def _layer_windows(cfg: ModelConfig, length: int) -> jnp.ndarray:
    """Each layer's window as a number; a global layer gets one longer than the cache."""
    return jnp.asarray([cfg.layer_window(i) or length + 1 for i in range(cfg.n_layers)], jnp.int32)


def _cache_attention(k_cache, v_cache, start, positions, window):
    """The `attend` of olmax.model.olmo3.block for one layer with a KV cache: writes this call's keys
    and values at positions start[b].., then attends each query to the cached keys it may see.
    Returns (output, (k_cache, v_cache))."""

    def attend(q, k, v):
        k_all = _write(k_cache, k.astype(k_cache.dtype), start)
        v_all = _write(v_cache, v.astype(v_cache.dtype), start)
        b, t, h, d = q.shape
        kv = k_all.shape[2]
        k_pos = jnp.arange(k_all.shape[1])
        visible = (k_pos[None, None, :] <= positions[:, :, None]) & (
            positions[:, :, None] - k_pos[None, None, :] < window
        )
        scores = jnp.einsum(
            "btkgd,bskd->bkgts", q.reshape(b, t, kv, h // kv, d), k_all, preferred_element_type=jnp.float32
        ) * (d**-0.5)
        scores = jnp.where(visible[:, None, None], scores, jnp.finfo(jnp.float32).min)
        probs = jax.nn.softmax(scores, axis=-1).astype(v_all.dtype)
        out = jnp.einsum("bkgts,bskd->btkgd", probs, v_all).reshape(b, t, h, d)
        return out, (k_all, v_all)

    return attend


def _write(cache_layer, new, start):
    """Row b of `new` (B, T, KV, D) into `cache_layer` (B, S, KV, D) from position start[b]."""
    return jax.vmap(lambda c, n, s: jax.lax.dynamic_update_slice(c, n, (s, 0, 0)))(cache_layer, new, start)


def cached_forward(params: dict, cache: dict, tokens: jnp.ndarray, start: jnp.ndarray, cfg: ModelConfig):
    """-> (float32 logits (B, T, padded vocab), updated cache). See the module doc."""
    cdt = jnp.dtype(cfg.compute_dtype)
    t = tokens.shape[1]
    length = cache["k"].shape[2]
    positions = start[:, None] + jnp.arange(t)[None, :]
    # (plain, YaRN-scaled) tables at these positions; each layer picks one (ModelConfig.layer_rope_scaled)
    ropes = [tuple(table[positions] for table in rope_tables(cfg, length, scaled)) for scaled in (False, True)]
    scaled_layers = jnp.asarray([cfg.layer_rope_scaled(i) for i in range(cfg.n_layers)])
    x = params["embed"].astype(cdt)[tokens]

    def layer(x, xs):
        p, k_cache, v_cache, window, scaled = xs
        p = jax.tree.map(lambda w: w.astype(cdt), p)
        cos, sin = (jnp.where(scaled, a, b) for a, b in zip(ropes[True], ropes[False]))
        return block(cfg, p, x, cos, sin, _cache_attention(k_cache, v_cache, start, positions, window))

    x, (k_new, v_new) = jax.lax.scan(
        layer, x, (params["layers"], cache["k"], cache["v"], _layer_windows(cfg, length), scaled_layers)
    )
    return lm_head(params, final_norm(params, x, cfg), cfg), {"k": k_new, "v": v_new}
