"""The reference pass of an objective on items read from files that asks for one (olmax.objectives.base's
`reference_pass`: DPO on preference pairs, a plug-in such as KTO on its own kind of items): every kept
item's rows' reference log-probs (olmax.objectives.logps, summed over each response), computed once from
the run's starting parameters and cached beside the tokenized data (open-instruct `dpo_tune_cache.py`
caches them so too, then frees the reference model; TRL's `precompute_ref_log_probs` likewise).
Messages name the running objective ("DPO reference pass: ...").

    source = open_pairs(cfg, mesh)                                            # the run's items (None: no items)
    fingerprint = params_fingerprint(start)                                    # the run's start, by content
    reference = reference_logps_cache(cfg, mesh, source, start_params, fingerprint, log=print)   # (items, rows)

- Where: ROOT/reference_logps/ for the source's root (DIR for data.paths = [DIR]): `key.json` (what they
  were computed from), `chunk_START_END.npy` (items START..END-1 of the kept items, (n, rows) float32: a
  pair's chosen, rejected), written atomically one forward at a time, and `logps.npy`, all items, once
  the pass is complete.
- Key: the starting parameters' content (`params_fingerprint`), the items' fingerprint (for pairs both
  sides' token and label-mask digests and data.seq_len, olmax.data.pairs), and how the forward computes the log-probs
  (`forward_key`: every model field that changes its values, the attention backend as it resolves on
  the run's platform, the output layer's chunking); `start` in key.json says where the parameters came
  from (checkpoint.init_from and its step, or the random init of trainer.seed), for the reader only. A
  cache with another key is refused (ConfigError: exit 2), naming the cache and what differs: both
  fingerprints, or each forward setting with its two values. Keyed by content, not by path and step:
  SFT redone into the same directory with as many steps, or another architecture under the same
  trainer.seed, is other parameters under the same name.
- Resumable: a pass that stopped (killed, preempted) continues after the last contiguous chunk; the
  chunks need not have the same size (a resume may run on another mesh). Parameters made again for it
  must have the key's fingerprint.
- Sharded as the step: each forward takes one micro-batch of items per batch shard (data x fsdp), the
  parameters in their training layout; the log-probs come back replicated, so every process has them
  and process 0 writes them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
from pathlib import Path
from typing import Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from olmax.checkpoint.store import complete_steps
from olmax.config.experiment import ExperimentConfig
from olmax.data.pairs import ItemSource, item_source
from olmax.errors import ConfigError
from olmax.model.attention import resolve_backend
from olmax.model.olmo3 import param_shardings
from olmax.objectives.base import item_fields
from olmax.objectives.logps import response_logps
from olmax.objectives.registry import objective_of
from olmax.step.train_step import batch_layout, field_sharding

CACHE_DIR, KEY_FILE, COMPLETE = "reference_logps", "key.json", "logps.npy"
_CHUNK = re.compile(r"chunk_(\d+)_(\d+)\.npy$")
_UINT = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32}


def _mix(h: jnp.ndarray) -> jnp.ndarray:
    # MurmurHash3's 32-bit finaliser: a bijection of uint32 that spreads every input bit over the output
    h = h ^ (h >> 16)
    h = h * jnp.uint32(0x85EBCA6B)
    h = h ^ (h >> 13)
    h = h * jnp.uint32(0xC2B2AE35)
    return h ^ (h >> 16)


def _leaf_digests(x: jnp.ndarray) -> jnp.ndarray:
    """(2,) uint32: two sums over the leaf of its elements' bits mixed with their positions."""
    bits = jax.lax.bitcast_convert_type(x, _UINT[x.dtype.itemsize]).astype(jnp.uint32)
    index = jnp.zeros(x.shape, jnp.uint32)
    for axis, size in enumerate(x.shape):  # the row-major position, without reshaping a sharded array
        index = index * jnp.uint32(size) + jax.lax.broadcasted_iota(jnp.uint32, x.shape, axis)
    position = _mix(index)
    return jnp.stack(
        [
            jnp.sum(_mix(bits ^ position), dtype=jnp.uint32),
            jnp.sum(_mix(bits + _mix(position)), dtype=jnp.uint32),
        ]
    )


def _all_digests(leaves: list) -> list:
    return [_leaf_digests(x) for x in leaves]


def params_fingerprint(params) -> str:
    """sha256 over every leaf's path, shape, dtype and two 32-bit digests of its bits (`_leaf_digests`).

    The digests are computed where the parameters are, in one jitted pass (an elementwise hash and a
    sum per leaf): a byte hash would bring every parameter to one host first (a 7B's 28 GB in float32,
    gathered across processes). They are sums of integers modulo 2^32, which are exact whatever the
    order of the additions, so the fingerprint is the same on any mesh, device count or backend: a
    resume on other devices recomputes the same value. Each element enters through a bijective mix of
    its bits with its position, so changing any one element (or moving values between positions)
    changes the digests; any leaf's shape, dtype or path changes the fingerprint directly."""
    leaves = jax.tree_util.tree_flatten_with_path(params)[0]
    where = leaves[0][1].sharding if leaves else None
    # replicated on the parameters' mesh, so that every process can read them
    replicated = NamedSharding(where.mesh, PartitionSpec()) if isinstance(where, NamedSharding) else None
    digests = jax.jit(_all_digests, out_shardings=replicated)([x for _, x in leaves])
    h = hashlib.sha256()
    for (path, x), d in zip(leaves, jax.device_get(digests)):
        h.update(f"{jax.tree_util.keystr(path)} {x.shape} {x.dtype} {int(d[0]):08x}{int(d[1]):08x}\n".encode())
    return h.hexdigest()


def _start(cfg: ExperimentConfig) -> str:
    """Where the starting parameters came from, in words (key.json's `start`, not compared)."""
    init = cfg.checkpoint.init_from
    if init is None:
        return f"random init, trainer.seed={cfg.trainer.seed}"
    steps = complete_steps(init)
    return f"{init} step {max(steps) if steps else None}"


# Model fields the reference log-probs do not depend on: the remat policy and the backward's order
# change memory only, the init's scale is not used on the starting parameters, and the attention
# backend and its tiles enter as they resolve (forward_key).
NOT_FORWARD = ("remat", "remat_serial", "init_std", "attention", "splash_blocks")


def forward_key(cfg: ExperimentConfig, platform: str) -> dict:
    """How the reference pass computes the log-probs on devices of `platform`, by config field: every
    model field but NOT_FORWARD (architecture, RoPE and YaRN, windows, precision), the attention backend
    as it resolves there (each kernel its own numerics) and the splash tiles when it is splash, and
    trainer.loss_chunk (the output layer's chunks: the order of its sums)."""
    model = cfg.model
    key = {f"model.{f.name}": getattr(model, f.name) for f in dataclasses.fields(model) if f.name not in NOT_FORWARD}
    backend = resolve_backend(model.attention, platform, model.compute_dtype)
    key["model.attention"] = backend
    if backend == "splash":
        key["model.splash_blocks"] = dataclasses.asdict(model.splash_blocks)
    key["trainer.loss_chunk"] = cfg.trainer.loss_chunk
    return json.loads(json.dumps(key))  # as key.json holds it (tuples as lists)


def _title(cfg: ExperimentConfig) -> str:
    """The running objective as messages name it ("DPO")."""
    return cfg.trainer.objective.upper()


def cache_key(cfg: ExperimentConfig, mesh: Mesh, source: ItemSource, fingerprint: str) -> dict:
    """What the reference log-probs depend on: the starting parameters' content, the items, and how the
    forward computes them on the mesh's devices."""
    forward = forward_key(cfg, mesh.devices.flat[0].platform)
    return {"parameters": fingerprint, "data": source.fingerprint, "forward": forward, "start": _start(cfg)}


def _stored_key(source: ItemSource) -> Optional[dict]:
    path = source.root / CACHE_DIR / KEY_FILE
    return json.loads(path.read_text()) if path.is_file() else None


def _refuse(cfg: ExperimentConfig, source: ItemSource, stored: dict, key: dict) -> None:
    directory = source.root / CACHE_DIR
    raise ConfigError(
        f"the {_title(cfg)} reference log-probs in {directory} were computed for {json.dumps(stored)}, but this "
        f"run needs them for {json.dumps(key)}: delete {directory} to compute them again (or point data.paths at a "
        f"copy of the {source.item}s without it)"
    )


def _refuse_forward(cfg: ExperimentConfig, source: ItemSource, stored: Optional[dict], forward: dict) -> None:
    """A ConfigError naming each forward setting the cache was computed under that this run changes."""
    directory = source.root / CACHE_DIR
    if stored is None:
        changed = "were computed before olmax recorded how the forward computes them (the model and loss settings)"
    else:
        fields = sorted(set(stored) | set(forward), key=lambda k: (k not in forward, k))
        changed = "were computed with " + ", ".join(
            f"{k}={_value(stored.get(k))} where this run has {k}={_value(forward.get(k))}"
            for k in fields
            if stored.get(k) != forward.get(k)
        )
    raise ConfigError(
        f"the {_title(cfg)} reference log-probs in {directory} {changed}: delete {directory} to compute them "
        f"again (or point data.paths at a copy of the {source.item}s without it)"
    )


def _value(v) -> str:
    return json.dumps(v) if isinstance(v, (dict, list)) else str(v)


def check_cache(cfg: ExperimentConfig, source: ItemSource, forward: dict) -> None:
    """A ConfigError when the cache holds another data fingerprint or was computed by another forward
    (asked before the trainer loads any parameters, so such a cache costs no checkpoint read; the
    parameters are checked once loaded)."""
    stored = _stored_key(source)
    if stored is None:
        return
    if stored.get("data") != source.fingerprint:
        _refuse(cfg, source, {"data": stored.get("data")}, {"data": source.fingerprint})
    # a cache from before the forward was recorded is refused once the parameters are checked too
    if "forward" in stored and stored["forward"] != forward:
        _refuse_forward(cfg, source, stored["forward"], forward)


def open_pairs(cfg: ExperimentConfig, mesh: Mesh) -> Optional[ItemSource]:
    """An objective on items read from files: the run's items (olmax.data.pairs: the preference pairs, or
    a plug-in data kind's `source`), their reference cache checked first (check_cache) when the objective
    has a reference pass (DPO, KTO); None for an objective on tokens or rollouts, whose batches the
    trainer makes otherwise (olmax.trainer.batches)."""
    objective = objective_of(cfg)
    if objective.data in ("tokens", "rollouts"):
        return None
    source = item_source(cfg)
    if objective.reference_pass:
        check_cache(cfg, source, forward_key(cfg, mesh.devices.flat[0].platform))
    return source


def reference_logps_cache(
    cfg: ExperimentConfig,
    mesh: Mesh,
    source: ItemSource,
    start_params: Callable[[], dict],
    fingerprint: str,
    *,
    log=print,
) -> np.ndarray:
    """(items, rows) float32 reference log-probs of the kept items, from the cache or computed into it.
    `start_params()` gives the starting parameters, sharded (called only when something is missing);
    `fingerprint` is theirs (`params_fingerprint`)."""
    directory = source.root / CACHE_DIR
    key = cache_key(cfg, mesh, source, fingerprint)
    stored = _stored_key(source)
    if stored is not None and (stored.get("parameters"), stored.get("data")) != (key["parameters"], key["data"]):
        _refuse(cfg, source, stored, key)
    if stored is not None and stored.get("forward") != key["forward"]:
        _refuse_forward(cfg, source, stored.get("forward"), key["forward"])
    primary = jax.process_index() == 0
    if primary and stored is None:
        directory.mkdir(parents=True, exist_ok=True)
        _write_atomic(directory / KEY_FILE, (json.dumps(key, indent=1) + "\n").encode())
    if (directory / COMPLETE).is_file():
        logps = np.load(directory / COMPLETE)
        if logps.shape != (len(source), source.rows_per_item):
            raise ConfigError(
                f"{directory / COMPLETE} holds {logps.shape} log-probs, the data {len(source)} {source.item}s of "
                f"{source.rows_per_item} rows"
            )
        return logps
    chunks = _contiguous_chunks(directory)
    done = chunks[-1][1] if chunks else 0
    if jax.process_count() > 1:  # every process must run the same forwards: process 0's listing decides
        done = int(multihost_utils.broadcast_one_to_all(np.int32(done)))
        chunks = [c for c in chunks if c[1] <= done]
        if (chunks[-1][1] if chunks else 0) != done:
            raise RuntimeError(
                f"{directory}: this process sees other chunks than process 0 (up to {source.item} {done})"
            )
    title, item = _title(cfg), source.item
    if done:
        log(f"{title} reference pass: resuming at {item} {done:,} of {len(source):,} ({directory})")
    else:
        log(f"{title} reference pass over {len(source):,} {item}s into {directory}")
    parts = [np.load(directory / f"chunk_{s:09d}_{e:09d}.npy") for s, e in chunks]
    if done < len(source):
        params = start_params()
        # made again for a resumed run, they may not be the ones it started from (the starting
        # checkpoint's directory written again since)
        made = params_fingerprint(params)
        if made != fingerprint:
            raise ConfigError(
                f"the starting parameters ({key['start']}) have the fingerprint {made}, but this run started "
                f"from {fingerprint}: checkpoint.init_from holds other parameters now; start a new run"
            )
        parts += _compute(cfg, mesh, source, params, done, directory if primary else None, log)
    logps = np.concatenate(parts).astype(np.float32)
    if primary:
        _write_npy(directory / COMPLETE, logps)
    return logps


def pair_logps(cfg: ExperimentConfig, mesh: Mesh, source: ItemSource, params: dict) -> np.ndarray:
    """(items, rows) float32 summed response log-probs of every kept item under `params`, as the reference
    pass computes them but not cached: for scoring a checkpoint on pairs it did not train on."""
    return np.concatenate(_compute(cfg, mesh, source, params, 0, None, lambda _: None)).astype(np.float32)


def _compute(cfg: ExperimentConfig, mesh: Mesh, source: ItemSource, params: dict, start: int, directory, log) -> list:
    """Items start.. in forwards of (batch shards x micro-batch) items, each chunk written as it comes;
    a line at every tenth of the items (the pass over AI2's 7B data is hours)."""
    layout = batch_layout(cfg, mesh)
    per_forward = layout.batch_shards * layout.micro_batch
    fields = item_fields(cfg, reference=False)
    shardings = {k: field_sharding(f, mesh) for k, f in fields.items()}
    seq_len, model, chunk = cfg.data.seq_len, cfg.model, cfg.trainer.loss_chunk

    def forward(params, input_ids, response_mask):
        items, per_item = input_ids.shape[:2]
        rows = items * per_item
        flat = response_logps(
            params, input_ids.reshape(rows, seq_len), response_mask.reshape(rows, seq_len), model, chunk=chunk
        ).total
        return jax.lax.stop_gradient(flat.reshape(items, per_item))

    step = jax.jit(
        forward,
        in_shardings=(param_shardings(model, mesh), shardings["input_ids"], shardings["response_mask"]),
        out_shardings=NamedSharding(mesh, PartitionSpec()),
    )
    parts = []
    for begin in range(start, len(source), per_forward):
        end = min(begin + per_forward, len(source))
        # the last forward is filled up with its last item again (a fixed shape: one compilation)
        ids = np.minimum(np.arange(begin, begin + per_forward), end - 1)
        input_ids, mask = source.rows(ids)
        arrays = [
            jax.make_array_from_callback(x.shape, shardings[k], lambda index, x=x: x[index])
            for k, x in (("input_ids", input_ids), ("response_mask", mask))
        ]
        out = np.asarray(jax.device_get(step(params, *arrays)))[: end - begin]
        if directory is not None:
            _write_npy(directory / f"chunk_{begin:09d}_{end:09d}.npy", out)
        parts.append(out)
        if end * 10 // len(source) > begin * 10 // len(source) and end < len(source):
            log(f"{_title(cfg)} reference pass: {end:,} of {len(source):,} {source.item}s")
    return parts


def _contiguous_chunks(directory: Path) -> list[tuple[int, int]]:
    """(start, end) of the chunk files that cover items 0.. without a gap, in order."""
    spans = {}
    for path in directory.glob("chunk_*.npy") if directory.is_dir() else ():
        match = _CHUNK.search(path.name)
        if match:
            spans[int(match[1])] = int(match[2])
    chunks, at = [], 0
    while at in spans:
        chunks.append((at, spans[at]))
        at = spans[at]
    return chunks


def _write_npy(path: Path, array: np.ndarray) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        np.save(f, array)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)
