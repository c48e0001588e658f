"""A decoding step's attention that reads only the keys and values each row holds (olmax.rollout.cache).

Every row of a decoding step at clock c sees the times lo .. c of its ring, lo = max(first, c - S + 1)
(S the ring's slots: a window layer's ring holds only its window; a full layer's holds the row whole,
c - first < S). The rest of the ring is either the future (a static rollout's rings are as long as
its longest row), padding, or an earlier occupant's keys: reading it costs HBM bandwidth, which is
what a decoding step is bound by. On a 190m at 64 slots of 2176 positions the whole rings were 5.5x
the positions its rows held on average (docs/rollout-engine.md).

The ring is read in blocks of `page` slots (`page_size`: the largest power of two up to PAGE that
divides S). A row's live times fill the block holding slot c % S and, going back, the blocks before
it, cyclically: `live_blocks` counts them. Each block is one of the cache's arrays' pages: in the
ring layout (N = the rows, L = S) block j of row b is slots j*page .. (j+1)*page - 1 of row b; in
the paged layout (N = pages, L = page: olmax.rollout.pages) it is the page the row's table names.
Both are (entry, offset) = (p // (L / page), p % (L / page) * page) of a page id p, the ring layout's
ids being b * (S / page) + j, so one kernel reads both.

Two implementations, the same function:
  pallas  a Pallas TPU kernel (`_kernel`): the rows' live blocks in one loop, each block one DMA of
          all kv heads' (page, 2 * head_dim) rows from HBM, a few in flight while the previous is
          computed (BUFFERS), an online softmax per row; the blocks to read come from the rows'
          lengths and page tables by scalar prefetch (jax.experimental.pallas' PrefetchScalarGridSpec),
          as MaxText 0.2.4's ragged attention and vLLM-TPU's ragged paged attention skip dead blocks.
          Runs on any platform in Pallas' TPU interpret mode (`interpret`), which the tests use.
  xla     the whole ring, masked (the reference, and the path of a CPU or GPU, where nothing reads
          faster than the fused einsum): a paged cache is gathered into rings first.

Keys and values of a head sit side by side in one row of 2 * head_dim lanes (cache.py), so a 64-wide
head fills the TPU's 128 lanes instead of being padded to them. Where head_dim is not a multiple of
128 the kernel multiplies the whole row by the query extended with zeros (the value half scores 0)
and keeps the value half of the output: no lane is sliced inside the kernel.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.sharding import PartitionSpec

from olmax.model.attention import target_platform
from olmax.model.sharding import logical_to_spec

PAGE = 128  # most slots per block (a DMA of 12 heads' 128 lanes of bf16: 384 KiB)
BUFFERS = 3  # blocks in VMEM: two in flight while the third is computed
ROWS_PER_CALL = 64  # rows per grid step (their queries and outputs in VMEM)
IMPLEMENTATIONS = ("auto", "xla", "pallas", "interpret")


def page_size(ring: int) -> int:
    """The block of a ring of `ring` slots: the largest power of two up to PAGE that divides it."""
    return min(PAGE, ring & -ring)


def live_blocks(first, clock, ring: int, page: int):
    """(lo, count) per row: the oldest visible time max(first, clock - ring + 1) and how many blocks,
    from the one holding slot clock % ring backwards, hold times lo .. clock."""
    lo = jnp.maximum(first, clock - ring + 1)
    start = clock - jnp.remainder(clock, page)  # the time of the current block's first slot
    return lo, jnp.minimum(ring // page, 1 + (jnp.maximum(start - lo, 0) + page - 1) // page)


def ring_table(rows: int, ring: int, page: int):
    """The ring layout's page ids: block j of row b is id b * (ring / page) + j."""
    blocks = ring // page
    return jnp.arange(rows, dtype=jnp.int32)[:, None] * blocks + jnp.arange(blocks, dtype=jnp.int32)[None, :]


def tiles(dtype, page: int, width: int) -> bool:
    """Whether blocks of `page` slots of rows `width` wide (2 x head_dim) are whole TPU tiles of `dtype`:
    rows of whole 128 lanes, blocks of whole sublane tiles (16 rows of bfloat16, 8 of float32). The
    kernel's DMAs and its in-place writes need them; the TPU compiler lays a cache of narrower rows out
    otherwise (a 16-wide float32 ring with its slots across the lanes), which an aliased Mosaic operand
    cannot take."""
    return width % 128 == 0 and page % (32 // jnp.dtype(dtype).itemsize) == 0


def resolve(implementation: str, pool, page: int) -> str:
    """`auto`: the kernel on a TPU where the blocks are whole tiles (`tiles`), else xla."""
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(f"decode attention {implementation!r}: one of {', '.join(IMPLEMENTATIONS)}")
    if implementation != "auto":
        return implementation
    return "pallas" if target_platform() == "tpu" and tiles(pool.dtype, page, pool.shape[-1]) else "xla"


def attend(q, new, pool, first, clock, *, ring: int, group=None, table=None, implementation: str = "auto"):
    """One decoding step's attention. q (B, H, D): the step's queries (rotated); new (B, KV, 2D): its
    keys and values, written at slot clock % ring of every row before they are attended; pool: one
    layer's cache array, (N, KV, L, 2D) or (n_groups, N, KV, L, 2D) with `group` its layer's index;
    first (B,): each row's first time; table: None for the ring layout (N = B or more rows, L = ring),
    else (B, ring / L) page ids into a paged pool (L = the page). Returns ((B, H, D) in q's dtype, the
    pool with the new keys and values)."""
    grouped = group is not None
    pool = pool if grouped else pool[None]
    group = jnp.asarray(0 if group is None else group, jnp.int32)
    page = pool.shape[-2] if table is not None else page_size(ring)
    implementation = resolve(implementation, pool, page)
    new = new.astype(pool.dtype)
    if implementation == "xla":
        out, pool = _xla(q, new, pool, group, first, clock, ring, table)
        return out, pool if grouped else pool[0]
    lo, count = live_blocks(first, clock, ring, page)
    interpret = pltpu.InterpretParams() if implementation == "interpret" else False
    call = functools.partial(_pallas, ring=ring, page=page, interpret=interpret)
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or mesh.size == 1:
        out, pool = call(q, new, pool, table, lo, count, clock, group)
        return out, pool if grouped else pool[0]
    if table is not None:
        raise ValueError("a paged cache is for one device (olmax.rollout.pages); on a mesh every row has its ring")
    # a Mosaic kernel is not partitioned by XLA: each device runs it on its rows and kv heads (and
    # numbers its rings' blocks itself, `_pallas`)
    batch, heads = logical_to_spec(("batch", "kv_heads"), (q.shape[0], pool.shape[2]), mesh)
    rows, replicated = PartitionSpec(batch), PartitionSpec()
    per_row, arrays = PartitionSpec(batch, heads), PartitionSpec(None, batch, heads)
    out, pool = jax.shard_map(
        lambda q, new, pool, lo, count, clock, group: call(q, new, pool, None, lo, count, clock, group),
        mesh=mesh,
        in_specs=(per_row, per_row, arrays, rows, rows, replicated, replicated),
        out_specs=(per_row, arrays),
        check_vma=False,
    )(q, new, pool, lo, count, clock, group)
    return out, pool if grouped else pool[0]


def _xla(q, new, pool, group, first, clock, ring: int, table):
    """The new keys and values written (one slot, the same in every row: an update at a scalar index;
    paged, a scatter of one slot per row), then the whole ring of every row, masked: times lo .. clock
    visible (module doc)."""
    b, h, d = q.shape
    slot = jnp.remainder(clock, ring)
    if table is None:
        update = new.reshape(1, b, new.shape[1], 1, 2 * d)
        pool = jax.lax.dynamic_update_slice(pool, update, (group, 0, 0, slot, 0))
    else:
        page = pool.shape[-2]
        pool = pool.at[group, table[:, slot // page], :, slot % page].set(new)
    arrays = jax.lax.dynamic_index_in_dim(pool, group, keepdims=False)
    if table is None:
        rings = arrays if arrays.shape[0] == b else jax.lax.slice_in_dim(arrays, 0, b, axis=0)
    else:  # (B, blocks, KV, page, 2D) -> (B, KV, ring, 2D)
        gathered = jnp.take(arrays, table, axis=0)
        rings = gathered.transpose(0, 2, 1, 3, 4).reshape(b, arrays.shape[1], ring, 2 * d)
    kv = rings.shape[1]
    slot_time = clock - jnp.remainder(clock - jnp.arange(ring), ring)
    lo = jnp.maximum(first, clock - ring + 1)
    visible = slot_time[None, :] >= lo[:, None]
    # the rows whole, the query extended with zeros (the value half scores 0), the value half of the
    # output kept: on XLA:CPU a product with a lane slice of the rings copied them first (2-4x the time)
    q = q.reshape(b, kv, h // kv, d)
    q = jnp.concatenate([q, jnp.zeros_like(q)], axis=-1).astype(rings.dtype)
    scores = jnp.einsum("bkgd,bksd->bkgs", q, rings, preferred_element_type=jnp.float32) * (d**-0.5)
    scores = jnp.where(visible[:, None, None], scores, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(scores, axis=-1).astype(rings.dtype)
    out = jnp.einsum("bkgs,bksd->bkgd", probs, rings)[..., d:].reshape(b, h, d).astype(q.dtype)
    return out, pool


def _pallas(q, new, pool, table, lo, count, clock, group, *, ring: int, page: int, interpret):
    """The kernel over rows in grid steps of at most ROWS_PER_CALL (their queries, new keys and values
    and outputs in VMEM), the pool written in place; table None: the ring layout's ids, numbered here
    (on a mesh: this device's rows)."""
    b, h, d = q.shape
    kv, width = pool.shape[2], pool.shape[-1]
    table = ring_table(b, ring, page) if table is None else table
    split = d % 128 != 0  # the value half is kept from whole rows (module doc)
    dtype, q = q.dtype, q.astype(pool.dtype)
    if split:
        q = jnp.concatenate([q, jnp.zeros_like(q)], axis=-1)
    tile = min(b, ROWS_PER_CALL)
    while b % tile:
        tile -= 1
    steps = b // tile
    totals = jnp.sum(count.reshape(steps, tile), axis=1).astype(jnp.int32)
    meta = jnp.stack([jnp.asarray(clock, jnp.int32), jnp.asarray(group, jnp.int32)])
    out_width = width if split else d
    # the rows of a tile (`tiles`), what a write rewrites; a block shorter than that is written whole
    # (interpret mode only: on a TPU such blocks take the xla path)
    sublanes = min(32 // jnp.dtype(pool.dtype).itemsize, page)
    kernel = functools.partial(
        _kernel,
        ring=ring,
        page=page,
        per_entry=pool.shape[-2] // page,
        group_size=h // kv,
        head_dim=d,
        split=split,
        sublanes=sublanes,
    )
    per_step = lambda *shape: pl.BlockSpec((tile, *shape), lambda i, *_: (i,) + (0,) * len(shape))
    out, pool = pl.pallas_call(
        kernel,
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=5,
            grid=(steps,),
            in_specs=[per_step(h, q.shape[-1]), per_step(kv, width), pl.BlockSpec(memory_space=pl.ANY)],
            out_specs=[per_step(h, out_width), pl.BlockSpec(memory_space=pl.ANY)],
            scratch_shapes=[
                pltpu.MemorySpace.VMEM((BUFFERS, kv, page, width), pool.dtype),
                pltpu.SemaphoreType.DMA((BUFFERS,)),
                pltpu.MemorySpace.VMEM((2, kv, sublanes, width), pool.dtype),
                pltpu.SemaphoreType.DMA((2,)),
            ],
        ),
        out_shape=[jax.ShapeDtypeStruct((b, h, out_width), jnp.float32), jax.ShapeDtypeStruct(pool.shape, pool.dtype)],
        input_output_aliases={7: 1},  # the pool (after the 5 scalar arrays, q and new) is written in place
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel",)),
        interpret=interpret,
    )(meta, totals, lo.astype(jnp.int32), count.astype(jnp.int32), table.astype(jnp.int32), q, new, pool)
    return (out[..., d:] if split else out).astype(dtype), pool


def _kernel(
    meta_ref,  # SMEM (2,): clock, the layer's index in its group
    totals_ref,  # SMEM (grid steps,): blocks to read in each step's rows
    lo_ref,  # SMEM (B,): each row's oldest visible time
    count_ref,  # SMEM (B,): each row's blocks, from the current one back
    table_ref,  # SMEM (B, ring / page): page ids
    q_ref,  # VMEM (tile, H, W): this step's rows' queries, W = 2D (zero value half) or D
    new_ref,  # VMEM (tile, KV, 2D): their new keys and values
    pool_ref,  # HBM (n_groups, N, KV, L, 2D), aliased to pool_out
    o_ref,  # VMEM (tile, H, W) float32
    pool_out,  # HBM: the pool, written in place
    buf,  # VMEM (BUFFERS, KV, page, 2D)
    sem,  # DMA semaphores (BUFFERS,)
    written,  # VMEM (2, KV, sublanes, 2D): the last two rows' rewritten tiles, on their way to HBM
    wsem,  # DMA semaphores (2,)
    *,
    ring: int,
    page: int,
    per_entry: int,
    group_size: int,
    head_dim: int,
    split: bool,
    sublanes: int,
):
    """One grid step: its rows' live blocks in order (row by row, each row's from the current block
    back), BUFFERS - 1 DMAs ahead of the block computed, with an online softmax per row. A row's first
    block is its current one: the new key and value go into it in VMEM before it is attended, and the
    tile of `sublanes` slots holding them goes back to HBM (a DMA, waited for two rows later)."""
    clock, group = meta_ref[0], meta_ref[1]
    tile, heads, _ = q_ref.shape
    base = pl.program_id(0) * tile
    total = totals_ref[pl.program_id(0)]
    current = jax.lax.div(jax.lax.rem(clock, ring), page)
    neg = jnp.finfo(jnp.float32).min

    at = jax.lax.rem(clock, page)  # the new key's slot in the current block (the same in every row)
    tile_start = pl.multiple_of(at - jax.lax.rem(at, sublanes), sublanes)
    dma = _BlockDMAs(table_ref, count_ref, pool_ref, pool_out, buf, sem, written, wsem, group, base, tile)
    ring_block = functools.partial(dma.ring_block, current, ring // page)
    copy = functools.partial(dma.copy, ring_block, page, per_entry)
    write = functools.partial(dma.write, ring_block, page, per_entry, tile_start, sublanes)
    advance = dma.advance

    ahead = (jnp.int32(0), jnp.int32(0))
    for d in range(BUFFERS - 1):

        @pl.when(d < total)
        def _(d=d, at=ahead):
            copy(*at, d).start()

        ahead = advance(*ahead)

    def body(i, carry):
        ahead, (r, k), m, total_p, acc = carry
        slot = jax.lax.rem(i, BUFFERS)
        copy(r, k, slot).wait()
        nxt = i + BUFFERS - 1

        @pl.when(nxt < total)
        def _():
            copy(*ahead, jax.lax.rem(nxt, BUFFERS)).start()

        ahead = tuple(jnp.where(nxt < total, a, b) for a, b in zip(advance(*ahead), ahead))
        fresh = k == 0

        @pl.when(fresh)
        def _():
            @pl.when(r >= 2)
            def _():
                write(r - 2).wait()  # its buffer is this row's

            tile = buf[slot, :, pl.ds(tile_start, sublanes), :]
            row = jax.lax.broadcasted_iota(jnp.int32, (1, sublanes, 1), 1) == at - tile_start
            tile = jnp.where(row, new_ref[r][:, None, :], tile)
            buf[slot, :, pl.ds(tile_start, sublanes), :] = tile
            written[jax.lax.rem(r, 2)] = tile
            write(r).start()

        rows = buf[slot]  # (KV, page, 2D)
        q = q_ref[r]  # (H, W)
        position = ring_block(k) * page + jax.lax.broadcasted_iota(jnp.int32, (1, page), 1)
        visible = clock - jax.lax.rem(clock - position + ring, ring) >= lo_ref[base + r]
        m_new, total_p, acc = _attend_block(q, rows, visible, fresh, (m, total_p, acc), group_size, head_dim, split)

        @pl.when(k + 1 >= count_ref[base + r])
        def _():
            o_ref[r] = acc / total_p

        return ahead, advance(r, k), m_new, total_p, acc

    f32 = lambda width, value: jnp.full((heads, width), value, jnp.float32)
    softmax = (f32(1, neg), f32(1, 0.0), f32(o_ref.shape[-1], 0.0))
    jax.lax.fori_loop(0, total, body, (ahead, (jnp.int32(0), jnp.int32(0)), *softmax))
    for r in range(max(0, tile - 2), tile):  # every row wrote once; the last two writes are in flight
        write(r).wait()


def _attend_block(q, rows, visible, fresh, softmax, group_size: int, head_dim: int, split: bool):
    """One block of a row's keys and values into its online softmax (running max m, sum total_p and
    weighted values acc, per query head; started afresh at a row's first block): q (H, W), rows (KV,
    page, 2D), visible (1, page)."""
    neg = jnp.finfo(jnp.float32).min
    m, total_p, acc = softmax
    m = jnp.where(fresh, neg, m)
    total_p = jnp.where(fresh, 0.0, total_p)
    acc = jnp.where(fresh, 0.0, acc)
    keys = rows if split else rows[..., :head_dim]
    values = rows if split else rows[..., head_dim:]
    per_head = lambda x, h: x[h * group_size : (h + 1) * group_size]
    contract_last = (((1,), (1,)), ((), ()))
    kv_heads = rows.shape[0]
    # bfloat16 products are exact in float32: a caller's "highest" matmul precision adds nothing to them,
    # and Mosaic refuses it for bfloat16 operands ("Bad lhs type", jax-ml/jax#21408)
    exact = dict(precision=None if rows.dtype == jnp.float32 else jax.lax.Precision.DEFAULT)
    scores = jnp.concatenate(
        [
            jax.lax.dot_general(per_head(q, h), keys[h], contract_last, preferred_element_type=jnp.float32, **exact)
            for h in range(kv_heads)
        ],
        axis=0,
    ) * (head_dim**-0.5)  # (H, page)
    scores = jnp.where(visible, scores, neg)
    m_new = jnp.maximum(m, jnp.max(scores, axis=-1, keepdims=True))
    probs = jnp.where(visible, jnp.exp(scores - m_new), 0.0)
    scale = jnp.exp(m - m_new)
    total_p = scale * total_p + jnp.sum(probs, axis=-1, keepdims=True)
    probs = probs.astype(rows.dtype)
    mixed = jnp.concatenate(
        [jnp.dot(per_head(probs, h), values[h], preferred_element_type=jnp.float32, **exact) for h in range(kv_heads)],
        axis=0,
    )
    return m_new, total_p, scale * acc + mixed


class _BlockDMAs:
    """Where one grid step's local row r's k-th block back (k = 0: its current block) lives in the
    pool, and the DMAs that read it into VMEM or write its rewritten tile back."""

    def __init__(self, table_ref, count_ref, pool_ref, pool_out, buf, sem, written, wsem, group, base, tile):
        self.table_ref, self.count_ref, self.pool_ref, self.pool_out = table_ref, count_ref, pool_ref, pool_out
        self.buf, self.sem, self.written, self.wsem = buf, sem, written, wsem
        self.group, self.base, self.tile = group, base, tile

    @staticmethod
    def ring_block(current, blocks, k):  # a row's k-th block back from the current one, on its ring
        return jax.lax.rem(current - k + blocks, blocks)

    def _slots(self, ring_block, page, per_entry, r, k, start, size):  # slots start .. start + size - 1
        p = self.table_ref[self.base + r, ring_block(k)]
        return jax.lax.div(p, per_entry), pl.ds(jax.lax.rem(p, per_entry) * page + start, size)

    def copy(self, ring_block, page, per_entry, r, k, slot):  # local row r's k-th block into buf[slot]
        entry, slots = self._slots(ring_block, page, per_entry, r, k, 0, page)
        source = self.pool_ref.at[self.group, entry, :, slots, :]
        return pltpu.make_async_copy(source, self.buf.at[slot], self.sem.at[slot])

    def write(self, ring_block, page, per_entry, tile_start, sublanes, r):  # row r's rewritten tile back
        entry, slots = self._slots(ring_block, page, per_entry, r, 0, tile_start, sublanes)
        w = jax.lax.rem(r, 2)
        target = self.pool_out.at[self.group, entry, :, slots, :]
        return pltpu.make_async_copy(self.written.at[w], target, self.wsem.at[w])

    def advance(self, r, k):  # the block after (r, k): the row's next, or the next row's first
        last = k + 1 >= self.count_ref[self.base + jnp.minimum(r, self.tile - 1)]
        return jnp.where(last, r + 1, r), jnp.where(last, 0, k + 1)
