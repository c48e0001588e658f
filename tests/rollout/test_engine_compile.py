"""The slot engine compiled ahead (SlotEngine.compile_ahead, olmax.rollout.engine_compile): one step
compiles every program the engine then runs, in parallel, through JAX's persistent compilation cache,
and a run of several groups with a drain compiles nothing more and gives the tokens of an engine that
compiles each program at its first use. Compiles are counted by JAX's own monitoring event for a
backend compile (jax/_src/dispatch.py BACKEND_COMPILE_EVENT, recorded around every
compiler.compile_or_get_cached call, a persistent-cache hit included)."""

import contextlib

import jax
import numpy as np
import pytest
from models import random_params, small_model

from olmax.errors import ConfigError
from olmax.rollout import engine as engine_module
from olmax.rollout.engine import SlotEngine
from olmax.rollout.engine_compile import LADDER, ladder
from olmax.rollout.sampler import Sampling

# a shape no other test compiles, so that none of its programs is in this process's memory already
CFG = small_model(vocab_size=300, n_layers=3, global_every=2, sliding_window=6, compute_dtype="float32")
SHAPE = dict(slots=8, cache_len=32, chunk_steps=4, narrow=1, prefill_batch=4, prompt_len=12)
COMPILE = "/jax/core/compile/backend_compile_duration"
CACHED = "/jax/compilation_cache/compile_requests_use_cache"


@contextlib.contextmanager
def events():
    """The monitoring events recorded meanwhile, as (event, the program's name where it has one)."""
    seen: list[tuple[str, str]] = []
    on_duration = lambda event, duration, fun_name="", **kw: seen.append((event, fun_name))  # noqa: E731
    on_event = lambda event, **kw: seen.append((event, ""))  # noqa: E731
    jax.monitoring.register_event_duration_secs_listener(on_duration)
    jax.monitoring.register_event_listener(on_event)
    try:
        yield seen
    finally:
        jax.monitoring.unregister_event_duration_listener(on_duration)
        jax.monitoring.unregister_event_listener(on_event)


def add_groups(engine: SlotEngine) -> None:
    """6 groups of 3 rows on 8 slots (inserts of 1 and 2 prompts, slots reused), ragged prompts of 2-12
    tokens and limits of 1-12, the last group's rows longest: the batch ends in a narrowed drain."""
    rng = np.random.default_rng(4)
    for i, n in enumerate((12, 3, 7, 2, 9, 5)):
        limits = rng.integers(1, 13, 3) if i < 5 else (12, 12, 12)
        engine.add(rng.integers(0, CFG.vocab_size, n).tolist(), 3, first_index=3 * i, limits=limits)


@pytest.fixture(scope="module")
def params():
    params = random_params(CFG, jax.random.key(3))
    params["lm_head"] = params["lm_head"] * 20  # peaked distributions: rows stop at their limits apart
    return params


def test_compiled_ahead_a_run_compiles_nothing_more_and_gives_the_lazy_runs_tokens(params):
    sampling = Sampling(temperature=0.8, seed=7)
    ahead = SlotEngine(CFG, sampling=sampling, **SHAPE)
    with events() as seen:
        ahead.compile_ahead(params)
    programs = ahead._compiled
    # the chunk at both widths, compact, and a prefill and an insert per ladder pair: (1, 16), (2, 16)
    # (4 prompts of 16 are past the prefill budget of 8 x 32 / 8 positions)
    assert ahead._ladder.pairs == ((1, 16), (2, 16))
    assert sorted(programs) == sorted(
        [("chunk", 8), ("chunk", 4), ("compact",)] + [(p, c, 16) for p in ("prefill", "insert") for c in (1, 2)]
    )
    assert all(program is not None for program in programs.values())
    # each compiled once (beside the eager cut of the output layer to the vocabulary, SlotEngine._params)
    compiled = sorted(name for event, name in seen if event == COMPILE and name != "jit(dynamic_slice)")
    assert compiled == sorted(f"jit({key[0]})" for key in programs)
    if jax.config.jax_compilation_cache_dir:  # the suite's (tests/conftest.py): each asked JAX's disk cache
        assert [event for event, _ in seen].count(CACHED) == [event for event, _ in seen].count(COMPILE)

    add_groups(ahead)
    with events() as seen:
        finished = ahead.run(params)
    assert [name for event, name in seen if event == COMPILE] == []
    totals = ahead.totals
    assert totals.moved_rows > 0 and totals.slot_steps < 8 * totals.decode_steps  # the drain narrowed
    assert totals.prefills < totals.inserted_rows == 18 > 8  # slots reused, a group's rows share a prefill

    lazy = SlotEngine(CFG, sampling=sampling, **SHAPE)
    add_groups(lazy)
    want = lazy.run(params)
    assert lazy._compiled.keys() == {("chunk", 4)}  # the lazy path's own narrowed program, nothing ahead
    assert [f.index for f in finished] == [f.index for f in want] == list(range(18))
    for got, row in zip(finished, want):
        np.testing.assert_array_equal(got.tokens, row.tokens)
        np.testing.assert_array_equal(got.logprobs, row.logprobs)
        assert got.finish == row.finish


def test_the_ladder_bounds_the_prefill_programs_and_holds_every_insert():
    """Every program SlotEngine._insert_batches can make (k sequences, padded to count(k), of a width
    bucket, count x width within the budget unless k = 1) is a pair of the ladder, and the ladder has at
    most LADDER pairs: intermediate counts go first, then the narrowest widths."""
    # (prompt_len, most, budget): the engine tests', the demo's, the 190m benchmark's, 128 slots of 2048 +
    # 8192 positions, and the CPU benchmark's without a prompt_len
    shapes = [
        (23, 4, 12),
        (64, 8, 64 * 192 // 8),
        (128, 8, 64 * 2176 // 8),
        (2048, 16, 128 * 10240 // 8),
        (127, 2, 256),
    ]
    for prompt_len, most, budget in shapes:
        buckets = ladder(prompt_len, most, budget)
        assert len(buckets.pairs) <= LADDER
        for k in range(1, most + 1):
            for length in range(1, prompt_len + 1):
                count, width = buckets.count(k), buckets.width(length)
                assert count >= k and width >= length
                if k == 1 or count * width <= budget:
                    assert (count, width) in buckets.pairs, (prompt_len, most, budget, k, length)
    # small shapes keep the powers of two (the engine tests' programs); the demo's loses counts 2 and 4
    assert ladder(23, 4, 12) == ((1, 2, 4), (16, 32), ((1, 16), (1, 32)))
    assert ladder(64, 8, 64 * 192 // 8).counts == (1, 8)
    assert ladder(2048, 16, 128 * 10240 // 8).widths == (512, 1024, 2048)


def test_the_widths_below_the_shortest_prompt_are_not_compiled(params, monkeypatch):
    """compile_ahead(shortest=17): no prompt takes the 16-wide bucket, so neither of its programs is
    compiled (the programs lowered, their compile left out here)."""
    engine = SlotEngine(CFG, slots=8, cache_len=48, chunk_steps=4, narrow=0, prefill_batch=1, prompt_len=40)
    assert engine._ladder.pairs == ((1, 16), (1, 32), (1, 64))
    monkeypatch.setattr(engine_module, "compile_all", lambda lowered, workers: dict.fromkeys(lowered, "compiled"))
    engine.compile_ahead(params, shortest=17)
    assert sorted(engine._compiled) == [("chunk", 8)] + [(p, 1, w) for p in ("insert", "prefill") for w in (32, 64)]


def test_a_prompt_past_prompt_len_is_refused():
    engine = SlotEngine(CFG, **SHAPE)
    with pytest.raises(ConfigError, match="prompt_len=12"):
        engine.add(list(range(13)), limits=2)
    with pytest.raises(ConfigError, match="prompt_len"):
        SlotEngine(CFG, slots=4, cache_len=16, prompt_len=16)
