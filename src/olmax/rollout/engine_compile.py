"""The slot engine's programs compiled ahead (`SlotEngine.compile_ahead`, olmax.rollout.engine): which
prefill and insert programs an engine can need (its bucket ladder), and compiling lowered programs in
parallel.

A prefill and its insert are one program per (sequences, width) bucket. Left alone, the buckets are
powers of two on both axes (1, 2, 4, ... sequences; 16, 32, ... tokens), which for 64 slots and
prompts of up to 128 tokens is 4 x 4 pairs, 32 programs. The ladder keeps at most LADDER pairs: it
drops the intermediate sequence counts first (a program of 3 sequences pads to 8 instead of 4: the
padding prompts are one token each, and a prefill is a small share of a rollout), then the narrowest
widths (a shorter prompt is left-padded to the narrowest width kept). A program's tokens and log-probs
do not depend on its bucket: the padding is never copied into a slot.

Compiling: tracing and lowering run in Python, so `SlotEngine.compile_ahead` lowers each program in
turn; XLA's compile of a lowered program releases the GIL (jax.stages.Lowered.compile), so they compile
together in a thread pool. Each goes through JAX's persistent compilation cache as a jitted call's
compile does (jax/_src/interpreters/pxla.py `_cached_compilation` -> compiler.compile_or_get_cached,
jax 0.10.2), so `olmax train` (olmax.fit.compile_cache) reads them back on the next run.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

from olmax.rollout.sampler import _bucket

LADDER = 6  # (sequences, width) pairs at most: 12 programs beside the chunks and compact


class Ladder(NamedTuple):
    """The prefill buckets an engine uses: sequence counts and widths (powers of two, ascending), and
    the (count, width) pairs its inserts can reach (a width's counts are bounded by the prefill budget)."""

    counts: tuple[int, ...]
    widths: tuple[int, ...]
    pairs: tuple[tuple[int, int], ...]  # (count, width)

    def width(self, length: int) -> int:
        """The prefill width of a sequence of `length` tokens: the narrowest of the ladder's that holds
        it; a longer one (a restored row's prompt + tokens past prompt_len) its power of two."""
        return next((w for w in self.widths if w >= length), _bucket(length))

    def count(self, sequences: int) -> int:
        """The prompt count a program of `sequences` sequences is padded to."""
        return next((c for c in self.counts if c >= sequences), _bucket(sequences, 1))


def ladder(prompt_len: int, most: int, budget: int, cap: int = LADDER) -> Ladder:
    """The buckets for prompts of at most `prompt_len` tokens and at most `most` sequences a program,
    whose padded count x width stays within `budget` but for a sequence alone (SlotEngine's
    _insert_batches keeps its programs so); thinned to at most `cap` pairs (module doc)."""
    counts = [1 << k for k in range(_bucket(most, 1).bit_length())]
    widths = [1 << k for k in range(_bucket(1).bit_length() - 1, _bucket(prompt_len).bit_length())]
    pairs = lambda: [(c, w) for w in widths for c in counts if c == 1 or c * w <= budget]  # noqa: E731
    while len(pairs()) > cap and len(counts) > 2:
        counts.pop(-2)
    while len(pairs()) > cap and len(widths) > 1:
        widths.pop(0)
    return Ladder(tuple(counts), tuple(widths), tuple(pairs()))


def compile_all(lowered: dict, workers: int = 0) -> dict:
    """Each lowered program compiled (jax.stages.Lowered -> Compiled), by key; `workers` threads (0:
    one per program, at most the host's cores; 1: one after another, in order)."""
    workers = workers or min(len(lowered), os.cpu_count() or 1)
    if workers <= 1:
        return {key: program.compile() for key, program in lowered.items()}
    with ThreadPoolExecutor(workers, thread_name_prefix="compile") as pool:
        futures = {key: pool.submit(program.compile) for key, program in lowered.items()}
        return {key: future.result() for key, future in futures.items()}
