"""Greedy decoding with a key/value cache, built from olmax.model.olmo3's pieces (for generate_until).

`cached_forward(params, cache, tokens, start, cfg)` runs `tokens` (batch, T) whose row b sits at
positions start[b] .. start[b] + T - 1, writes their keys and values into the cache at those
positions, and attends each query to the cached keys it may see: key position j is visible from
query position i when j <= i and, on a sliding-window layer, i - j < window (the token and the W-1
before it, as in training). A prefill is one call with start = 0 and right-padded prompts; each
decoding step is one call with T = 1, so generating n tokens costs n single-token passes over the
cache instead of n growing full forwards (linear in n, not quadratic).

Right padding is harmless: a row's padded positions hold garbage keys only until that row's own
generated tokens overwrite them, and a query never sees a position beyond its own.

The block is the reordered-norm block of olmax.model.olmo3._block with the attention reading the
cache; tests/test_evals_lm_eval.py checks the logits of prefill and of every decoding step against
`olmax.model.olmo3.forward` on the full sequence, with a window shorter than the sequence.
"""

from __future__ import annotations

import functools
from typing import Callable, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from olmax.config import ModelConfig
from olmax.model.olmo3 import lm_head, rms_norm
from olmax.model.rope import apply_rope, rope_tables


def init_cache(cfg: ModelConfig, batch: int, length: int) -> dict:
    shape = (cfg.n_layers, batch, length, cfg.n_kv_heads, cfg.head_dim)
    dtype = jnp.dtype(cfg.compute_dtype)
    return {"k": jnp.zeros(shape, dtype), "v": jnp.zeros(shape, dtype)}


def _layer_windows(cfg: ModelConfig, length: int) -> jnp.ndarray:
    """Each layer's window as a number; a global layer gets one longer than the cache."""
    return jnp.asarray([cfg.layer_window(i) or length + 1 for i in range(cfg.n_layers)], jnp.int32)


def _attend(q, k, v, q_pos, window):
    """q (B, T, H, D) at positions q_pos (B, T); k, v (B, S, KV, D) at positions 0..S-1."""
    b, t, h, d = q.shape
    kv = k.shape[2]
    k_pos = jnp.arange(k.shape[1])
    visible = (k_pos[None, None, :] <= q_pos[:, :, None]) & (q_pos[:, :, None] - k_pos[None, None, :] < window)
    q = q.reshape(b, t, kv, h // kv, d)
    scores = jnp.einsum("btkgd,bskd->bkgts", q, k, preferred_element_type=jnp.float32) * (d**-0.5)
    scores = jnp.where(visible[:, None, None], scores, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
    return jnp.einsum("bkgts,bskd->btkgd", probs, v).reshape(b, t, h, d)


def _rope_rows(x, cos, sin):
    """apply_rope with a (T, D) table per row: x (B, T, H, D), cos/sin (B, T, D)."""
    return jax.vmap(lambda xr, c, s: apply_rope(xr[None], c, s)[0])(x, cos, sin)


def _write(cache_layer, new, start):
    """Row b of `new` (B, T, KV, D) into `cache_layer` (B, S, KV, D) from position start[b]."""
    return jax.vmap(lambda c, n, s: jax.lax.dynamic_update_slice(c, n, (s, 0, 0)))(cache_layer, new, start)


def cached_forward(params: dict, cache: dict, tokens: jnp.ndarray, start: jnp.ndarray, cfg: ModelConfig):
    """-> (float32 logits (B, T, padded vocab), updated cache). See the module doc."""
    cdt = jnp.dtype(cfg.compute_dtype)
    b, t = tokens.shape
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
        q = rms_norm(x @ p["q_proj"], p["q_norm"], cfg.norm_eps)
        k = rms_norm(x @ p["k_proj"], p["k_norm"], cfg.norm_eps)
        v = x @ p["v_proj"]
        q = _rope_rows(q.reshape(b, t, cfg.n_heads, cfg.head_dim), cos, sin)
        k = _rope_rows(k.reshape(b, t, cfg.n_kv_heads, cfg.head_dim), cos, sin)
        k_cache = _write(k_cache, k.astype(k_cache.dtype), start)
        v_cache = _write(v_cache, v.reshape(b, t, cfg.n_kv_heads, cfg.head_dim).astype(v_cache.dtype), start)
        attn = _attend(q, k_cache, v_cache, positions, window).reshape(b, t, -1)
        h = x + rms_norm(attn @ p["o_proj"], p["attn_norm"], cfg.norm_eps)
        mlp = (jax.nn.silu(h @ p["gate_proj"]) * (h @ p["up_proj"])) @ p["down_proj"]
        return h + rms_norm(mlp, p["mlp_norm"], cfg.norm_eps), (k_cache, v_cache)

    x, (k_new, v_new) = jax.lax.scan(layer, x, (params["layers"], cache["k"], cache["v"],
                                                _layer_windows(cfg, length), scaled_layers))
    hidden = rms_norm(x, params["final_norm"], cfg.norm_eps)
    return lm_head(params, hidden, cfg), {"k": k_new, "v": v_new}

