"""The KV-cache model pass: prefill and every single-token step give the logits of the full forward
pass (with a window shorter than the sequence). Norm weights are random, so a norm wired differently
in the decoder than in training would show. The generation loop is tested in test_generate.py."""

import jax
import jax.numpy as jnp
import numpy as np
from models import random_params

from olmax.config import ModelConfig
from olmax.evals.decode import cached_forward, init_cache
from olmax.model.olmo3 import forward

CFG = ModelConfig(
    vocab_size=300,
    d_model=32,
    n_layers=5,
    n_heads=4,
    n_kv_heads=2,
    head_dim=8,
    mlp_hidden=64,
    sliding_window=4,
    compute_dtype="float32",
)


def test_cached_steps_match_the_full_forward():
    params = random_params(CFG, jax.random.key(0))
    seq = np.random.default_rng(0).integers(0, CFG.vocab_size, (2, 20)).astype(np.int32)
    full = np.asarray(jax.jit(forward, static_argnums=2)(params, seq, CFG))
    cache = init_cache(CFG, 2, 32)
    run = jax.jit(cached_forward, static_argnums=4)
    logits, cache = run(params, cache, jnp.asarray(seq[:, :8]), jnp.zeros(2, jnp.int32), CFG)
    np.testing.assert_allclose(np.asarray(logits), full[:, :8], atol=2e-5)
    for t in range(8, 20):  # positions 12+ only see the window on layers 0-2: a wrong mask shows here
        logits, cache = run(params, cache, jnp.asarray(seq[:, t : t + 1]), jnp.full(2, t, jnp.int32), CFG)
        np.testing.assert_allclose(np.asarray(logits)[:, 0], full[:, t], atol=2e-5)
