"""The n-gram repetition filter against ai2-olmo-core 3.0.0's find_periodic_sequences."""

from __future__ import annotations

import numpy as np
import pytest

from olmax.data.filters import instance_mask, keep_instance, max_repeats


def olmo_core_keep(tokens: np.ndarray) -> bool:
    from olmo_core.data.utils import find_periodic_sequences

    # OLMo-core's defaults: InstanceFilterConfig(repetition_max_period=13, min_period=1, max_count=32)
    return not any(m.times >= 32 for m in find_periodic_sequences(tokens, max_period=13, min_period=1))


def with_repeat(rng, length, period, times, start, vocab=50):
    x = rng.integers(1000, 100000, size=length)  # distinct-ish background
    gram = rng.integers(0, vocab, size=period)
    piece = np.tile(gram, times)[: length - start]
    x[start : start + len(piece)] = piece
    return x


@pytest.mark.parity
def test_crafted_boundaries_match_olmo_core():
    rng = np.random.default_rng(0)
    checked = 0
    for period in range(1, 16):
        for times in (30, 31, 32, 33, 40):
            for start in (0, 1, period + 3, 57):
                length = 600
                if start + period * times > length:
                    continue
                x = with_repeat(rng, length, period, times, start)
                ours, theirs = keep_instance(x), olmo_core_keep(x)
                assert ours == theirs, (period, times, start)
                checked += 1
    assert checked > 200
    # the threshold is where it must be: 32 repeats of a 13-gram rejects, 31 keeps, a 14-gram is ignored
    assert not keep_instance(with_repeat(rng, 600, 13, 32, 5))
    assert keep_instance(with_repeat(rng, 600, 13, 31, 5))
    assert keep_instance(with_repeat(rng, 600, 14, 40, 5))


@pytest.mark.parity
def test_partial_repeats_and_short_instances_match_olmo_core():
    rng = np.random.default_rng(1)
    for _ in range(300):
        length = int(rng.integers(20, 300))
        period = int(rng.integers(1, 14))
        times = int(rng.integers(25, 40))
        start = int(rng.integers(0, length))
        x = with_repeat(rng, length, period, times, start, vocab=int(rng.integers(1, 4)))
        # a partial tail n-gram (repeat count not an integer) exercises the end offset
        assert keep_instance(x) == olmo_core_keep(x)


@pytest.mark.parity
def test_random_inputs_match_olmo_core():
    rng = np.random.default_rng(2)
    for vocab in (2, 3, 5, 100):
        for _ in range(40):
            x = rng.integers(0, vocab, size=int(rng.integers(1, 400)))
            assert keep_instance(x) == olmo_core_keep(x), (vocab, x.tolist())


def test_max_repeats_counts_exactly():
    x = np.array([9, 1, 2, 1, 2, 1, 2, 1, 8])
    assert max_repeats(x, 2) == 3  # "1 2" three times, then a trailing "1"
    assert max_repeats(np.zeros(40, dtype=np.int64), 1) == 40
    mask = instance_mask(np.stack([np.zeros(64, dtype=np.int64), np.arange(64)]))
    assert mask.tolist() == [False, True]
