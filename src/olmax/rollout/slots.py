"""The slot engine's device side (olmax.rollout.engine has the host side and the design): the state of
a fixed number of slots on one KV cache, and its jitted programs: `prefill` (prompts once, on rings
of their own), `insert` (their rows into free slots), `chunk` (decode up to K steps in a
`jax.lax.while_loop`, on all the slots or on the first `width` of them) and `compact` (move rows to
the first slots).

Every shape is static: the slots, the cache length, the chunk's K; a prefill's prompt count and width
are bucketed to powers of two (one prefill and one insert program per bucket pair), and the insert
takes its rows' values per slot. The slots share ONE clock, as the static sampler's rows do
(olmax.rollout.cache): a decoding step at time c writes ring slot c % S of every slot's row, one
in-place update at a scalar index.

Inserting a sequence of L tokens at clock c puts its tokens at times c - L .. c - 1 of its slot's row
(first = c - L), so the row's next token is fed at time c with every other slot's. The prefill runs on
a fresh cache at times 0 .. T - 1 (T: the bucketed width, the sequence left-padded) whose rings have
min(S, T) slots (S: the engine's ring), which puts time tau in ring slot tau % min(S, T); the engine's
row wants it in slot (c - T + tau) % S, where each row's min(S, T) slots are written. A prefill longer
than a ring keeps the newest time of each ring slot (cache._fill), which is the time that slot holds
at clock c.

Visibility. A decoding step at clock c attends from each row to the ring slots whose time is in
first .. c (cache._decode_attention: slot s holds time c - ((c - s) mod S), the newest <= c that falls
there; visible when that time >= first). That is exact for a row exactly when every time in
first .. c of its row was written by the row itself, i.e. c - first < S on every full-attention
layer (a window ring only ever holds times within its window): prompt + new tokens <= the cache length,
which `add` checks. The clock grows past S, so full-attention rings wrap like window rings, and the
time a ring slot holds is computed from the clock, not its index. A slot's previous occupant left its
keys at times before the new row's first, which the mask hides, and every time from first on is the
new row's own (the prefill's, then one per step).
Free slots within the decoded width keep being computed, their outputs discarded, with first = c, so
their positions stay in the RoPE table.

Paged (`pool`: ring slots -> pages, olmax.rollout.pages): the cache's arrays are pools of pages and the
host's page tables say where each slot's ring blocks are. The programs take the tables as an argument:
the insert writes each new row's span into its pages (a loop over the slots that take a row: the
pages each one's span touches are read, the new positions chosen into them, and written back; a
block the row does not hold names the trash page, which takes its padding), a decoding step writes
and reads through them (olmax.rollout.cache), and compact moves no cache at all: the host moves the
rows' tables.
"""

from __future__ import annotations

import functools
import math
from typing import Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp
from jax.experimental.layout import Format, Layout, with_layout_constraint
from jax.sharding import NamedSharding, PartitionSpec, SingleDeviceSharding

from olmax.config.mesh import BATCH_AXES
from olmax.config.model import ModelConfig
from olmax.model.olmo3 import abstract_params, param_shardings
from olmax.rollout.cache import cache_spec, cached_forward, init_cache, ring_tree
from olmax.rollout.decode_attention import page_size, ring_table, tiles
from olmax.rollout.sampler import _batch_sharding, _eos_table, _text_table, choose_scored


class SlotState(NamedTuple):
    """The engine's device state, one entry per slot (B slots) but for the clock."""

    cache: dict  # olmax.rollout.cache's layout, batch = the slots
    logits: jax.Array  # (B, vocab) float32: the logits each slot's next token is chosen from
    first: jax.Array  # (B,) int32: the row's first token's time on the shared clock
    count: jax.Array  # (B,) int32: new tokens so far, the row's own t (keys its draws)
    limit: jax.Array  # (B,) int32: the row's max new tokens
    index: jax.Array  # (B,) int32: the row's position in the whole request (keys its draws)
    key: jax.Array  # (B, key words) uint32: the key data of the row's seed
    text: jax.Array  # (B,) int32: the row's text-stop automaton state (olmax.rollout.text.stop_table)
    active: jax.Array  # (B,) bool: a row is decoding in the slot
    finish: jax.Array  # (B,) int32: olmax.rollout.sampler.FINISH code of a row that stopped
    clock: jax.Array  # () int32: the time of the next decoding step's tokens


PER_SLOT = tuple(f for f in SlotState._fields if f not in ("cache", "clock"))


def init_state(cfg: ModelConfig, slots: int, cache_len: int, key_words: int, pool=None) -> SlotState:
    """Empty slots on a zero cache (paged with `pool`: ring slots -> pages, as pairs), clock 0."""
    ints = lambda: jnp.zeros((slots,), jnp.int32)
    return SlotState(
        cache=init_cache(cfg, slots, cache_len, None if pool is None else dict(pool)),
        logits=jnp.zeros((slots, cfg.vocab_size), jnp.float32),
        first=ints(),
        count=ints(),
        limit=ints(),
        index=ints(),
        key=jnp.zeros((slots, key_words), jnp.uint32),
        text=ints(),
        active=jnp.zeros((slots,), bool),
        finish=ints(),
        clock=jnp.int32(0),
    )


def prefill_program(cfg: ModelConfig, cache_len: int):
    """prefill(params, prompts (P, T) left-padded, lengths (P,)) -> (logits (P, vocab) float32 of each
    prompt's last token, the prompts' cache on rings of min(S, T) slots): the prompts run once, however
    many slots each fills (`insert_program` copies them in). A prefill needs no more than T slots a
    ring, and P rows of the engine's whole rings would be P rows of the cache as transient memory."""
    vocab = cfg.vocab_size

    def prefill(params, prompts, lengths):
        p, width = prompts.shape
        fresh = init_cache(cfg, p, min(cache_len, width))
        logits, fresh = cached_forward(
            params, fresh, prompts, 0, cfg, width - lengths, max(cache_len, width), last_only=True, fresh=True
        )
        return logits[:, 0, :vocab], fresh

    return prefill


def insert_program(rings: dict, layouts=None, split: bool = False):
    """insert(state, logits, fresh, width, src, length, index, limit, count, text, key, pages) -> state:
    each slot b with src[b] >= 0 takes prefilled sequence src[b] (of `prefill_program`'s logits and
    rings, its prompts `width` wide, the sequence length[b] long) with its per-row values; slots with
    src[b] = -1 keep their rows. Every argument after `width` but `pages` is per slot (B,); pages: the
    page tables of a paged cache (module doc), else None. rings: each cache array's ring slots
    (olmax.rollout.cache.ring_tree).

    A sequence of width T lands at ring positions clock - width .. clock - width + R - 1 (mod S; R =
    min(S, T), the fresh rings' slots), the same positions for every slot. So for each slot that takes
    a row (a loop over those alone), each ring array is rewritten in the blocks of the ring
    (olmax.rollout.decode_attention.page_size) that span touches: each block read, the new positions
    chosen into it, and written back in place, in the cache's own layout (pinned: a loop whose cache
    the compiler laid out otherwise copied it whole on the way in and out). A block is one of the ring
    layout's (row b, slots j * page ..) or the page a paged row's table names. Where a mesh splits the
    slots (`split`), a row's index into them would make every device gather the whole cache (XLA's
    partitioner, on 8 CPU devices), so each ring array is rewritten there as a slab of every slot's rows
    instead (the span from its start up to the ring's end, then its wrapped part from position 0), the
    new rows chosen into it per slot. Compiled for a v5e, a scatter of the rows at (slot, position)
    pairs instead transposed every ring array whole (90 ms an insert for a 190m at 64 slots of 2176
    positions, 4 decoding steps). The per-slot arrays are chosen per slot too: a scatter of rows into
    the (slots, vocab) logits took the v5e compiler 80-130 s. The prefill is a program of its own, so
    that its rings keep their own layout."""

    def insert(state: SlotState, logits, fresh, width, src, length, index, limit, count, text, key, pages):
        clock = state.clock
        new = src >= 0
        targets = jnp.argsort(~new, stable=True)  # the slots that take a row first

        def put(array, prefilled, layout, size):
            pin = (lambda x: x) if layout is None else (lambda x: with_layout_constraint(x, layout))
            axis = array.ndim - 4  # the rows' (or pages') axis, after a group's layer axis
            page = page_size(size)
            table = ring_table(array.shape[axis], size, page) if pages is None else pages[size]
            blocks, per_entry, r = size // page, array.shape[-2] // page, prefilled.shape[-2]
            start = jnp.remainder(clock - width, size)
            shape = (*array.shape[:axis], 1, *array.shape[axis + 1 : -2], page, array.shape[-1])

            def one(n, array):
                array, b = pin(array), targets[n]
                row = jax.lax.dynamic_index_in_dim(prefilled, src[b], axis, keepdims=True)
                for i in range(min(blocks, -(-r // page) + 1)):
                    j = jnp.remainder(start // page + i, blocks)
                    # fresh slot f holds time f (mod R), which the row wants at ring position start + f
                    f = jnp.remainder(j * page + jnp.arange(page) - start, size)
                    p = table[b, j]
                    at = (0,) * axis + (p // per_entry, 0, (p % per_entry) * page, 0)
                    current = jax.lax.dynamic_slice(array, at, shape)
                    moved = jnp.take(row, jnp.minimum(f, r - 1), axis=axis + 2)
                    array = pin(jax.lax.dynamic_update_slice(array, jnp.where((f < r)[:, None], moved, current), at))
                return array

            return jax.lax.fori_loop(0, jnp.sum(new, dtype=jnp.int32), one, array)

        def put_slab(ring, prefilled, layout, size):
            axis, at = ring.ndim - 4, ring.ndim - 2  # the slots' axis (after a group's layer axis), positions'
            r = prefilled.shape[at]
            start = jnp.remainder(clock - width, size)
            rows = jnp.take(prefilled, jnp.maximum(src, 0), axis=axis)  # each slot's new row
            rows = jnp.concatenate([rows, rows], axis=at)  # any rotation of them is a slice
            chosen = new.reshape((1,) * axis + (-1, 1, 1, 1))
            # position i of a slab from `first` takes fresh slot i - shift, where that is within 0 .. R - 1
            low = jnp.minimum(start, size - r)
            i = jnp.arange(r)
            for first, shift in ((low, start - low), (0, start - size)):
                spanned = chosen & ((i >= shift) & (i < shift + r)).reshape(-1, 1)
                moved = jax.lax.dynamic_slice_in_dim(rows, jnp.remainder(-shift, r), r, at)
                slab = jax.lax.dynamic_slice_in_dim(ring, first, r, at)
                if layout is not None:  # the ring's own (cache_formats): else the compiler relaid k rings out whole
                    moved, slab = with_layout_constraint(moved, layout), with_layout_constraint(slab, layout)
                ring = jax.lax.dynamic_update_slice_in_dim(ring, jnp.where(spanned, moved, slab), first, at)
            return ring

        fill = lambda old, per_slot: jnp.where(new.reshape(new.shape + (1,) * (old.ndim - 1)), per_slot, old)
        # each slot's logits by one select per prefilled sequence (a few): compiled for a v5e, a gather of
        # rows of the (sequences, vocab) logits took twice as long (5.9 s against 3.1 at 8 sequences)
        chosen_logits = state.logits
        for p in range(logits.shape[0]):
            chosen_logits = jnp.where((src == p)[:, None], logits[p], chosen_logits)
        layout = layouts or jax.tree.map(lambda _: None, fresh)
        return state._replace(
            cache=jax.tree.map(put_slab if split else put, state.cache, fresh, layout, rings),
            logits=chosen_logits,
            first=fill(state.first, clock - length),
            count=fill(state.count, count),
            limit=fill(state.limit, limit),
            index=fill(state.index, index),
            key=fill(state.key, key),
            text=fill(state.text, text),
            active=state.active | new,
            finish=jnp.where(new, 0, state.finish),
        )

    return insert


class ChunkOut(NamedTuple):
    """What a decode chunk returns beside the state: each slot's tokens of this chunk, columns 0 .. k-1
    for a row that made k (rows enter only between chunks, so a row's chunk tokens are contiguous)."""

    tokens: jax.Array  # (width, K) int32, 0 where a slot made no token
    logprobs: jax.Array  # (width, K) float32
    steps: jax.Array  # () int32: decoding steps run
    busy: jax.Array  # () int32: slots decoding, summed over the steps


def chunk_program(cfg: ModelConfig, cache_len: int, steps: int, draw: str, width: int):
    """chunk(params, state, rule, eos_ids, texts, free_target, pages) -> (state, ChunkOut): decoding steps,
    at most `steps`, while a row is active and fewer than free_target slots are free. Each step is the
    static sampler's loop body (sampler._loop: choose, record, stop, feed) with each row's own t.
    Only the first `width` slots are decoded (the others must be free): a step of fewer rows reads
    and computes less, which the engine uses once no row waits (EngineConfig.narrow). `draw`:
    olmax.rollout.sampler.Sampling.draw. pages: a paged cache's tables (module doc), else None."""
    vocab, sample, truncate = cfg.vocab_size, draw != "greedy", draw == "truncate"

    def chunk(params, state: SlotState, rule, eos_ids, texts, free_target, pages):
        slots = state.first.shape[0]
        whole, narrow = state, width < slots
        if narrow:
            state = state._replace(**{f: getattr(state, f)[:width] for f in PER_SLOT})

        def keys(st: SlotState):
            # request row i's t-th token: fold_in(fold_in(key(seed), t), i), as the static sampler keys it
            draw = lambda data, t, i: jax.random.fold_in(jax.random.fold_in(jax.random.wrap_key_data(data), t), i)
            return jax.vmap(draw)(st.key, st.count, st.index)

        def body(carry):
            j, busy, st, tokens, logprobs = carry
            live = st.active
            token, logp = choose_scored(st.logits, keys(st) if sample else None, rule if sample else None, truncate)
            tokens = tokens.at[:, j].set(jnp.where(live, token, 0))
            logprobs = logprobs.at[:, j].set(jnp.where(live, logp, 0.0))
            count = st.count + live
            eos = live & jnp.any(token[:, None] == eos_ids[None, :], axis=1)
            after = texts[st.text, token]  # the text-stop automaton's next state; -1: a stop string ended
            stop = live & (after < 0)
            full = live & (count >= st.limit)
            finish = jnp.where(eos, 1, jnp.where(stop, 2, jnp.where(full, 0, st.finish)))
            first = jnp.where(live, st.first, st.clock)  # a free slot at position 0 (module doc)
            logits, cache = cached_forward(
                params, st.cache, token[:, None], st.clock, cfg, first, cache_len, pages=pages
            )
            st = st._replace(
                cache=cache,
                logits=logits[:, 0, :vocab],
                count=count,
                text=jnp.where(live, jnp.maximum(after, 0), st.text),
                finish=finish,
                active=live & ~(eos | stop | full),
                clock=st.clock + 1,
            )
            return j + 1, busy + jnp.sum(live, dtype=jnp.int32), st, tokens, logprobs

        def cond(carry):
            j, _, st, _, _ = carry
            running = jnp.sum(st.active, dtype=jnp.int32)
            return (j < steps) & (running > 0) & (slots - running < free_target)

        start = (
            jnp.int32(0),
            jnp.int32(0),
            state,
            jnp.zeros((width, steps), jnp.int32),
            jnp.zeros((width, steps), jnp.float32),
        )
        j, busy, state, tokens, logprobs = jax.lax.while_loop(cond, body, start)
        if narrow:
            widen = lambda f: jax.lax.dynamic_update_slice_in_dim(getattr(whole, f), getattr(state, f), 0, 0)
            state = state._replace(**{f: widen(f) for f in PER_SLOT})
        return state, ChunkOut(tokens, logprobs, j, busy)

    return chunk


MOVES = 8  # rows one compact program moves (its moves unrolled): the engine calls it again for more


def compact_program(paged: bool = False):
    """compact(state, src, dst, vacate) -> state: move the row in slot src[r] to the free slot dst[r]
    (MOVES entries; the padding ones copy slot 0 onto itself), so that the rows left in a drain fill
    the first slots and a narrower chunk decodes them (EngineConfig.narrow); vacate (B,) marks the
    slots left (and, without moves, the slots of rows the engine preempts). A paged cache stays where
    it is: the host moves the rows' page tables.

    Each move, of the cache's rings and of every per-slot array alike, is a dynamic slice and update of
    one slot's row, unrolled: in place, no temporaries. Compiled for a v5e (libtpu on a 2-core host),
    the 190m's 4 moves took 1.1 s, the same moves in a fori_loop with the per-slot arrays scattered
    90 s, a gather of the cache's rows minutes; at the demo's shape (64 slots, the 100k vocabulary) the
    per-slot arrays chosen by a gather of their rows took 18 s (the logits'), by the moves 0.5 s."""

    def compact(state: SlotState, src, dst, vacate):
        def rows(x, axis):
            for r in range(MOVES):
                one = jax.lax.dynamic_slice_in_dim(x, src[r], 1, axis)
                x = jax.lax.dynamic_update_slice_in_dim(x, one, dst[r], axis)
            return x

        small = {f: rows(getattr(state, f), 0) for f in PER_SLOT}
        small["active"] = small["active"] & ~vacate
        cache = state.cache if paged else jax.tree.map(lambda ring: rows(ring, ring.ndim - 4), state.cache)
        return state._replace(cache=cache, **small)

    return compact


def state_shardings(state: SlotState, mesh) -> SlotState:
    """The state's layout on `mesh`: the cache as olmax.rollout.cache lays it out, every per-slot array
    over the batch axes (as the static sampler splits its rows), the clock replicated."""
    batch = lambda x: _batch_sharding(mesh, *x.shape)
    return SlotState(
        cache=jax.tree.map(lambda x: NamedSharding(mesh, cache_spec(x.shape, mesh)), state.cache),
        **{name: batch(getattr(state, name)) for name in PER_SLOT},
        clock=NamedSharding(mesh, PartitionSpec()),
    )


def page_tables(cfg: ModelConfig, slots: int, cache_len: int, pool) -> Optional[dict]:
    """The chunk and insert programs' `pages` argument as abstract arrays (None for rings)."""
    if pool is None:
        return None
    return {s: jax.ShapeDtypeStruct((slots, s // page_size(s)), jnp.int32) for s, _ in pool}


class Programs(NamedTuple):
    init: Callable
    prefill: Callable
    insert: Callable
    compact: Callable
    chunk: Callable  # decoding width -> its chunk program


def programs(
    cfg: ModelConfig, slots: int, cache_len: int, steps: int, draw: str, key_words: int, mesh=None, pool=None
) -> Programs:
    """The engine's programs, each jitted once per shape (and compiled at its first call; engines of one
    shape share them). The state is donated, so the cache is updated in place. With a mesh the
    parameters are laid out as the trainer lays them out (olmax.model.olmo3.param_shardings) and the
    state by `state_shardings`; the host's small arrays are replicated. pool: a paged cache's pools
    (ring slots -> pages, as sorted pairs; olmax.rollout.pages.pool_sizes), None for rings."""
    shape = (cfg, slots, cache_len, key_words, mesh, pool)
    return Programs(
        _jitted(*shape, "init"),
        _jitted(*shape, "prefill"),
        _jitted(*shape, "insert"),
        _jitted(*shape, "compact"),
        lambda width: _jitted(*shape, "chunk", steps, draw, width),
    )


@functools.lru_cache(maxsize=None)
def _jitted(cfg, slots, cache_len, key_words, mesh, pool, name: str, steps=0, draw="greedy", width=0):
    """One of the programs (`programs`), jitted."""
    init = functools.partial(init_state, cfg, slots, cache_len, key_words, pool)
    state = cache_formats(cfg, slots, cache_len, key_words, mesh, pool)
    paged = pool is not None
    if name == "init":
        fn, donate = init, ()
    elif name == "prefill":
        fn, donate = prefill_program(cfg, cache_len), ()
    elif name == "insert":
        split = mesh is not None and math.prod(mesh.shape[a] for a in BATCH_AXES) > 1
        layouts = state and jax.tree.map(lambda f: f.layout, state.cache)
        fn, donate = insert_program(ring_tree(cfg, cache_len), layouts, split), (0,)
    elif name == "compact":
        fn, donate = compact_program(paged), (0,)
    else:
        fn, donate = chunk_program(cfg, cache_len, steps, draw, width), (1,)
    if mesh is None and state is None:
        return jax.jit(fn, donate_argnums=donate)
    params, rep, batch = _layouts(cfg, mesh)
    state = state or state_shardings(jax.eval_shape(init), mesh)
    ins, outs = {
        "init": ((), state),
        "prefill": ((params, rep, rep), (rep, jax.tree.map(lambda _: rep, jax.eval_shape(init).cache))),
        "insert": ((state, *[rep] * 11), state),
        "compact": ((state, *[rep] * 3), state),
        "chunk": (
            (params, state, rep, rep, rep, rep, rep),
            (state, ChunkOut(batch(width, steps), batch(width, steps), rep, rep)),
        ),
    }[name]
    return jax.jit(fn, in_shardings=ins, out_shardings=outs, donate_argnums=donate)


def _layouts(cfg: ModelConfig, mesh):
    """(the parameters' shardings, a replicated one, the batch's by shape) on `mesh`, or on the one
    default device without a mesh."""
    if mesh is None:
        one = SingleDeviceSharding(jax.devices()[0])
        return jax.tree.map(lambda _: one, abstract_params(cfg)), one, lambda *shape: one
    return param_shardings(cfg, mesh), NamedSharding(mesh, PartitionSpec()), functools.partial(_batch_sharding, mesh)


@functools.lru_cache(maxsize=None)
def cache_formats(cfg, slots, cache_len, key_words, mesh, pool=None) -> Optional[SlotState]:
    """On a TPU: the state's layouts, the cache's being those the decoding loop wants. The TPU compiler
    lays a ring that the loop reads and writes out otherwise than row-major (each layer's keys and
    values their own order of slots, kv heads and ring slots); a program that takes the cache as an
    argument in another layout copies it whole on the way in and out (twice the cache's memory: a 190m
    at 64 slots of 2176 positions needed 16.5 GiB for its 4.8 GiB of rings) and rewrites it every chunk.
    So the chunk program is compiled once with the cache's layout left to the compiler, and every
    program (init, insert, compact, each chunk width) takes and makes the cache in that layout, but for
    the arrays the decode kernel reads (olmax.rollout.decode_attention), which keep the kernel's
    row-major layout. None elsewhere: the CPU keeps row-major."""
    devices = list(mesh.devices.flat) if mesh is not None else jax.devices()[:1]
    if devices[0].platform != "tpu":
        return None
    params, rep, batch = _layouts(cfg, mesh)
    abstract = jax.eval_shape(functools.partial(init_state, cfg, slots, cache_len, key_words, pool))
    state = state_shardings(abstract, mesh) if mesh is not None else jax.tree.map(lambda _: rep, abstract)
    # an array the decode kernel reads keeps the default layout, the kernel's: the compiler would else
    # lay a paged pool out for its scatter and copy it whole for the kernel at every layer of every step
    read = lambda x: tiles(x.dtype, page_size(x.shape[-2]), x.shape[-1])
    auto = state._replace(
        cache=jax.tree.map(lambda s, x: s if read(x) else Format(Layout.AUTO, s), state.cache, abstract.cache)
    )
    # one greedy decoding step: the loop's layout is the same for any chunk, sampled or not (the same
    # layouts for the tiny, 190m and 1B shapes compiled for a v5e), and it compiles in 3-4 s, where a
    # sampled chunk takes 6-7 s (14-16 with top-k / top-p's sort over the vocabulary)
    program = jax.jit(
        chunk_program(cfg, cache_len, 1, "greedy", slots),
        in_shardings=(params, auto, rep, rep, rep, rep, rep),
        out_shardings=(auto, ChunkOut(batch(slots, 1), batch(slots, 1), rep, rep)),
        donate_argnums=1,
    )
    ints = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.int32)  # noqa: E731
    args = (
        jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), abstract_params(cfg), params),
        jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), abstract, state),
        jax.ShapeDtypeStruct((3,), jnp.float32),
        ints(*_eos_table((0,)).shape),  # the tables' sizes do not change the cache's layout
        ints(*_text_table(None, cfg.vocab_size).shape),
        ints(),
        page_tables(cfg, slots, cache_len, pool),
    )
    chosen = program.lower(*args).compile().input_formats[0][1]
    return state._replace(cache=chosen.cache)
