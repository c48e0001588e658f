"""The n-gram repetition instance filter (OLMo-core `InstanceFilterConfig`), off by default.

An instance is rejected when some n-gram of length p (1 <= p <= 13, and p <= len/3) repeats back to
back at least 32 times. A rejected instance still trains on nothing: all of its labels are ignored,
but it counts in the loss denominator (docs/reference.md, "Loss"). AI2's official OLMo 3 7B run did not use
the filter; the MaxText reproduction did.

Method: for period p, positions i with x[i] == x[i + p] form runs; a run of L such positions is a
stretch of L + p tokens with period p, i.e. floor((L + p) / p) back-to-back repeats. This is exact;
OLMo-core's `find_periodic_sequences` finds the same stretches by comparing aligned rows of width p
(tests/data/test_data_filters.py checks the decisions agree).
"""

from __future__ import annotations

import numpy as np

MIN_PERIOD = 1
MAX_PERIOD = 13
MAX_COUNT = 32


def max_repeats(tokens: np.ndarray, period: int) -> int:
    """The most back-to-back repeats of any length-`period` n-gram in `tokens` (0 if too short)."""
    x = np.asarray(tokens)
    if len(x) <= period:
        return 0
    same = np.concatenate([[False], x[:-period] == x[period:], [False]])
    edges = np.flatnonzero(np.diff(same.astype(np.int8)))  # run starts and ends, alternating
    if edges.size == 0:
        return 0
    longest_run = int((edges[1::2] - edges[0::2]).max())
    return (longest_run + period) // period


def keep_instance(
    tokens: np.ndarray, max_period: int = MAX_PERIOD, min_period: int = MIN_PERIOD, max_count: int = MAX_COUNT
) -> bool:
    """False when some n-gram of length min_period..max_period repeats >= max_count times in a row."""
    longest_period = min(max_period, len(tokens) // 3)
    return all(max_repeats(tokens, p) < max_count for p in range(min_period, longest_period + 1))


def instance_mask(batch: np.ndarray, **kwargs) -> np.ndarray:
    """(batch,) bool: True where the instance is kept (its labels count)."""
    return np.array([keep_instance(row, **kwargs) for row in batch], dtype=bool)
