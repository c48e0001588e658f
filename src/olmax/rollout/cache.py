"""The model pass with a key/value cache, on olmax.model.olmo3's own block (for olmax.rollout.sampler).

`cached_forward(params, cache, tokens, start, cfg, valid=None)` runs `tokens` (batch, T) whose row b
sits at positions start[b] .. start[b] + T - 1, attends each query to the cached keys it may see and
to this call's own keys, and writes the first valid[b] (default T) of this call's keys and values into
the cache. Key position j is visible from query position i when j <= i and, on a sliding-window
layer, i - j < window (the token and the W-1 before it, as in training). A prefill is one call with
start = 0 and right-padded prompts (valid = the prompt lengths); each decoding step is one call with
T = 1, so generating n tokens costs n single-token passes over the cache instead of n growing full
forwards.

Cache layout. Every layer's cache is a ring of S slots, position p in slot p % S:

- a full-attention layer has S = the cache length (every position of the sequence, so p % S = p);
- a sliding-window layer has S = min(window, cache length): it holds only the positions its queries
  can still see, as vLLM's and transformers' sliding-window caches do (a window-W layer of the 7B
  at a 32k rollout holds 4096 positions, not 32k).

A slot's position is not stored: before a call that starts at `start`, slot s holds the newest
position p < start with p % S == s (none when that is negative), because every position below
`start` has been written. So only the first valid[b] tokens of a call are written (a right-padded
prompt's padding would otherwise overwrite a slot that a later query still needs), and in a prefill
longer than S a slot takes the newest valid position that falls on it. This call's own keys are
attended from the call's outputs, not from the ring, so a prefill longer than a window is exact.

The cache mirrors the forward pass's scan over groups of `global_every` layers (olmax.model.olmo3):
`cache["group"]` holds one {"k", "v"} per position in the group, each (n_groups, batch, S_j, kv_heads,
head_dim) with that position's S_j (a group's layers have different windows, so different shapes);
`cache["tail"]` one (batch, S, kv_heads, head_dim) pair per layer of the final partial group.
Batch and kv heads are laid out by the rules table when traced under a mesh (`cache_spec`).

Each layer runs `olmax.model.olmo3.block`, the block training uses, with an `attend` that reads and
writes the cache; tests/test_rollout_cache.py checks the logits of prefill and of every decoding
step against `olmax.model.olmo3.forward` on the full sequence, with a window shorter than the
sequence (so the rings wrap) and a prefill longer than the window.
"""

from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

from olmax.config import ModelConfig
from olmax.model.olmo3 import block, final_norm, lm_head
from olmax.model.rope import rope_tables
from olmax.sharding import logical_to_spec


def slots(cfg: ModelConfig, layer: int, length: int) -> int:
    """Cache slots of `layer` in a cache of `length` positions (module doc)."""
    window = cfg.layer_window(layer)
    return length if window is None else min(window, length)


def init_cache(cfg: ModelConfig, batch: int, length: int) -> dict:
    """An empty cache for `batch` rows of at most `length` positions (layout in the module doc)."""
    dtype = jnp.dtype(cfg.compute_dtype)
    period = cfg.global_every
    n_groups, tail = divmod(cfg.n_layers, period)
    pair = lambda *lead: {k: jnp.zeros((*lead, cfg.n_kv_heads, cfg.head_dim), dtype) for k in ("k", "v")}
    return {
        "group": tuple(pair(n_groups, batch, slots(cfg, j, length)) for j in range(period)) if n_groups else (),
        "tail": tuple(pair(batch, slots(cfg, n_groups * period + j, length)) for j in range(tail)),
    }


def cache_spec(shape: tuple[int, ...], mesh) -> PartitionSpec:
    """The layout of one cache array ((n_groups,) batch, slots, kv_heads, head_dim) on `mesh`: batch over
    the batch axes (data, fsdp) and kv heads over `tensor`, each where it divides (the rules table)."""
    batch, kv = logical_to_spec(("batch", "kv_heads"), (shape[-4], shape[-2]), mesh)
    return PartitionSpec(*([None] * (len(shape) - 4)), batch, None, kv, None)


def _constrain(x):
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or mesh.size == 1:
        return x
    return jax.lax.with_sharding_constraint(x, cache_spec(x.shape, mesh))


def _ring_attention(k_cache, v_cache, start, valid, positions, window: Optional[int], fresh: bool = False):
    """The `attend` of olmax.model.olmo3.block for one layer with a ring cache (module doc).
    Returns (output, {"k", "v"} updated). fresh: the ring is empty, so only this call's keys are attended."""

    def attend(q, k, v):
        b, t, h, d = q.shape
        size, kv = k_cache.shape[1], k_cache.shape[2]
        slot = jnp.arange(size)[None, :]
        last = (start - 1)[:, None]
        slot_pos = last - jnp.remainder(last - slot, size)  # newest position < start in each slot
        ring_k, ring_v = k_cache, v_cache
        if fresh:  # no slot holds a position: the prefill's scores are (T, T), not (T, S + T)
            ring_k, ring_v, slot_pos = k_cache[:, :0], v_cache[:, :0], slot_pos[:, :0]
        keys = jnp.concatenate([ring_k, k.astype(k_cache.dtype)], axis=1)
        values = jnp.concatenate([ring_v, v.astype(v_cache.dtype)], axis=1)
        key_pos = jnp.concatenate([slot_pos, positions], axis=1)  # (B, S + T)
        key_ok = jnp.concatenate([slot_pos >= 0, jnp.ones((b, t), bool)], axis=1)
        ahead = positions[:, :, None] - key_pos[:, None, :]  # query minus key position
        visible = key_ok[:, None, :] & (ahead >= 0)
        if window is not None:
            visible &= ahead < window
        scores = jnp.einsum(
            "btkgd,bskd->bkgts", q.reshape(b, t, kv, h // kv, d), keys, preferred_element_type=jnp.float32
        ) * (d**-0.5)
        scores = jnp.where(visible[:, None, None], scores, jnp.finfo(jnp.float32).min)
        probs = jax.nn.softmax(scores, axis=-1).astype(values.dtype)
        out = jnp.einsum("bkgts,bskd->btkgd", probs, values).reshape(b, t, h, d)
        return out, {"k": _write(k_cache, k, start, valid), "v": _write(v_cache, v, start, valid)}

    return attend


def _write(ring, new, start, valid):
    """Row b's first valid[b] entries of `new` (B, T, KV, D), at positions start[b].., into `ring`
    (B, S, KV, D), position p in slot p % S; a slot hit more than once keeps the newest."""
    size, t = ring.shape[1], new.shape[1]
    new = new.astype(ring.dtype)
    if t == 1:  # a decoding step: one slot per row, updated in place
        put = lambda r, n, s: jax.lax.dynamic_update_slice(r, n, (jnp.remainder(s, size), 0, 0))
        return _constrain(jax.vmap(put)(ring, new, start))
    end = (start + valid - 1)[:, None]
    newest = end - jnp.remainder(end - jnp.arange(size)[None, :], size)  # newest written position per slot
    taken = newest >= start[:, None]
    rows = jnp.take_along_axis(new, jnp.clip(newest - start[:, None], 0, t - 1)[:, :, None, None], axis=1)
    return _constrain(jnp.where(taken[:, :, None, None], rows, ring))


def cached_forward(
    params: dict,
    cache: dict,
    tokens: jnp.ndarray,
    start: jnp.ndarray,
    cfg: ModelConfig,
    valid: Optional[jnp.ndarray] = None,
    length: Optional[int] = None,
    last: Optional[jnp.ndarray] = None,
    fresh: bool = False,
):
    """-> (float32 logits (B, T, padded vocab), updated cache). See the module doc. `length`, the
    RoPE table's length, defaults to the longest ring (a full layer's: the cache length). `last` (B,):
    the logits of that position of each row only, (B, 1, padded vocab): a prefill needs no more, and
    the whole (B, T, vocab) block would be T times the memory. fresh: the cache is empty (a prefill
    from position 0): the queries attend to this call's keys only, not to the ring's empty slots."""
    cdt = jnp.dtype(cfg.compute_dtype)
    b, t = tokens.shape
    valid = jnp.full((b,), t, jnp.int32) if valid is None else valid
    rings = [c["k"].shape[-3] for c in (*cache["group"], *cache["tail"])]
    length = max(max(rings), t) if length is None else length
    positions = start[:, None] + jnp.arange(t)[None, :]
    # (plain, YaRN-scaled) tables at these positions; each layer picks its own (ModelConfig.layer_rope_scaled)
    ropes = {s: tuple(table[positions] for table in rope_tables(cfg, length, s)) for s in (False, True)}
    x = params["embed"][tokens].astype(cdt)

    def layer(x, i, p, c):
        p = jax.tree.map(lambda w: w.astype(cdt), p)
        attend = _ring_attention(c["k"], c["v"], start, valid, positions, cfg.layer_window(i), fresh)
        return block(cfg, p, x, *ropes[cfg.layer_rope_scaled(i)], attend)

    period = cfg.global_every
    n_groups, tail = divmod(cfg.n_layers, period)
    layers = params["layers"]
    group_cache: tuple = cache["group"]
    if n_groups:
        # The group caches ride in the scan's carry, each group's slice read and written back in place:
        # as the scan's input and output they would be two buffers, and a decoding step would hold the
        # cache twice (twice the rollout's memory, by far its largest part).
        def group(carry, xs):  # every full group has the first group's windows (olmax.model.olmo3._group_fn)
            x, caches = carry
            g, k = xs
            out = []
            for j in range(period):
                mine = jax.tree.map(lambda c: jax.lax.dynamic_index_in_dim(c, k, keepdims=False), caches[j])
                x, new = layer(x, j, jax.tree.map(lambda w: w[j], g), mine)  # noqa: B023 - applied at once
                out.append(jax.tree.map(lambda c, n: jax.lax.dynamic_update_index_in_dim(c, n, k, 0), caches[j], new))
            return (x, tuple(out)), None

        grouped = jax.tree.map(lambda w: w[: n_groups * period].reshape(n_groups, period, *w.shape[1:]), layers)
        (x, group_cache), _ = jax.lax.scan(group, (x, group_cache), (grouped, jnp.arange(n_groups)))
    tail_cache = []
    for j in range(tail):
        i = n_groups * period + j
        x, c = layer(x, i, jax.tree.map(lambda w: w[i], layers), cache["tail"][j])  # noqa: B023
        tail_cache.append(c)
    if last is not None:
        x = jnp.take_along_axis(x, last[:, None, None], axis=1)
    logits = lm_head(params, final_norm(params, x, cfg), cfg)
    return logits, {"group": group_cache, "tail": tuple(tail_cache)}
