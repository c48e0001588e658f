"""The sampled token: a draw from a row of logits with the probabilities the sampler records for it
(log_softmax of the same logits, olmax.rollout.sampler.token_logprobs), to within float32 rounding of
each probability, tail included: the importance weights of the RL loss (olmax.objectives.grpo) divide by
the recorded probability of the token drawn, so a draw that favours or starves some tokens biases them.

The draw descends a binary tree over the vocabulary. Its leaves are w = exp(logits - max), padded with
zeros to a power of two; each node holds the sum of its leaves. At a node with children sums L and R it
takes the smaller side when a fresh uniform 64-bit word is below floor(2^64 x small / (L + R)), else the
larger side. Each step's probability is then the float32 ratio of its sums, off by a few float32
roundings relative to itself and by less than 2^-64 in absolute terms, and a token's probability is the
product along its path: relative errors stay relative (on dolma2's 100k vocabulary every token above
1e-12 is drawn at its softmax probability to 2e-6 of itself; tests/rollout/test_rollout_draw.py) and
the absolute ones add up to at most 17 x 2^-64. The inverse CDF it replaces (one float32 uniform against
a float32 cumulative sum) had absolute errors of ~1e-7 at each of 100k boundaries: 2e-3 of total
variation, tail tokens drawn at rates off by 2x, and a token that changed with the last bit of any logit
before it (two programs whose logits differ in their last bits, the slot engine's and the static
sampler's, drew different tokens). Here a draw changes only where one of its 17 ratios moves across its
random word.

For speed the tree is cut in two: the sums of blocks of BLOCK leaves (one pass over the row) and a tree
over the blocks pick a block, then a tree over that block's leaves alone (gathered, BLOCK wide) picks
the token. A row's random words are 2 x 17 words of jax.random.bits from its own key, where a Gumbel-max
draw (jax.random.categorical) needs one per vocabulary entry: 6.4M a step for 64 rows of dolma2, most
of a sampled step on a CPU.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

BLOCK = 1024  # leaves per block: the second tree's width
_TWO_32 = 4294967296.0


def _pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def shape(vocab: int) -> tuple[int, int]:
    """(blocks, leaves per block) of the tree over `vocab` entries, both powers of two."""
    block = min(BLOCK, _pow2(vocab))
    return _pow2(-(-vocab // block)), block


def pyramid(x: jnp.ndarray) -> list[jnp.ndarray]:
    """The sums of a binary tree whose leaves are x's last axis (a power of two): [x, pair sums, ...,
    the root], each level half as wide as the one before."""
    levels = [x]
    while levels[-1].shape[-1] > 1:
        top = levels[-1]
        levels.append(top.reshape(*top.shape[:-1], -1, 2).sum(-1))
    return levels


def threshold(left: jnp.ndarray, right: jnp.ndarray) -> tuple[jnp.ndarray, jnp.ndarray, jnp.ndarray]:
    """At a node with children sums (left, right): whether the left side is the smaller, and the 64-bit
    threshold floor(2^64 x small / total) as (high, low) uint32 words, below which a uniform 64-bit word
    takes the smaller side. A side of sum 0 is never taken; a node of total 0 (padding, never reached)
    takes the left side."""
    small_left = left <= right
    total = left + right
    q = jnp.where(total > 0, jnp.minimum(left, right) / jnp.where(total > 0, total, 1.0), 0.0)
    # q <= 1/2 has 24 significant bits: q x 2^32 <= 2^31, its integer and fractional parts and the
    # fraction x 2^32 are exact in float32, so (high, low) is floor(q x 2^64) exactly
    scaled = q * _TWO_32
    high = jnp.floor(scaled)
    return small_left, high.astype(jnp.uint32), ((scaled - high) * _TWO_32).astype(jnp.uint32)


def _descend(leaves: jnp.ndarray, u: jnp.ndarray) -> jnp.ndarray:
    """The leaf (B,) reached from the root of each row's tree over `leaves` (B, n), n a power of two,
    with two u (B, 2 x log2 n) words per level, top first. The tree is laid out as a heap (node k's
    children at 2k and 2k + 1, the leaves at n .. 2n - 1) and walked by a loop, which compiles once
    whatever the depth (the walk unrolled, 17 levels of gathers, took XLA's CPU compiler ~10 s)."""
    b, n = leaves.shape
    if n == 1:  # a tree of one leaf (a vocabulary within one block): nothing to choose
        return jnp.zeros(b, jnp.int32)
    heap = jnp.concatenate([jnp.zeros((b, 1), leaves.dtype), *reversed(pyramid(leaves))], axis=1)

    def step(level, node):
        children = jnp.take_along_axis(heap, jnp.stack([2 * node, 2 * node + 1], axis=1), axis=1)
        small_left, high, low = threshold(children[:, 0], children[:, 1])
        words = jax.lax.dynamic_slice_in_dim(u, 2 * level, 2, axis=1)
        take_small = (words[:, 0] < high) | ((words[:, 0] == high) & (words[:, 1] < low))
        return 2 * node + jnp.where(small_left, ~take_small, take_small).astype(jnp.int32)

    depth = n.bit_length() - 1
    return jax.lax.fori_loop(0, depth, step, jnp.ones(b, jnp.int32)) - n


def leaves(logits: jnp.ndarray) -> jnp.ndarray:
    """The tree's leaves, (B, blocks, BLOCK): exp(logits - the row's max), zero where a logit is -inf
    (cut by top-k / top-p) and for the padding."""
    b, v = logits.shape
    blocks, block = shape(v)
    padded = jnp.pad(logits, ((0, 0), (0, blocks * block - v)), constant_values=-jnp.inf)
    return jnp.exp(padded - jnp.max(logits, axis=-1, keepdims=True)).reshape(b, blocks, block)


def walk(w: jnp.ndarray, u: jnp.ndarray) -> jnp.ndarray:
    """The token (B,) int32 that the random words u (B, 2 x depth) reach in the trees over `leaves` w, the
    block tree's levels first (module doc)."""
    blocks, block = w.shape[1:]
    outer = blocks.bit_length() - 1  # the block tree's levels
    chosen = _descend(w.sum(-1), u[:, : 2 * outer])
    inside = jnp.take_along_axis(w, chosen[:, None, None], axis=1)[:, 0]
    return (chosen * block + _descend(inside, u[:, 2 * outer :])).astype(jnp.int32)


def draw(logits: jnp.ndarray, keys: jnp.ndarray) -> jnp.ndarray:
    """A token (B,) int32 from each row of `logits` (B, V) (already divided by the temperature, -inf
    where cut), row r with keys[r] (module doc)."""
    return draw_scored(logits, keys)[0]


def draw_scored(logits: jnp.ndarray, keys: jnp.ndarray) -> tuple[jnp.ndarray, jnp.ndarray]:
    """`draw`'s token (B,) and its log-prob (B,) float32 under log_softmax(logits), from the same pass:
    the max and the block sums the draw needs are the log-softmax's (logits - max - log(sum)), so an
    uncut draw and its log-prob read the row twice, not four times."""
    w = leaves(logits)
    depth = (w.shape[1] * w.shape[2]).bit_length() - 1
    token = walk(w, jax.vmap(lambda k: jax.random.bits(k, (2 * max(depth, 1),), jnp.uint32))(keys))
    chosen = jnp.take_along_axis(logits, token[:, None], axis=1)[:, 0]
    return token, chosen - jnp.max(logits, axis=-1) - jnp.log(w.sum(axis=(1, 2)))
