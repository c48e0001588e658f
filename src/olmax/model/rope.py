"""Rotary position embeddings (rotate-half / NeoX layout), with YaRN for the long-context stage.

Everything here is float32, as in OLMo-core (`RoPEConfig(full_precision=True)`) and transformers.
YaRN follows transformers' `_compute_yarn_parameters` (truncated correction range, attention factor
0.1 * ln(factor) + 1 multiplied into cos and sin).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from olmax.config import ModelConfig


def inv_frequencies(cfg: ModelConfig, scaled: bool) -> tuple[np.ndarray, float]:
    """Per-pair inverse frequencies (head_dim // 2,) and the factor multiplied into cos/sin;
    `scaled` applies the config's YaRN (see ModelConfig.layer_rope_scaled)."""
    dim = cfg.head_dim
    base = np.float32(cfg.rope_theta)
    pos_freqs = base ** (np.arange(0, dim, 2, dtype=np.float32) / np.float32(dim))
    inv_freq = (1.0 / pos_freqs).astype(np.float32)
    if not scaled or cfg.rope_type == "default":
        return inv_freq, 1.0

    factor = cfg.yarn_factor
    original = cfg.yarn_original_max_position

    def correction_dim(num_rotations: float) -> float:
        return (dim * math.log(original / (num_rotations * 2 * math.pi))) / (2 * math.log(cfg.rope_theta))

    low = max(math.floor(correction_dim(cfg.yarn_beta_fast)), 0)
    high = min(math.ceil(correction_dim(cfg.yarn_beta_slow)), dim - 1)
    if low == high:
        high += 0.001  # avoid a zero-width ramp
    ramp = np.clip((np.arange(dim // 2, dtype=np.float32) - low) / (high - low), 0, 1).astype(np.float32)
    extrapolation = 1 - ramp  # 1 where the original frequency is kept
    interpolated = (1.0 / (np.float32(factor) * pos_freqs)).astype(np.float32)
    inv_freq = interpolated * (1 - extrapolation) + inv_freq * extrapolation
    attention_factor = 0.1 * math.log(factor) + 1.0 if factor > 1 else 1.0
    return inv_freq.astype(np.float32), attention_factor


def rope_tables(cfg: ModelConfig, seq_len: int, scaled: bool) -> tuple[jnp.ndarray, jnp.ndarray]:
    """cos and sin of shape (seq_len, head_dim), float32, for positions 0..seq_len-1."""
    inv_freq, scale = inv_frequencies(cfg, scaled)
    freqs = jnp.arange(seq_len, dtype=jnp.float32)[:, None] * jnp.asarray(inv_freq)[None, :]
    emb = jnp.concatenate([freqs, freqs], axis=-1)
    return jnp.cos(emb) * scale, jnp.sin(emb) * scale


@jax.custom_vjp
def apply_rope(x: jnp.ndarray, cos: jnp.ndarray, sin: jnp.ndarray) -> jnp.ndarray:
    """x: (batch, seq, heads, head_dim); cos/sin: (seq, head_dim), or (batch, seq, head_dim) when
    each row has its own positions. Rotated in float32 and cast back to x's dtype.

    The gradient is the inverse rotation, also in float32 (a custom VJP: what autodiff computes, in
    one elementwise pass): autodiff's transposes of the half-slices and the concatenation left XLA
    several float32 (batch, seq, heads, head_dim / 2) arrays per projection live in the backward
    pass. cos and sin get no gradient (they are tables of constants)."""
    xf = x.astype(jnp.float32)
    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-xf[..., half:], xf[..., :half]], axis=-1)
    cos, sin = cos[..., None, :], sin[..., None, :]  # broadcast over the heads
    return (xf * cos + rotated * sin).astype(x.dtype)


def _apply_rope_fwd(x, cos, sin):
    return apply_rope(x, cos, sin), (cos, sin)


def _apply_rope_bwd(residuals, g):
    cos, sin = residuals
    gf = g.astype(jnp.float32)
    half = g.shape[-1] // 2
    # x cos + rotate_half(x) sin, transposed: g cos + rotate_half^T(g sin), rotate_half^T(w) = [w2, -w1]
    gs = gf * sin[..., None, :]
    unrotated = jnp.concatenate([gs[..., half:], -gs[..., :half]], axis=-1)
    return (gf * cos[..., None, :] + unrotated).astype(g.dtype), None, None


apply_rope.defvjp(_apply_rope_fwd, _apply_rope_bwd)
