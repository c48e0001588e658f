"""The slot engine (olmax.rollout.engine): continuous batching gives the static sampler's rollout.

The model has 3 layers (a scanned group of a window-4 layer and a global one, and a global tail layer),
so both cache layouts are exercised. The engine runs with fewer slots than rows, ragged prompts and
per-row limits, so slots are reused by rows of other prompts, each row's ring holds its left padding's
keys at times before its first (bucketed prompt widths), and the shared clock runs past the cache
length (every full-attention ring wraps, the window rings many times). Against
olmax.rollout.sampler.sample with the same seed and row indices:

- the same tokens, lengths and finish reasons, log-probs within 1e-5 in float32, sampled (temperature,
  top-k, top-p) and greedy, with EOS ids and a stop-text automaton, on one device and on 8 CPU devices
  (data 2 x fsdp 2 x tensor 2: parameters as the trainer shards them, slots split over the batch axes);
- a snapshot taken mid-run and restored into a new engine (each row re-prefilled as prompt + its tokens
  so far) ends with the same rows as the uninterrupted run;
- parameters changed between chunks: each token is tagged with the version whose logits drew it;
- the scheduler's counters on a schedule worked out by hand, with and without the drain's narrowed
  decoding (a decoding step of the cache's first rows: those rows' logits and rings, the others'
  untouched), and errors that name the field at fault.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from models import random_params, small_model

from olmax.config.mesh import MeshConfig
from olmax.errors import ConfigError
from olmax.model.olmo3 import abstract_params, param_shardings
from olmax.model.sharding import make_mesh
from olmax.rollout import engine as engine_module
from olmax.rollout.cache import cached_forward, init_cache
from olmax.rollout.engine import SlotEngine
from olmax.rollout.sampler import FINISH, Sampling, _eos_table, _text_table, sample

CFG = small_model(vocab_size=300, n_layers=3, global_every=2, sliding_window=4, compute_dtype="float32")
HOT = Sampling(temperature=0.8, top_k=40, top_p=0.95, seed=5)
N, NEW, CACHE = 3, 12, 24  # samples per prompt, max new tokens, the engine's cache length (longest prompt 12)
# an automaton that never stops (olmax.rollout.text.stop_table's form): the engines without stops run the
# decode programs of those with the stops below (a text table of the same shape), compiled once
NEVER = np.zeros((2, CFG.vocab_size), np.int32)


@pytest.fixture(scope="module")
def setup():
    params = random_params(CFG, jax.random.key(2))
    params["lm_head"] = params["lm_head"] * 20  # peaked distributions, and some spread
    rng = np.random.default_rng(2)
    prompts = [rng.integers(0, CFG.vocab_size, n).tolist() for n in (3, 9, 5, 12, 7, 1)]
    limits = rng.integers(1, NEW + 1, len(prompts) * N)
    limits[:N] = NEW  # the first group runs to the end: its tokens choose the stops below
    limits[-N:] = (1, 2, NEW)  # the last group's last row (its highest slot) stops last: the drain narrows
    # (the engines here narrow once, to 2 of 4 slots, and decode 5 steps a chunk: every engine of the
    # file runs the same decode programs, each compiled once)
    # no stops yet: the same program as the one with the stops below
    automaton = NEVER.copy()
    free = sample(params, CFG, prompts, NEW, n=N, sampling=HOT, limits=limits, stop_text=automaton)
    tokens = np.asarray(free.tokens)
    pair = tokens[1, 4:6].tolist()  # a stop string spelled by row 1's 5th and 6th tokens
    # row 0 ends at the first of its 5th to 9th tokens that the first group's rows do not draw before
    # their 5th (nor row 1 before its stop string): that group's rows all decode a first chunk's 5 steps
    eos = next(int(t) for t in tokens[0, 4:9] if t not in tokens[:N, :4] and t not in tokens[1, :6])
    automaton[:, pair[0]] = 1
    automaton[1, pair[1]] = -1
    stops = dict(eos_ids=[eos], stop_text=automaton)
    return params, prompts, limits, stops


@pytest.fixture(scope="module")
def want(setup):
    """The static sampler's rollout of setup's rows, sampled (HOT) with the stops."""
    params, prompts, limits, stops = setup
    return sample(params, CFG, prompts, NEW, n=N, sampling=HOT, limits=limits, **stops)


def run_engine(params, prompts, limits, stops, sampling, slots, mesh=None):
    engine = SlotEngine(
        CFG, mesh, slots=slots, cache_len=CACHE, sampling=sampling, chunk_steps=5, narrow=1, prefill_batch=4, **stops
    )
    for i, p in enumerate(prompts):
        engine.add(p, N, first_index=i * N, limits=limits[i * N : (i + 1) * N])
    return engine, engine.run(params)


def assert_same_rollout(finished, want):
    tokens, logprobs, lengths = (np.asarray(x) for x in (want.tokens, want.logprobs, want.lengths))
    assert [f.index for f in finished] == list(range(len(lengths)))
    for f in finished:
        n = lengths[f.index]
        np.testing.assert_array_equal(f.tokens, tokens[f.index, :n])
        np.testing.assert_allclose(f.logprobs, logprobs[f.index, :n], atol=1e-5, rtol=0)
        assert f.finish == FINISH[int(np.asarray(want.finish)[f.index])]


@pytest.mark.parametrize("sampling", [HOT, pytest.param(Sampling(), marks=pytest.mark.slow)], ids=["sampled", "greedy"])
def test_the_static_samplers_rollout(setup, want, sampling):
    params, prompts, limits, stops = setup
    if sampling is not HOT:
        want = sample(params, CFG, prompts, NEW, n=N, sampling=sampling, limits=limits, **stops)
    engine, finished = run_engine(params, prompts, limits, stops, sampling, slots=4)
    assert_same_rollout(finished, want)
    finish = {f.finish for f in finished}
    assert finish == {"length", "eos", "stop"} if sampling is HOT else "length" in finish
    # what the test needs to prove the mask: slots reused, every ring wrapped (rows inserted while the
    # clock was under 12 had their first times below 0, and those after clock 24 wrapped rings);
    # and the drain narrowed (sampled: rows moved to the first slots to be decoded there)
    totals = engine.totals
    assert totals.inserted_rows == len(finished) > 4 and int(engine._state.clock) > CACHE + 8
    assert totals.slot_steps < 4 * totals.decode_steps and (totals.moved_rows > 0 or sampling is not HOT)
    assert totals.prefills < totals.inserted_rows  # a group's rows inserted together share a prefill
    assert totals.useful_tokens == totals.busy_slot_steps == sum(len(f.tokens) for f in finished)
    assert all((f.versions == 0).all() for f in finished)


@pytest.mark.slow  # the default suite's 10 minutes (docs/testing.md)
def test_sharded_engine_equals_the_static_sampler(setup, want):
    params, prompts, limits, stops = setup
    mesh = make_mesh(MeshConfig(data=2, fsdp=2, context=1, tensor=2))
    sharded = jax.device_put(params, param_shardings(CFG, mesh))  # as the trainer lays them out
    engine, finished = run_engine(sharded, prompts, limits, stops, HOT, slots=8, mesh=mesh)
    assert engine._state.cache["group"][0].sharding.spec[1] == ("data", "fsdp")
    assert engine.totals.slot_steps == 8 * engine.totals.decode_steps  # no narrowing over split slots
    assert_same_rollout(finished, want)


def test_a_restored_snapshot_ends_as_the_uninterrupted_run(setup, want):
    params, prompts, limits, stops = setup
    first = SlotEngine(CFG, slots=4, cache_len=CACHE, sampling=HOT, chunk_steps=5, narrow=1, **stops)
    for i, p in enumerate(prompts):
        first.add(p, N, first_index=i * N, limits=limits[i * N : (i + 1) * N])
    done = [f for _ in range(8) for f in first.run_chunk(params, version=7).finished]
    snap = first.snapshot()
    assert len(snap["index"]) == first.active() + first.pending() == len(limits) - len(done)
    assert snap["token_lens"].max() > 0 and (snap["versions"] == 7).all()  # rows caught mid-response
    # a row whose prompt + tokens are prefilled 32 wide, past the 24-slot rings: each keeps its newest times
    assert (snap["prompt_lens"] + snap["token_lens"]).max() > 16
    second = SlotEngine(CFG, slots=4, cache_len=CACHE, sampling=HOT, chunk_steps=5, narrow=1, **stops)
    second.restore({k: v.copy() for k, v in snap.items()}, next_group=40)
    assert second.pending() == len(snap["index"]) and second.add([1], limits=1) == 40
    finished = sorted(done + [f for f in second.run(params, version=7) if f.group != 40], key=lambda f: f.index)
    assert_same_rollout(finished, want)
    assert all((f.versions == 7).all() for f in finished)


def test_a_snapshot_inside_a_stop_string_keeps_its_automaton_state(setup, want):
    """Row 1 spells the stop string (setup's pair) with its 5th and 6th tokens: snapshotted after its 5th
    (the first chunk's 5 steps), half of the string matched, the restored row stops at its 6th, as the
    uninterrupted run does (the static sampler's first group: its rows are keyed by their index alone)."""
    params, prompts, limits, stops = setup
    first = SlotEngine(CFG, slots=4, cache_len=CACHE, sampling=HOT, chunk_steps=5, narrow=1, **stops)
    first.add(prompts[0], N, limits=limits[:N])
    done = first.run_chunk(params).finished
    snap = first.snapshot()
    row = list(snap["index"]).index(1)
    assert snap["token_lens"][row] == 5 and snap["text"][row] == 1  # in the middle of the stop string
    second = SlotEngine(CFG, slots=4, cache_len=CACHE, sampling=HOT, chunk_steps=5, narrow=1, **stops)
    second.restore(snap)
    finished = sorted(done + second.run(params), key=lambda f: f.index)
    assert_same_rollout(finished, type(want)(*(x[:N] for x in want)))
    assert finished[1].finish == "stop" and len(finished[1].tokens) == 6


def test_a_narrowed_program_is_kept_only_where_it_fits_the_free_memory():
    """engine.fits: a program's temporaries against the device's limit less what is in use now."""

    class Device:
        def __init__(self, stats):
            self.memory_stats = lambda: stats

    class Compiled:
        def __init__(self, temp):
            self.memory_analysis = lambda: type("Memory", (), {"temp_size_in_bytes": temp})()

    tpu = Device({"bytes_limit": 100, "bytes_in_use": 60})
    assert engine_module.fits(Compiled(40), tpu) and not engine_module.fits(Compiled(41), tpu)
    assert engine_module.fits(Compiled(41), Device({"bytes_limit": 100, "bytes_in_use": 0}))
    assert engine_module.fits(Compiled(10**12), Device(None))  # a CPU reports no memory: always


def test_each_token_carries_the_version_that_drew_it(setup):
    """4 rows of 12 tokens, 5 steps per chunk; the parameters change after the first chunk. Token 5 (the
    second chunk's first) is drawn from logits the first chunk computed: version 0, the old policy's
    token and log-prob; from token 6 on the new policy's (version 1), which changes the rollout."""
    params, prompts, _, _ = setup
    other = random_params(CFG, jax.random.key(3))
    other["lm_head"] = other["lm_head"] * 20
    runs = []
    for switch in (False, True):  # the old policy throughout (as the static sampler: tests above), then switched
        engine = SlotEngine(CFG, slots=4, cache_len=CACHE, sampling=HOT, chunk_steps=5, narrow=1, stop_text=NEVER)
        engine.add(prompts[0], 4, limits=NEW)
        assert engine.run_chunk(params, version=0).finished == []
        runs.append(engine.run(other if switch else params, version=int(switch)))
    for old, new in zip(*runs):
        np.testing.assert_array_equal(new.versions, [0] * 6 + [1] * 6)
        np.testing.assert_array_equal(new.tokens[:6], old.tokens[:6])
        np.testing.assert_allclose(new.logprobs[:6], old.logprobs[:6], atol=1e-5, rtol=0)
    assert any((new.tokens[6:] != old.tokens[6:]).any() for old, new in zip(*runs))


def test_counters_follow_the_schedule(setup):
    """4 slots, refill_at 2, 5 steps per chunk, groups of 2 rows with limits 4, 8, 4, 8 (EOS off). Chunk 1:
    groups 0 (slots 0, 1) and 1 (slots 2, 3); group 0 stops after 4 steps, which frees 2 slots: the chunk
    ends. Chunk 2: group 2 enters slots 0, 1 on one prefill; it and group 1 stop 4 steps later. Chunks 3
    and 4: group 3 alone in slots 0, 1, 5 + 3 steps, decoded 2 slots wide (narrowed). Without narrowing
    the slots 2 and 3 idle through them; with it group 3's 16 tokens take 16 slot steps. Then groups 0
    and 1 once more: the first chunk ends when group 0 stops (nothing waits, and 2 slots hold the rows
    left); group 1 moves from slots 2, 3 to 0, 1 and is decoded 2 wide."""
    params, prompts, _, _ = setup
    for narrow, slot_steps in ((0, 64), (1, 48)):
        engine = SlotEngine(
            CFG, slots=4, cache_len=CACHE, sampling=HOT, chunk_steps=5, narrow=narrow, refill_at=2, stop_text=NEVER
        )
        for g, limit in enumerate((4, 8, 4, 8)):
            engine.add(prompts[g], 2, first_index=2 * g, limits=limit)
        steps = []
        while engine.pending() or engine.active():
            steps.append(engine.run_chunk(params).counters.decode_steps)
        t = engine.totals
        assert steps == [4, 4, 5, 3]
        assert (t.decode_steps, t.useful_tokens, t.busy_slot_steps, t.inserted_rows, t.prefills) == (16, 48, 48, 8, 4)
        assert (t.slot_steps, t.moved_rows) == (slot_steps, 0)
        # a narrowed step reads the weights whole: its 2 idle slots count at the weights' share of a step
        share = engine._weight_share(params)
        assert 0.5 < share < 1 and t.slot_efficiency == 48 / t.read_slot_steps
        assert t.read_slot_steps == pytest.approx(64 - (64 - slot_steps) * (1 - share), rel=1e-12)
    engine.add(prompts[0], 2, limits=4)
    engine.add(prompts[1], 2, first_index=2, limits=8)
    first = engine.run_chunk(params).counters
    second = engine.run_chunk(params)
    assert (first.decode_steps, first.slot_steps) == (4, 16)
    assert (second.counters.moved_rows, second.counters.slot_steps) == (2, 8)
    assert [f.index for f in second.finished] == [2, 3] and all(len(f.tokens) == 8 for f in second.finished)


def test_a_narrowing_that_does_not_fit_decodes_wider(setup, monkeypatch):
    """Where a narrowed program needs more memory than the device has free (engine.fits: on a v5e the
    compiler copied a 1B's rings in its width-8 program), the engine drops that width and decodes the
    drain wider: narrow=0's schedule and slot steps, the same tokens."""
    params, prompts, _, _ = setup

    def run(narrow):
        engine = SlotEngine(
            CFG, slots=4, cache_len=CACHE, sampling=HOT, chunk_steps=5, narrow=narrow, refill_at=2, stop_text=NEVER
        )
        for g, limit in enumerate((4, 8, 4, 8)):
            engine.add(prompts[g], 2, first_index=2 * g, limits=limit)
        return engine, engine.run(params)

    wide, want = run(0)
    monkeypatch.setattr(engine_module, "fits", lambda compiled, device: False)
    engine, got = run(1)
    assert engine._widths == (4,) and engine.totals.slot_steps == wide.totals.slot_steps == 64
    assert engine.totals.decode_steps == wide.totals.decode_steps
    for f, w in zip(got, want):
        np.testing.assert_array_equal(f.tokens, w.tokens)


def test_a_decoding_step_of_fewer_rows_runs_on_the_first_rows(setup):
    """olmax.rollout.cache's narrowed step, which the drain uses: 2 rows of tokens on a 4-row cache give
    the first 2 rows of the 4-row step, write only their rings, and leave the other rows' untouched."""
    params = setup[0]
    seq = np.random.default_rng(3).integers(0, CFG.vocab_size, (4, 9)).astype(np.int32)
    # the empty cache made inside the program: no eager op of its own to compile
    prefill = jax.jit(lambda p, x: cached_forward(p, init_cache(CFG, 4, 16), x, 0, CFG, None, 16, fresh=True)[1])
    cache = prefill(params, seq[:, :8])
    step = jax.jit(lambda p, c, x: cached_forward(p, c, x, 8, CFG, jnp.zeros(x.shape[0], jnp.int32), 16))
    whole, whole_cache = step(params, cache, seq[:, 8:])
    part, part_cache = step(params, cache, seq[:2, 8:])
    np.testing.assert_allclose(np.asarray(part), np.asarray(whole)[:2], atol=1e-5, rtol=0)
    for before, got, want in zip(*(jax.tree.leaves(c) for c in (cache, part_cache, whole_cache))):
        rows = lambda x, s: np.asarray(x)[(slice(None),) * (x.ndim - 4) + (s,)]
        np.testing.assert_array_equal(rows(got, slice(0, 2)), rows(want, slice(0, 2)))
        np.testing.assert_array_equal(rows(got, slice(2, 4)), rows(before, slice(2, 4)))
    with pytest.raises(ValueError, match="5 rows of tokens on a cache of 4 rows"):
        cached_forward(params, cache, np.zeros((5, 1), np.int32), 8, CFG)


def test_errors_name_the_field():
    with pytest.raises(ConfigError, match="cache_len=24"):
        SlotEngine(CFG, slots=4, cache_len=24).add(list(range(13)), limits=12)
    with pytest.raises(ConfigError, match="limits"):
        SlotEngine(CFG, slots=4, cache_len=24).add([1, 2], 2, limits=[3])
    with pytest.raises(ConfigError, match="prompt"):
        SlotEngine(CFG, slots=4, cache_len=24).add([], limits=3)
    with pytest.raises(ConfigError, match="refill_at=5 exceeds slots=4"):
        SlotEngine(CFG, slots=4, cache_len=24, refill_at=5)
    with pytest.raises(ConfigError, match="slots must be at least 1"):
        SlotEngine(CFG, slots=0, cache_len=24)
    mesh = make_mesh(MeshConfig(data=2, fsdp=2, context=1, tensor=2))
    with pytest.raises(ConfigError, match="slots=6 must be a multiple of the mesh's batch axes"):
        SlotEngine(CFG, mesh, slots=6, cache_len=24)


def test_the_insert_and_decode_programs_on_a_tpu_copy_no_whole_ring():
    """The insert compiled for a v5e chip by libtpu on this host takes and gives the cache in the
    decoding loop's layout (olmax.rollout.slots.cache_formats) and writes its rows into it with no
    copy of a whole ring array: a loop over the rows made the compiler copy the cache into the loop's
    own layout and back, twice its memory (a 190m at 64 slots ran out of the chip's 15.75 GiB). The
    sampled decode program takes that layout as it is: cache_formats finds it with a greedy step."""
    import re

    from jax.sharding import NamedSharding, PartitionSpec

    from olmax.fit import compiler
    from olmax.rollout import slots as engine_slots
    from olmax.rollout.cache import init_cache

    cfg = small_model(
        vocab_size=1024, d_model=256, n_layers=4, global_every=2, n_heads=4, n_kv_heads=4, head_dim=64,
        mlp_hidden=512, sliding_window=64, compute_dtype="bfloat16", param_dtype="bfloat16",
    )  # fmt: skip
    slots, cache_len, key_words = 32, 512, 2
    devices, chip, _ = compiler.target("v5e:1x1")
    mesh = make_mesh(MeshConfig(), devices)
    with jax.set_mesh(mesh):
        # the arguments as the programs pass them (pool None): the layouts found once, in cache_formats' cache
        state = engine_slots.cache_formats(cfg, slots, cache_len, key_words, mesh, None)
        abstract = jax.eval_shape(lambda: engine_slots.init_state(cfg, slots, cache_len, key_words))
        typed = lambda tree, shardings: jax.tree.map(
            lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, shardings
        )
        rep = NamedSharding(mesh, PartitionSpec())
        ints = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.int32, sharding=rep)
        fresh = jax.eval_shape(lambda: init_cache(cfg, 2, 32))  # two prompts of 32: narrower than every ring
        args = (
            jax.ShapeDtypeStruct((2, cfg.vocab_size), jnp.float32, sharding=rep),
            jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=rep), fresh),
            ints(),
            *[ints(slots)] * 6,  # each slot's sequence and its row's values
            jax.ShapeDtypeStruct((slots, key_words), jnp.uint32, sharding=rep),
            None,  # no page tables: every slot its ring
        )
        program = engine_slots.programs(cfg, slots, cache_len, 8, "sample", key_words, mesh).insert
        lowered = program.lower(typed(abstract, state), *args)
        compiled, _ = compiler.compile_lowered(lowered, compiler.target_options(chip, "tpu"), "insert", "tpu")
        tables = (
            jax.ShapeDtypeStruct((3,), jnp.float32, sharding=rep),
            ints(*_eos_table((0,)).shape),
            ints(*_text_table(None, cfg.vocab_size).shape),
            ints(),
            None,
        )
        params = typed(abstract_params(cfg), param_shardings(cfg, mesh))
        chunk = engine_slots.programs(cfg, slots, cache_len, 8, "sample", key_words, mesh).chunk(slots)
        lowered = chunk.lower(params, typed(abstract, state), *tables)
        decode, _ = compiler.compile_lowered(lowered, compiler.target_options(chip, "tpu"), "chunk", "tpu")
    rings = {tuple(x.shape) for x in jax.tree.leaves(abstract.cache)}
    sizes = {math.prod(r) for r in rings}
    made = lambda program: [  # (shape, opcode) of every bf16 array an instruction makes
        (tuple(int(d) for d in m.group(1).split(",")), m.group(2))
        for m in re.finditer(r"= bf16\[([\d,]+)\]\{[^}]*\} ([\w-]+)\(", program.as_text())
    ]
    assert not [op for shape, op in made(decode) if shape in rings and op == "copy"]
    assert not [op for shape, op in made(compiled) if shape in rings and op == "copy"]
    # a ring rewritten in another shape (a scatter at (slot, position) pairs flattened them into one
    # axis, which transposed every ring array whole: 90 ms an insert for a 190m on the chip)
    assert not [(shape, op) for shape, op in made(compiled) if math.prod(shape) in sizes and shape not in rings]
    memory = compiled.memory_analysis()
    assert memory.temp_size_in_bytes < 0.25 * memory.output_size_in_bytes
