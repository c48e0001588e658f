"""The KV-cache model pass (olmax.rollout.cache): prefill and every single-token step give the logits
of the full forward pass, with a window (4) shorter than the sequence, so the sliding-window layers'
rings (4 slots) wrap, and a prefill (8 tokens, right-padded rows of 8 and 5) longer than the window.
Norm weights are random, so a norm wired differently in the decoder than in training would show. The
sampling loop is tested in test_rollout_sampler.py and test_generate.py."""

import jax
import jax.numpy as jnp
import numpy as np
from models import random_params

from olmax.config import ModelConfig
from olmax.model.olmo3 import forward
from olmax.rollout.cache import cached_forward, init_cache

CFG = ModelConfig(
    vocab_size=300,
    d_model=32,
    n_layers=3,  # one scanned group of 2 (window 4, global) and a tail layer (the last: global)
    global_every=2,
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
    # the windowed layers hold only their window, the full ones the whole length
    assert [c["k"].shape[2] for c in cache["group"]] == [4, 32] and cache["tail"][0]["k"].shape[1] == 32
    run = jax.jit(cached_forward, static_argnums=4)
    # row 1's prompt is 5 tokens: its padding (positions 5-7) must not reach the rings
    lengths = np.asarray([8, 5], np.int32)
    prefill = (params, cache, jnp.asarray(seq[:, :8]), jnp.zeros(2, jnp.int32))
    logits, cache = run(*prefill, CFG, jnp.asarray(lengths))
    np.testing.assert_allclose(np.asarray(logits)[0], full[0, :8], atol=2e-5)
    np.testing.assert_allclose(np.asarray(logits)[1, :5], full[1, :5], atol=2e-5)
    # the sampler's prefill (fresh: its own keys only, not the empty ring) gives the same logits and cache
    fresh = jax.jit(lambda *a: cached_forward(*a, CFG, jnp.asarray(lengths), fresh=True))(*prefill)
    np.testing.assert_allclose(np.asarray(fresh[0]), np.asarray(logits), atol=2e-5)
    jax.tree.map(np.testing.assert_array_equal, fresh[1], cache)
    for step in range(12):  # each row at its own position; 12+ only see the window on layer 0
        pos = lengths + step
        tokens = jnp.asarray(seq[np.arange(2), pos][:, None])
        logits, cache = run(params, cache, tokens, jnp.asarray(pos), CFG)
        for r in range(2):
            np.testing.assert_allclose(np.asarray(logits)[r, 0], full[r, pos[r]], atol=2e-5)
