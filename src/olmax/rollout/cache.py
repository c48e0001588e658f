"""The model pass with a key/value cache, on olmax.model.olmo3's own block (for olmax.rollout.sampler).

Rows share one clock. A call's tokens (batch, T) sit at the same TIME indices time .. time + T - 1 in
every row; the rows' prompts are LEFT-padded, so row b's first real token is at time first[b] and its
token at time tau has position tau - first[b] (RoPE's). A prefill is one call at time 0 (`fresh`: the
cache is empty) with the left-padded prompts; each decoding step is one call with T = 1 at the next
time, the same for every row, so that generating n tokens costs n single-token passes over the cache
instead of n growing full forwards. Key time k is visible from query time q when first[b] <= k <= q
and, on a sliding-window layer, q - k < window (the token and the W-1 before it, as in training:
within a row, times and positions differ by the constant first[b]). Left padding is what
transformers' `generate` does for batched prompts.

Cache layout. Every layer's cache is a ring of S slots, time tau in slot tau % S:

- a full-attention layer has S = the cache length (every time index of the request, so tau % S = tau);
- a sliding-window layer has S = min(window, cache length): it holds only the times its queries can
  still see, as vLLM's and transformers' sliding-window caches do (a window-W layer of the 7B at a
  32k rollout holds 4096 positions, not 32k).

Because the clock is shared, a decoding step writes ONE slot, the same in every row: an in-place
update at a scalar index. (With rows at their own positions each row writes its own slot, a scatter
that the TPU compiler runs as a loop over rows, twice per layer per token; docs/rollout.md.) The new
key and value are written before they are attended: the slot they take held time - S, which a
sliding-window layer no longer sees (S = window) and a full layer never held (S = cache length).
A step then reads only the times each row holds (olmax.rollout.decode_attention: on a TPU a Pallas
kernel that fetches the ring's live blocks, elsewhere the whole ring masked). A prefill longer than S
keeps, in each slot, the newest of its times that falls there; its queries attend to the call's own
keys, not the ring, so it is exact.

Each layer's cache is ONE array holding a head's key and value side by side, (..., kv_heads, S,
2 * head_dim): a TPU pads an array's last axis to 128 lanes, so separate key and value arrays of a
64-wide head took twice their bytes (and a decoding step read twice its KV). The cache mirrors the
forward pass's scan over groups of `global_every` layers (olmax.model.olmo3): `cache["group"]` holds
one array per position in the group, (n_groups, batch, kv_heads, S_j, 2 * head_dim) with that
position's S_j (a group's layers have different windows, so different shapes); `cache["tail"]` one
(batch, kv_heads, S, 2 * head_dim) array per layer of the final partial group. The slots come after
the kv heads because that is how the attention's two matrix products read them (batched over batch
and kv heads, the slots the free dimension): with the slots first the TPU compiler chose two layouts
and transposed the whole cache at every layer of every step. Batch and kv heads are laid out by the
rules table when traced under a mesh (`cache_spec`).

Paged (olmax.rollout.pages, the slot engine's KV by what its rows hold): a ring's slots are cut into
blocks of `page` (decode_attention.page_size) and each row's block j lives in the page its table
names, the arrays being pools of pages, (n_groups, pages, kv_heads, page, 2 * head_dim); a decoding
step takes the tables (`pages`: ring slots -> (batch, S / page) page ids) and writes each row's new
key and value into its own page (a scatter of one slot per row). Only decoding steps run on a paged
cache; a prefill fills rings of its own, which the engine copies into pages.

Each layer runs `olmax.model.olmo3.block`, the block training uses, with an `attend` that reads and
writes the cache; tests/rollout/test_rollout_cache.py checks the logits of prefill and of every decoding
step against `olmax.model.olmo3.forward` on each row's unpadded sequence, with a window shorter than
the sequence (so the rings wrap) and a prefill longer than the window, on rings and on pages, with
the XLA attention and the TPU kernel (interpreted).
"""

from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec

from olmax.config.model import ModelConfig
from olmax.model.olmo3 import block, final_norm, lm_head
from olmax.model.rope import rope_tables
from olmax.model.sharding import logical_to_spec
from olmax.rollout import decode_attention


def slots(cfg: ModelConfig, layer: int, length: int) -> int:
    """Cache slots of `layer` in a cache of `length` positions (module doc)."""
    window = cfg.layer_window(layer)
    return length if window is None else min(window, length)


def ring_sizes(cfg: ModelConfig, length: int) -> list[int]:
    """The distinct ring slots of a cache of `length` positions, largest (the full layers') first."""
    return sorted({slots(cfg, i, length) for i in range(cfg.n_layers)}, reverse=True)


def ring_tree(cfg: ModelConfig, length: int) -> dict:
    """Each cache array's ring slots, in the cache's structure (`init_cache`)."""
    period = cfg.global_every
    n_groups, tail = divmod(cfg.n_layers, period)
    return {
        "group": tuple(slots(cfg, j, length) for j in range(period)) if n_groups else (),
        "tail": tuple(slots(cfg, n_groups * period + j, length) for j in range(tail)),
    }


def init_cache(cfg: ModelConfig, batch: int, length: int, pool: Optional[dict[int, int]] = None) -> dict:
    """An empty cache for `batch` rows of at most `length` positions (layout in the module doc); with
    `pool` (ring slots -> pages), paged: each layer's array a pool of that many pages of its ring's
    blocks instead of `batch` rings."""
    dtype = jnp.dtype(cfg.compute_dtype)
    period = cfg.global_every
    n_groups, tail = divmod(cfg.n_layers, period)

    def array(size: int, *lead):
        entries, span = (batch, size) if pool is None else (pool[size], decode_attention.page_size(size))
        return jnp.zeros((*lead, entries, cfg.n_kv_heads, span, 2 * cfg.head_dim), dtype)

    rings = ring_tree(cfg, length)
    return {"group": tuple(array(s, n_groups) for s in rings["group"]), "tail": tuple(array(s) for s in rings["tail"])}


def cache_spec(shape: tuple[int, ...], mesh) -> PartitionSpec:
    """The layout of one cache array ((n_groups,) batch, kv_heads, slots, 2 * head_dim) on `mesh`: batch over
    the batch axes (data, fsdp) and kv heads over `tensor`, each where it divides (the rules table)."""
    batch, kv = logical_to_spec(("batch", "kv_heads"), (shape[-4], shape[-3]), mesh)
    return PartitionSpec(*([None] * (len(shape) - 4)), batch, kv, None, None)


def _constrain(x):
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or mesh.size == 1:
        return x
    return jax.lax.with_sharding_constraint(x, cache_spec(x.shape, mesh))


def _attend(q, keys, values, visible):
    """Attention of q (B, T, H, D) to keys/values (B, KV, S, D) where `visible` (B, T, S) allows."""
    b, t, h, d = q.shape
    kv = keys.shape[1]
    scores = jnp.einsum(
        "btkgd,bksd->bkgts", q.reshape(b, t, kv, h // kv, d), keys, preferred_element_type=jnp.float32
    ) * (d**-0.5)
    scores = jnp.where(visible[:, None, None], scores, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(scores, axis=-1).astype(values.dtype)
    return jnp.einsum("bkgts,bksd->btkgd", probs, values).reshape(b, t, h, d)


def _fill(ring, new):
    """An empty ring (B, KV, S, 2D) holding times 0 .. T-1 of `new` (B, T, KV, 2D): slot s takes the
    newest of them that falls on it (all static: the same slots in every row)."""
    size, t = ring.shape[2], new.shape[1]
    new = new.astype(ring.dtype).transpose(0, 2, 1, 3)
    if t <= size:
        return jax.lax.dynamic_update_slice(ring, new, (0, 0, 0, 0))
    return new[:, :, (t - 1) - np.remainder(t - 1 - np.arange(size), size)]


def _prefill_attention(ring, group, first, window: Optional[int]):
    """The `attend` of olmax.model.olmo3.block for one layer of a prefill (module doc): the call's own
    keys only, causal, within the window, padding (times before first[b]) never seen; the keys and
    values go into the ring, of `group` when the ring array holds a group of layers (else None).
    Returns (output, the updated ring array)."""

    def attend(q, k, v):
        times = jnp.arange(q.shape[1])
        ahead = times[:, None] - times[None, :]  # query minus key time
        visible = ((ahead >= 0) & (window is None or ahead < window))[None] & (times >= first[:, None])[:, None, :]
        heads_first = lambda x: x.astype(ring.dtype).transpose(0, 2, 1, 3)  # (B, KV, T, D), as the ring
        out = _attend(q, heads_first(k), heads_first(v), visible)
        new = jnp.concatenate([k, v], axis=-1)
        if group is None:
            return out, _constrain(_fill(ring, new))
        filled = _fill(jax.lax.dynamic_index_in_dim(ring, group, keepdims=False), new)
        return out, _constrain(jax.lax.dynamic_update_index_in_dim(ring, filled, group, 0))

    return attend


def _decode_attention(ring, group, time, first, size: int, table, implementation: str):
    """The `attend` of one layer of a decoding step at `time` (module doc): the new key and value go
    into slot time % size of every row (of `group`'s layer when the array holds a group; into each
    row's page when `table` pages it), and the query attends to the times each row holds
    (olmax.rollout.decode_attention, which writes them). A step of fewer rows than the cache holds runs
    on its first rows (the slot engine's narrowed decoding, olmax.rollout.slots). Returns (output, the
    updated array)."""

    def attend(q, k, v):
        new = jnp.concatenate([k, v], axis=-1)[:, 0]  # (b, KV, 2D)
        out, written = decode_attention.attend(
            q[:, 0], new, ring, first, time, ring=size, group=group, table=table, implementation=implementation
        )
        return out[:, None], _constrain(written)

    return attend


def cached_forward(
    params: dict,
    cache: dict,
    tokens: jnp.ndarray,
    time,
    cfg: ModelConfig,
    first: Optional[jnp.ndarray] = None,
    length: Optional[int] = None,
    last_only: bool = False,
    fresh: bool = False,
    pages: Optional[dict] = None,
    attention: str = "auto",
):
    """-> (float32 logits (B, T, padded vocab), updated cache). See the module doc. `time`: the time of
    tokens[:, 0] in every row (0 for a prefill); `first` (B,): each row's first real time (default 0:
    no padding). `length`, the RoPE table's length, defaults to the longest ring (a full layer's: the
    cache length). last_only: the logits of the call's last token only, (B, 1, padded vocab): a
    prefill needs no more, and the whole (B, T, vocab) block would be T times the memory. fresh: the
    cache is empty and the call is a prefill from time 0; otherwise it is one decoding step (T = 1), of
    the cache's rows or of its first B rows. pages: a paged cache's tables (ring slots -> (B, S / page)
    page ids; module doc), None for rings. attention: the decoding step's implementation
    (olmax.rollout.decode_attention: auto, xla, pallas or interpret)."""
    b, t = tokens.shape
    if not fresh and t != 1:
        raise ValueError(f"a call on a filled cache is one decoding step of one token per row, got {t} tokens")
    if fresh and pages is not None:
        raise ValueError("a prefill fills rings of its own: a paged cache takes decoding steps only")
    held = (*cache["group"], *cache["tail"])[0].shape[-4] if pages is None else max(x.shape[0] for x in pages.values())
    if b > held or (fresh and b != held):
        raise ValueError(f"{b} rows of tokens on a cache of {held} rows (a decoding step may take its first rows)")
    first = jnp.zeros((b,), jnp.int32) if first is None else first
    cache_len = max(x.shape[-2] for x in (*cache["group"], *cache["tail"])) if pages is None else max(pages)
    length = max(cache_len, t) if length is None else length
    # a padding token's position would be negative: 0 instead (it is never attended, its output unused)
    positions = jnp.maximum(time + jnp.arange(t)[None, :] - first[:, None], 0)
    # (plain, YaRN-scaled) tables at these positions; each layer picks its own (ModelConfig.layer_rope_scaled)
    ropes = {s: tuple(table[positions] for table in rope_tables(cfg, length, s)) for s in (False, True)}
    x = params["embed"][tokens].astype(jnp.dtype(cfg.compute_dtype))

    def layer(x, i, p, ring, group):
        """Layer i (its window and RoPE) with weights p on its cache array `ring` (of `group` when grouped)."""
        if fresh:
            attend = _prefill_attention(ring, group, first, cfg.layer_window(i))
        else:
            size = slots(cfg, i, cache_len)
            table = None if pages is None else pages[size][:b]
            attend = _decode_attention(ring, group, time, first, size, table, attention)
        return block(cfg, p, x, *ropes[cfg.layer_rope_scaled(i)], attend)

    # Each layer's weights and ring are read where they are used, by a dynamic index into the stacked
    # arrays, and the rings ride in the scan's carry, updated in place: scanned over as xs, a group's
    # slices would be copied out (its 4 layers' weights and caches) before any layer read them.
    layers = params["layers"]
    weights = lambda i: jax.tree.map(lambda w: jax.lax.dynamic_index_in_dim(w, i, keepdims=False), layers)
    period = cfg.global_every
    n_groups, tail = divmod(cfg.n_layers, period)
    group_cache: tuple = cache["group"]
    if n_groups:

        def group(carry, g):  # every full group has the first group's windows (olmax.model.olmo3._group_fn)
            x, caches = carry
            caches = list(caches)
            for j in range(period):
                x, caches[j] = layer(x, j, weights(g * period + j), caches[j], g)
            return (x, tuple(caches)), None

        (x, group_cache), _ = jax.lax.scan(group, (x, group_cache), jnp.arange(n_groups))
    tail_cache = []
    for j in range(tail):
        i = n_groups * period + j
        x, c = layer(x, i, weights(i), cache["tail"][j], None)
        tail_cache.append(c)
    if last_only:
        x = x[:, -1:]
    logits = lm_head(params, final_norm(params, x, cfg), cfg)
    return logits, {"group": group_cache, "tail": tuple(tail_cache)}
