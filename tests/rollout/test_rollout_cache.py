"""The KV-cache model pass (olmax.rollout.cache): prefill and every single-token step give the logits
of the full forward pass, with a window (4) shorter than the sequence, so the sliding-window layers'
rings (4 slots) wrap, and a prefill (8 tokens, left-padded rows of 8 and 5) longer than the window.
Norm weights are random, so a norm wired differently in the decoder than in training would show. The
decoding steps run on rings and on a paged cache (the rings' blocks at scattered page ids of a larger
pool, the rest noise), with the XLA attention and with the TPU kernel in Pallas' interpret mode
(olmax.rollout.decode_attention). The sampling loop is tested in test_rollout_sampler.py and
test_generate.py."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from models import random_params, small_model

from olmax.model.olmo3 import forward
from olmax.rollout.cache import cached_forward, init_cache, ring_sizes
from olmax.rollout.decode_attention import page_size

# 3 layers: one scanned group of 2 (window 4, global) and a tail layer (the last: global)
CFG = small_model(vocab_size=300, n_layers=3, global_every=2, sliding_window=4, compute_dtype="float32")


def paged(cache, rng):
    """The cache's rings as pools of pages (3x as many as the rows' blocks, the rest noise) and the tables."""
    tables = {}
    for size in ring_sizes(CFG, 32):
        blocks = size // page_size(size)
        tables[size] = rng.permutation(3 * 2 * blocks)[: 2 * blocks].reshape(2, blocks).astype(np.int32)

    def pool(ring):
        *lead, b, kv, size, w = ring.shape
        page = page_size(size)
        blocks = np.asarray(ring).reshape(*lead, b, kv, size // page, page, w)
        blocks = np.moveaxis(blocks, -3, len(lead) + 1).reshape(*lead, b * (size // page), kv, page, w)
        out = rng.standard_normal((*lead, 3 * b * (size // page), kv, page, w)).astype(np.float32)
        out[..., tables[size].reshape(-1), :, :, :] = blocks
        return jnp.asarray(out)

    return jax.tree.map(pool, cache), {s: jnp.asarray(t) for s, t in tables.items()}


@pytest.fixture(scope="module")
def prefilled():
    """The full forward's logits of 2 random rows of 20 tokens, and the prefill of their prompts (row 1's
    5 tokens left-padded to 8 with tokens that would change every logit if seen): its logits, its last
    token's alone, and its cache, the start of every test's decoding steps."""
    params = random_params(CFG, jax.random.key(0))
    seq = np.random.default_rng(0).integers(0, CFG.vocab_size, (2, 20)).astype(np.int32)
    full = np.asarray(jax.jit(forward, static_argnums=2)(params, seq, CFG))
    lengths = np.asarray([8, 5], np.int32)
    first = 8 - lengths
    prompts = jnp.asarray(np.stack([seq[0, :8], np.concatenate([np.full(3, 7, np.int32), seq[1, :5]])]))
    prefill = jax.jit(  # the empty cache made inside the program: no eager op of its own to compile
        lambda p, x, last_only: cached_forward(
            p, init_cache(CFG, 2, 32), x, 0, CFG, jnp.asarray(first), 32, last_only=last_only, fresh=True
        ),
        static_argnums=2,
    )
    logits, cache = prefill(params, prompts, False)
    return params, seq, full, lengths, first, logits, prefill(params, prompts, True)[0], cache


def test_the_prefill_matches_the_full_forward(prefilled):
    _, _, full, _, _, logits, last, cache = prefilled
    # the windowed layers hold only their window, the full ones the whole length; keys and values of a
    # head side by side
    assert [c.shape[3] for c in cache["group"]] == [4, 32] and cache["tail"][0].shape == (2, 2, 32, 16)
    np.testing.assert_allclose(np.asarray(logits)[0], full[0, :8], atol=2e-5)
    np.testing.assert_allclose(np.asarray(logits)[1, 3:], full[1, :5], atol=2e-5)
    np.testing.assert_allclose(np.asarray(last), np.asarray(logits)[:, -1:], atol=2e-5)


@pytest.mark.parametrize("layout,attention", [("rings", "xla"), ("pages", "xla"), ("pages", "interpret")])
def test_cached_steps_match_the_full_forward(prefilled, layout, attention):
    params, seq, full, lengths, first, _, _, cache = prefilled
    pages = None
    if layout == "pages":
        cache, pages = paged(cache, np.random.default_rng(1))
    step = jax.jit(
        lambda p, c, x, time, pages: cached_forward(
            p, c, x, time, CFG, jnp.asarray(first), 32, pages=pages, attention=attention
        )
    )
    for t in range(12):  # every row at time 8 + t, each at its own position; 12+ only see the window on layer 0
        pos = lengths + t
        logits, cache = step(params, cache, jnp.asarray(seq[np.arange(2), pos][:, None]), 8 + t, pages)
        for r in range(2):
            np.testing.assert_allclose(np.asarray(logits)[r, 0], full[r, pos[r]], atol=2e-5)


def test_a_decoding_step_takes_one_token_per_row():
    cache = init_cache(CFG, 2, 32)
    with pytest.raises(ValueError, match="one decoding step"):
        cached_forward(random_params(CFG, jax.random.key(0)), cache, jnp.zeros((2, 2), jnp.int32), 3, CFG)
