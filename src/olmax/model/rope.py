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

from olmax.config.model import ModelConfig


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

    rotate_half(x) is written as a swap of the two halves times [-1, 1]: with slices and a
    concatenation of the float32 x, the TPU compiler kept float32 (batch, seq, heads, head_dim / 2)
    halves of q and k at the backward pass's peak; the swap is done on x itself, before the upcast.
    The gradient is the inverse rotation, summed in float32 and rounded once (a custom VJP: autodiff
    of the bf16 swap would round its two terms separately). cos and sin get no gradient (they are
    tables of constants). docs/performance/remat.md, "A leaner backward", has the heaps."""
    cos, sin = cos[..., None, :], sin[..., None, :]  # broadcast over the heads
    # the halves are swapped before the upcast (a permutation: exact in any dtype), so whatever XLA
    # materialises of the swap is in x's dtype; the arithmetic is float32
    f32 = jnp.float32
    return (x.astype(f32) * cos + _swap_halves(x).astype(f32) * _signed(sin)).astype(x.dtype)


def _swap_halves(x):
    """[x1, x2] -> [x2, x1] along the last axis: a rotation by half of it. Not a reverse of a (2, half)
    view: at head_dim 64 that view's last axis is 32, below the TPU's 128 lanes, and the compiler
    re-laid the float32 q and k out around it (39 ms of copies a step of the 190m on a v5e; with the
    rotation that step ran 6.6% faster, docs/performance/tpu-v5e.md)."""
    return jnp.roll(x, x.shape[-1] // 2, axis=-1)


def _signed(t):
    """t with its first half negated: rotate_half(x) * sin = swap(x) * [-sin1, sin2]."""
    half = t.shape[-1] // 2
    sign = jnp.concatenate([-jnp.ones(half, t.dtype), jnp.ones(t.shape[-1] - half, t.dtype)])
    return t * sign


def _apply_rope_fwd(x, cos, sin):
    return apply_rope(x, cos, sin), (cos, sin)


def _apply_rope_bwd(residuals, g):
    cos, sin = residuals
    f32 = jnp.float32
    # x cos + swap(x) s with s = [-sin1, sin2], transposed: g cos + swap(g s) = g cos + swap(g) swap(s)
    # (swap is its own transpose and commutes with elementwise products)
    unrotated = _swap_halves(g).astype(f32) * _swap_halves(_signed(sin))[..., None, :]
    return (g.astype(f32) * cos[..., None, :] + unrotated).astype(g.dtype), None, None


apply_rope.defvjp(_apply_rope_fwd, _apply_rope_bwd)
