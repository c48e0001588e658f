"""The sampled token's draw (olmax.rollout.draw) over dolma2's whole vocabulary, enumerated rather than
counted: from the sums and thresholds the program itself computes, the exact probability with which
each of the 100,278 tokens is drawn, against softmax in float64. The draw's walk is then checked to
compare its random words with those thresholds exactly as the enumeration assumes, at both sides of a
threshold on the paths of tail tokens."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from olmax.rollout import draw as tree

VOCAB = 100_278  # dolma2's real vocabulary
TWO_32 = 2.0**32


def _rows() -> np.ndarray:
    """Three rows as a policy gives them: a peaked one (a tail down to 1e-25), a Zipf-like one (every rank
    between 1e-1 and 1e-7) and a nearly flat one (a random model's)."""
    rng = np.random.default_rng(0)
    peaked = rng.normal(size=VOCAB) * 4.0
    peaked[17] = 30.0
    zipf = -1.1 * np.log(1.0 + rng.permutation(VOCAB))
    flat = rng.normal(size=VOCAB) * 0.05
    return np.stack([peaked, zipf, flat]).astype(np.float32)


@jax.jit
def _thresholds(w):
    """Every node's (smaller side is left, high word, low word) of the trees over leaves w (..., n), from
    the leaves up to the root's children: the program's own pyramid and threshold, jitted once."""
    return [tree.threshold(level[..., 0::2], level[..., 1::2]) for level in tree.pyramid(w)[:-1]]


def _enumerate(w) -> np.ndarray:
    """The probability of reaching each leaf of the trees over leaves w (..., n): at each node the
    smaller side is taken with probability threshold / 2^64 (a uniform 64-bit word below it), the larger
    with the rest; float64 products of these dyadic numbers."""
    levels = [[np.asarray(a) for a in node] for node in _thresholds(w)]
    prob = np.ones(w.shape[:-1] + (1,), np.float64)
    for small_left, high, low in reversed(levels):
        p_small = (high.astype(np.float64) + low.astype(np.float64) / TWO_32) / TWO_32
        # each side's own probability (1 - (1 - x) would lose a small x to float64's rounding)
        p_left, p_right = np.where(small_left, p_small, 1.0 - p_small), np.where(small_left, 1.0 - p_small, p_small)
        prob = np.stack([prob * p_left, prob * p_right], axis=-1).reshape(p_left.shape[:-1] + (-1,))
    return prob


def _draw_distribution(logits: np.ndarray) -> np.ndarray:
    """(rows, VOCAB): the probability that `tree.draw` gives each token, enumerated."""
    w = tree.leaves(jnp.asarray(logits))
    blocks = _enumerate(w.sum(-1))  # (rows, blocks)
    inside = _enumerate(w)  # (rows, blocks, BLOCK): every block's tree
    return (blocks[..., None] * inside).reshape(len(logits), -1)[:, :VOCAB]


def _softmax64(logits: np.ndarray) -> np.ndarray:
    x = logits.astype(np.float64)
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def test_every_token_is_drawn_with_its_softmax_probability():
    logits = _rows()
    got, want = _draw_distribution(logits), _softmax64(logits)
    assert np.allclose(got.sum(-1), 1.0, rtol=0, atol=1e-12)
    tv = 0.5 * np.abs(got - want).sum(-1)
    assert (tv < 2e-7).all(), tv  # the float32 inverse CDF it replaced: 2e-3 on such rows
    # each token's own probability, to a few float32 roundings of the sums on its path, down to the
    # tail: every step on the path of a token of probability p has a probability >= p, quantized to
    # 2^-64 (a token of 1e-19 beside one of probability 1 is drawn at 8 or 9 x 2^-64)
    tail = want > 1e-12
    rel = np.abs(got[tail] - want[tail]) / want[tail]
    assert rel.max() < 5e-6 and (want[tail] < 1e-9).sum() > 10_000, rel.max()
    # what could never be drawn has no probability: the -inf (cut) logits
    cut = logits.copy()
    cut[:, 1000:] = -np.inf
    assert _draw_distribution(cut)[:, 1000:].max() == 0.0


@functools.cache
def _trees():
    """The program's trees over _rows()' leaves, from `_thresholds` at the shapes `_draw_distribution`
    compiles: (the levels over the blocks' sums, the levels inside every block, the block size), each
    level's arrays on the host."""
    w = tree.leaves(jnp.asarray(_rows()))
    host = lambda levels: [[np.asarray(a) for a in node] for node in levels]  # noqa: E731
    return host(_thresholds(w.sum(-1))), host(_thresholds(w)), w.shape[2]


def _path_bits(row: int, token: int, miss: int = -1) -> np.ndarray:
    """The random words that walk _rows()[row] to `token`: at each node a 64-bit word just below the
    threshold to take the smaller side, just above it to take the larger, as two 32-bit words; at
    level `miss` the other one of the two, which must lead elsewhere."""
    over, inside, block = _trees()
    pick = lambda levels, *at: [[a[at] for a in node] for node in levels]  # noqa: E731
    words = []
    for levels, leaf in ((pick(over, row), token // block), (pick(inside, row, token // block), token % block)):
        depth = len(levels)
        for k, (small_left, high, low) in enumerate(reversed(levels)):
            node = leaf >> (depth - k)  # the node at this level on the way to `leaf`
            right = (leaf >> (depth - k - 1)) & 1
            small_left, high, low = bool(small_left[node]), int(high[node]), int(low[node])
            take_small = right != small_left
            if len(words) == 2 * miss:
                take_small = not take_small
            # the 64-bit threshold, and words 1e-4 of it to either side: the program's own sums may
            # differ from these in their last bits (XLA fuses the jitted walk otherwise)
            t = (high << 32) + low
            margin = max(t >> 13, 1)
            word = t - margin if take_small else min(t + margin, 2**64 - 1)
            words += [word >> 32, word & 0xFFFFFFFF]
    return np.asarray([words], np.uint32)


_walk = jax.jit(lambda x, u: tree.walk(tree.leaves(x), u))  # one program for both rows


@pytest.mark.parametrize("row", [0, 1])
def test_the_walk_compares_its_words_with_the_enumerated_thresholds(row):
    logits = _rows()[row : row + 1]
    probs = _softmax64(logits)[0]
    # the likeliest token, a middling one and the least likely above 1e-15 (each step on its path then
    # has a threshold of at least 2^64 x 1e-15)
    order = np.argsort(probs)
    least = order[np.searchsorted(probs[order], 1e-15)]
    for token in [order[-1], order[VOCAB // 2], least]:
        bits = _path_bits(row, int(token))
        assert int(_walk(logits, bits)[0]) == token, (token, probs[token])
        for miss in (0, 7, 16):  # the other side of one threshold: another token
            assert int(_walk(logits, _path_bits(row, int(token), miss))[0]) != token


def test_a_row_draws_the_same_token_whatever_its_batch():
    """Row r's token depends on its own logits and key alone (the engine's rows and the static
    sampler's sit in batches of other sizes)."""
    logits = jnp.asarray(_rows())
    keys = jax.vmap(lambda i: jax.random.fold_in(jax.random.key(3), i))(jnp.arange(3))
    together = np.asarray(jax.jit(tree.draw)(logits, keys))
    alone = [int(jax.jit(tree.draw)(logits[r : r + 1], keys[r : r + 1])[0]) for r in range(3)]
    assert together.tolist() == alone
