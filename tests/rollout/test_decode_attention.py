"""Decode attention over live KV (olmax.rollout.decode_attention): the Pallas kernel in TPU interpret mode
and the XLA path against attention computed by time, from each row's keys and values listed by time
(not by ring slot): a row at clock c sees times max(first, c - S + 1) .. c, the step's own key and
value (time c) written into the cache by the call, which changes nothing else.

Rings of 32 slots read in blocks of 8, clocks before and after the rings wrap, rows that hold one
time, a few, or a whole ring, and rows whose first time is before 0 (left padding from a prefill);
the ring layout and a paged pool (the same blocks at shuffled page ids, the rest of the pool noise)
give the same outputs; a step of fewer rows than the pool holds (the engine's narrowed decoding);
a layer of a scanned group (the group's index picks its arrays); head_dim 8 (keys and values of a
head in one row read whole) and 128 (sliced at the lane tile), one and two query heads per kv head."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from olmax.rollout.decode_attention import attend, live_blocks, page_size

RING, ROWS = 32, 5


def by_time(q, keys, values, lo, clock):
    """Softmax attention of q (B, H, D) to each row's keys/values (B, T, KV, D) at times 0..T-1 of an
    unrolled row (times before 0 shifted by `shift`), visible lo .. clock."""
    b, h, d = q.shape
    g = h // keys.shape[2]
    out = np.zeros((b, h, d))
    for r in range(b):
        times = np.arange(lo[r], clock + 1)
        for head in range(h):
            k, v = keys[r, times - SHIFT, head // g], values[r, times - SHIFT, head // g]
            s = k @ q[r, head] / np.sqrt(d)
            p = np.exp(s - s.max())
            out[r, head] = (p / p.sum()) @ v
    return out


SHIFT = -40  # times from -40 on


def make_case(rng, clock, heads, kv_heads, d, ring=RING):
    """Rows with keys and values at times -40 .. clock, written into a ring (time t at slot t % ring)."""
    span = clock - SHIFT + 1
    keys = rng.standard_normal((ROWS, span, kv_heads, d)).astype(np.float32)
    values = rng.standard_normal((ROWS, span, kv_heads, d)).astype(np.float32)
    first = np.asarray([clock, clock - 1, clock - 9, clock - ring - 5, min(clock - 20, -3)])
    # the ring before the step: times up to clock - 1, and at slot clock % ring what it held (noise)
    rings = rng.standard_normal((ROWS, kv_heads, ring, 2 * d)).astype(np.float32)
    for t in range(clock - ring + 1, clock):
        rings[:, :, t % ring, :d] = keys[:, t - SHIFT]
        rings[:, :, t % ring, d:] = values[:, t - SHIFT]
    new = np.concatenate([keys[:, clock - SHIFT], values[:, clock - SHIFT]], axis=-1)  # the step's (B, KV, 2D)
    q = rng.standard_normal((ROWS, heads, d)).astype(np.float32)
    lo = np.maximum(first, clock - ring + 1)
    return q, new, first.astype(np.int32), rings, by_time(q, keys, values, lo, clock)


def paged(rings, rng, page):
    """The rings' blocks at shuffled ids of a pool twice their size (the rest noise), and the table."""
    b, kv, ring, w = rings.shape
    blocks = ring // page
    ids = rng.permutation(2 * b * blocks)[: b * blocks].reshape(b, blocks).astype(np.int32)
    pool = rng.standard_normal((2 * b * blocks, kv, page, w)).astype(np.float32)
    pool[ids] = rings.reshape(b, kv, blocks, page, w).transpose(0, 2, 1, 3, 4)
    return pool, ids


@pytest.mark.parametrize("heads,kv_heads,d", [(2, 2, 8), (4, 2, 128)], ids=["mha-d8", "gqa-d128"])
@pytest.mark.parametrize("implementation", ["xla", "interpret"])
def test_attention_writes_the_step_and_sees_each_rows_live_times(heads, kv_heads, d, implementation):
    rng = np.random.default_rng(0)
    step = jax.jit(attend, static_argnames=("ring", "implementation"))
    for clock in (5, 37, 70):
        q, new, first, rings, want = make_case(rng, clock, heads, kv_heads, d)
        slot = clock % RING

        def run(q, new, pool, first, clock=clock, **k):
            args = (jnp.asarray(x) for x in (q, new, pool, first))
            out, written = step(*args, jnp.int32(clock), ring=RING, implementation=implementation, **k)
            return np.asarray(out), np.asarray(written)

        # the first 3 rows of a 5-row ring array, as the second layer of a group of 2 (the first: noise)
        stacked = np.stack([rng.standard_normal(rings.shape).astype(np.float32), rings])
        out, written = run(q[:3], new[:3], stacked, first[:3], group=jnp.int32(1))
        np.testing.assert_allclose(out, want[:3], atol=2e-5, rtol=0)
        stacked[1, :3, :, slot] = new[:3]  # the step's keys and values written, nothing else
        np.testing.assert_array_equal(written, stacked)
        pool, table = paged(rings, rng, page_size(RING))
        out, written = run(q, new, pool, first, table=jnp.asarray(table))
        np.testing.assert_allclose(out, want, atol=2e-5, rtol=0)
        pool[table[:, slot // page_size(RING)], :, slot % page_size(RING)] = new
        np.testing.assert_array_equal(written, pool)


def test_live_blocks_count_the_blocks_a_row_needs():
    # ring 32 in blocks of 8, clock 37: slot 5 of block 0 is current (times 32..37 in it)
    first = jnp.asarray([37, 32, 31, 24, 23, 6, -50])
    lo, count = live_blocks(first, 37, 32, 8)
    assert lo.tolist() == [37, 32, 31, 24, 23, 6, 6]
    assert count.tolist() == [1, 1, 2, 2, 3, 4, 4]
    assert page_size(2176) == 128 and page_size(24) == 8 and page_size(4096) == 128 and page_size(4) == 4
