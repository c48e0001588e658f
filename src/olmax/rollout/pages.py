"""The slot engine's KV allocated by what its rows hold (olmax.rollout.engine, `kv_gib`): page tables on
the host.

A slot's ring of S slots is cut into blocks of `page` (olmax.rollout.decode_attention.page_size); with
paging, each block a row uses lives in a page of a pool shared by the slots, and a table (slots, S /
page) names it; a block no row uses names page 0, the pool's trash page, which takes the writes of
free slots and of a prefill's padding and is never read as anyone's keys. Time t of a row is in block
(t mod S) // page, as on a ring (olmax.rollout.cache: the slots share one clock), so a row needs the
blocks of the times it holds, first .. clock, and takes one more each `page` steps; a window ring's
row reuses its own blocks once it spans the window. Pages are taken as a row is inserted and before
each chunk (the blocks of the times it may reach in the chunk), and given back when it stops: the
cache holds what the rows hold, not slots x cache_len. vLLM's PagedAttention allocates so (its block
tables, per sequence); here the blocks are the ring's, so the shared clock and the insert's slabs stay.

When the pool runs out the engine preempts the rows inserted last (vLLM's recompute preemption): they
give their pages back and wait at the front of the queue with their tokens so far, and are prefilled
again as prompt + tokens (the engine's `restore` path), which gives the tokens of an uninterrupted run.

Each ring size of the model (a full layer's S = cache_len, a window layer's min(window, cache_len))
has its own pool and tables, shared by the layers of that size: a row's window blocks are at most
its full blocks' positions over the window's page, plus one, so a window pool as large as the full
pool's positions (plus a page a slot) never runs out first.
"""

from __future__ import annotations

import math
from typing import Optional

import numpy as np

from olmax.config.model import ModelConfig
from olmax.errors import ConfigError
from olmax.rollout.cache import ring_sizes, slots
from olmax.rollout.decode_attention import page_size

TRASH = 0  # the page every unused block names (module doc)


def page_bytes(cfg: ModelConfig, cache_len: int) -> dict[int, int]:
    """Bytes of one page id of each ring size's pool: its block of every layer of that size."""
    layers = [slots(cfg, i, cache_len) for i in range(cfg.n_layers)]
    row = cfg.n_kv_heads * 2 * cfg.head_dim * np.dtype(cfg.compute_dtype).itemsize
    return {s: layers.count(s) * page_size(s) * row for s in ring_sizes(cfg, cache_len)}


def pool_sizes(cfg: ModelConfig, slot_count: int, cache_len: int, gib: float) -> dict[int, int]:
    """Pages (the trash page included) of each ring size's pool within `gib` GiB: the full rings'
    pool as large as fits beside the window pools it implies (module doc), each at most every slot's
    whole ring. ConfigError when one row's whole ring does not fit."""
    sizes = ring_sizes(cfg, cache_len)
    full, costs = sizes[0], page_bytes(cfg, cache_len)
    whole = {s: slot_count * (s // page_size(s)) + 1 for s in sizes}

    def pools(pages: int) -> dict[int, int]:
        positions = (pages - 1) * page_size(full)
        window = lambda s: min(whole[s], math.ceil(positions / page_size(s)) + slot_count + 1)
        return {s: pages if s == full else window(s) for s in sizes}

    cost = lambda pages: sum(n * costs[s] for s, n in pools(pages).items())
    budget = gib * 2**30
    lo, hi = 1, whole[full]  # pools(lo) fits or nothing does; find the largest that fits
    if cost(hi) <= budget:
        return pools(hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if cost(mid) <= budget else (lo, mid)
    least = full // page_size(full) + 1
    if lo < least:
        raise ConfigError(
            f"engine kv_gib={gib:g} holds {lo - 1} pages of {page_size(full)} positions, fewer than one row of "
            f"cache_len={cache_len} needs ({least - 1}, {cost(least) / 2**30:.3g} GiB with the window pools)"
        )
    return pools(lo)


def pools(cfg: ModelConfig, slot_count: int, cache_len: int, gib: float) -> Optional[tuple]:
    """The programs' `pool` (olmax.rollout.slots): pool_sizes as sorted (ring size, pages) pairs, or
    None for whole rings (gib 0)."""
    return tuple(sorted(pool_sizes(cfg, slot_count, cache_len, gib).items())) if gib else None


class Pages:
    """Page tables of `slot_count` slots over pools of `sizes` (ring slots -> pages, pool_sizes)."""

    def __init__(self, sizes: dict[int, int], slot_count: int):
        self.sizes = dict(sizes)
        self._page = {s: page_size(s) for s in sizes}
        self.tables = {s: np.full((slot_count, s // self._page[s]), TRASH, np.int32) for s in sizes}
        self._free = {s: list(range(n - 1, TRASH, -1)) for s, n in sizes.items()}  # pop() takes the lowest
        self._since: dict[int, int] = {}  # slot -> when its row took its first pages (`newest`)
        self._taken = 0

    def positions(self) -> int:
        """Positions the full rings' pool holds (its pages but the trash page)."""
        full = max(self.sizes)
        return (self.sizes[full] - 1) * self._page[full]

    def free(self, size: int) -> int:
        """Pages left in a ring size's pool."""
        return len(self._free[size])

    def _blocks(self, size: int, lo: int, hi: int) -> list[int]:
        """The blocks of a ring of `size` slots holding times lo .. hi (the last `size` of them)."""
        page, count = self._page[size], size // self._page[size]
        lo = max(lo, hi - size + 1)
        first, last = (lo % size) // page, (hi % size) // page
        span = (last - first) % count + 1
        if hi - lo + 1 > size - page:  # the span may wrap into its own first block: every block
            span = count
        return [(first + i) % count for i in range(span)]

    def missing(self, slot: int, lo: int, hi: int) -> dict[int, list[int]]:
        """The blocks `slot` lacks to hold times lo .. hi, per ring size."""
        return {s: [j for j in self._blocks(s, lo, hi) if self.tables[s][slot, j] == TRASH] for s in self.tables}

    def reserve(self, slot: int, lo: int, hi: int) -> bool:
        """Pages for `slot` to hold times lo .. hi, all or none: whether it has them now."""
        need = self.missing(slot, lo, hi)
        if any(len(js) > self.free(s) for s, js in need.items()):
            return False
        for s, js in need.items():
            for j in js:
                self.tables[s][slot, j] = self._free[s].pop()
        if slot not in self._since:
            self._since[slot], self._taken = self._taken, self._taken + 1
        return True

    def newest(self, slots) -> int:
        """Of `slots`, the one whose row took its pages last (the engine preempts it first)."""
        return max(slots, key=lambda b: self._since.get(b, -1))

    def release(self, slot: int) -> None:
        """`slot`'s pages back to the pools; its blocks name the trash page."""
        for s, table in self.tables.items():
            row = table[slot]
            self._free[s] += sorted(row[row != TRASH].tolist(), reverse=True)
            row[:] = TRASH
        self._since.pop(slot, None)

    def move(self, src: int, dst: int) -> None:
        """A row's pages from slot `src` to the free slot `dst` (olmax.rollout.slots' compact)."""
        for table in self.tables.values():
            table[dst], table[src] = table[src], TRASH
        if src in self._since:
            self._since[dst] = self._since.pop(src)
