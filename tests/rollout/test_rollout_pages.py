"""The slot engine's paged KV cache (olmax.rollout.pages, EngineConfig.kv_gib).

- the blocks a row needs are the ring blocks of the times it holds, counted against a brute force
  over times; pages are taken all or none, given back, moved with a row; the pools fit the GiB given
  and refuse one that cannot hold one row;
- the engine on a pool of about half its slots' rings gives the static sampler's tokens and log-probs
  (1e-5, float32), with the rows that do not fit preempted and prefilled again, slots reused and the
  rings wrapped (the rows of tests/rollout/test_rollout_engine.py; its model with a window of 8, whose
  ring's one block is the full rings' block size: each array takes its own ring's tables).
"""

import jax
import numpy as np
import pytest
from models import random_params, small_model

from olmax.errors import ConfigError
from olmax.rollout.engine import SlotEngine
from olmax.rollout.pages import TRASH, Pages, page_bytes, pool_sizes
from olmax.rollout.sampler import FINISH, Sampling, sample

# the window's ring (8 slots) and the full rings (24) in blocks of 8: one page size for both pools
CFG = small_model(vocab_size=300, n_layers=3, global_every=2, sliding_window=8, compute_dtype="float32")
HOT = Sampling(temperature=0.8, top_k=40, top_p=0.95, seed=5)
N, NEW, CACHE = 3, 12, 24


def test_a_row_takes_the_blocks_of_the_times_it_holds():
    pages = Pages({24: 7, 4: 4}, slot_count=3)  # ring 24 in 3 blocks of 8, ring 4 in one block
    for lo, hi in [(0, 0), (5, 12), (22, 25), (3, 40), (-9, 2), (100, 123), (100, 116), (100, 115)]:
        want = {(t % 24) // 8 for t in range(max(lo, hi - 23), hi + 1)}
        got = pages._blocks(24, lo, hi)
        assert set(got) == want or (set(got) > want and len(got) == 3 and hi - lo + 1 > 16)
        assert len(got) == len(set(got))
    assert pages.reserve(0, 5, 12) and (pages.free(24), pages.free(4)) == (4, 2)  # 2 blocks of 24, 1 of 4
    assert pages.missing(0, 5, 18) == {24: [2], 4: []}
    assert pages.reserve(1, 0, 7) and pages.reserve(0, 5, 18) and (pages.free(24), pages.free(4)) == (2, 1)
    # slot 2 needs 3 blocks of ring 24 and 1 of ring 4: ring 4's would be there, ring 24's not: none taken
    assert not pages.reserve(2, 0, 23) and (pages.free(24), pages.free(4)) == (2, 1)
    assert (pages.tables[24][2] == TRASH).all() and (pages.tables[4][2] == TRASH).all()
    assert pages.newest([0, 1]) == 1 and pages.newest([0]) == 0
    pages.release(1)
    assert (pages.free(24), pages.free(4)) == (3, 2) and (pages.tables[24][1] == TRASH).all()
    pages.move(0, 2)
    assert (pages.tables[24][0] == TRASH).all() and sorted(pages.tables[24][2]) == [1, 2, 4]
    assert pages.reserve(2, 5, 30) and pages.newest([1, 2]) == 2  # it already held pages: the slot's age moved


def test_pools_fit_the_memory_given():
    costs = page_bytes(CFG, CACHE)  # ring 24 (two global layers) in pages of 8, ring 8 (the window layer)
    assert costs == {24: 2 * 8 * 2 * 16 * 4, 8: 8 * 2 * 16 * 4}
    sizes = pool_sizes(CFG, 4, CACHE, 7 * costs[24] / 2**30)
    assert sizes[24] < 7 and sum(n * costs[s] for s, n in sizes.items()) <= 7 * costs[24]
    assert sizes[8] == min(4 + 1, (sizes[24] - 1) * 8 // 8 + 4 + 1)
    assert pool_sizes(CFG, 4, CACHE, 1.0) == {24: 4 * 3 + 1, 8: 4 + 1}  # whole rings: no more
    with pytest.raises(ConfigError, match="fewer than one row"):
        pool_sizes(CFG, 4, CACHE, 2 * costs[24] / 2**30)


def test_a_paged_engine_gives_the_static_samplers_rollout():
    params = random_params(CFG, jax.random.key(2))
    params["lm_head"] = params["lm_head"] * 20
    rng = np.random.default_rng(2)
    prompts = [rng.integers(0, CFG.vocab_size, n).tolist() for n in (3, 9, 5, 12, 7, 1)]
    limits = rng.integers(1, NEW + 1, len(prompts) * N)
    limits[:N] = NEW
    want = sample(params, CFG, prompts, NEW, n=N, sampling=HOT, limits=limits)
    costs = page_bytes(CFG, CACHE)
    gib = (7 * costs[24] + 5 * costs[8]) / 2**30  # 6 pages of 8 positions for 4 slots of 24
    engine = SlotEngine(
        CFG, slots=4, cache_len=CACHE, sampling=HOT, chunk_steps=5, narrow=1, prefill_batch=4, kv_gib=gib
    )
    assert engine._pages.sizes[24] == 7
    for i, p in enumerate(prompts):
        engine.add(p, N, first_index=i * N, limits=limits[i * N : (i + 1) * N])
    finished = engine.run(params)
    tokens, logprobs, lengths = (np.asarray(x) for x in (want.tokens, want.logprobs, want.lengths))
    assert [f.index for f in finished] == list(range(len(lengths)))
    for f in finished:
        n = lengths[f.index]
        np.testing.assert_array_equal(f.tokens, tokens[f.index, :n])
        np.testing.assert_allclose(f.logprobs, logprobs[f.index, :n], atol=1e-5, rtol=0)
        assert f.finish == FINISH[int(np.asarray(want.finish)[f.index])]
    totals = engine.totals
    assert totals.preempted_rows > 0 and totals.inserted_rows > len(finished)  # preempted rows came back
    assert int(engine._state.clock) == engine._clock > CACHE + 8  # rings wrapped; the host follows the clock
    assert all(engine._pages.free(s) == n - 1 for s, n in engine._pages.sizes.items())  # every page back
