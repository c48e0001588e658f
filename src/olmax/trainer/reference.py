"""The reference pass of an objective on pairs that asks for one (DPO: olmax.objectives.base's
`reference_pass`): every kept pair's reference log-probs (olmax.objectives.logps, summed over each
response), computed once from the run's starting parameters and cached beside the tokenized pairs
(open-instruct `dpo_tune_cache.py` caches them so too, then frees the reference model).

    fingerprint = params_fingerprint(start)                                    # the run's start, by content
    reference = reference_logps_cache(cfg, mesh, source, start_params, fingerprint, log=print)   # (pairs, 2)

- Where: DIR/reference_logps/ for data.paths = [DIR]: `key.json` (what they were computed from),
  `chunk_START_END.npy` (pairs START..END-1 of the kept pairs, (n, 2) float32: chosen, rejected),
  written atomically one forward at a time, and `logps.npy`, all pairs, once the pass is complete.
- Key: the starting parameters' content (`params_fingerprint`), the pairs' fingerprint (both sides'
  token and label-mask digests and data.seq_len, olmax.data.pairs), and how the forward computes the log-probs
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
- Sharded as the step: each forward takes one micro-batch of pairs per batch shard (data x fsdp), the
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
from olmax.data.pairs import PairSource
from olmax.errors import ConfigError
from olmax.model.attention import resolve_backend
from olmax.model.olmo3 import param_shardings
from olmax.objectives.base import pair_fields
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


def cache_key(cfg: ExperimentConfig, mesh: Mesh, source: PairSource, fingerprint: str) -> dict:
    """What the reference log-probs depend on: the starting parameters' content, the pairs, and how the
    forward computes them on the mesh's devices."""
    forward = forward_key(cfg, mesh.devices.flat[0].platform)
    return {"parameters": fingerprint, "data": source.fingerprint, "forward": forward, "start": _start(cfg)}


def _stored_key(source: PairSource) -> Optional[dict]:
    path = source.root / CACHE_DIR / KEY_FILE
    return json.loads(path.read_text()) if path.is_file() else None


def _refuse(source: PairSource, stored: dict, key: dict) -> None:
    directory = source.root / CACHE_DIR
    raise ConfigError(
        f"the DPO reference log-probs in {directory} were computed for {json.dumps(stored)}, but this run needs "
        f"them for {json.dumps(key)}: delete {directory} to compute them again (or point data.paths at a "
        "copy of the pairs without it)"
    )


def _refuse_forward(source: PairSource, stored: Optional[dict], forward: dict) -> None:
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
        f"the DPO reference log-probs in {directory} {changed}: delete {directory} to compute them again "
        "(or point data.paths at a copy of the pairs without it)"
    )


def _value(v) -> str:
    return json.dumps(v) if isinstance(v, (dict, list)) else str(v)


def check_cache(source: PairSource, forward: dict) -> None:
    """A ConfigError when the cache holds another data fingerprint or was computed by another forward
    (asked before the trainer loads any parameters, so such a cache costs no checkpoint read; the
    parameters are checked once loaded)."""
    stored = _stored_key(source)
    if stored is None:
        return
    if stored.get("data") != source.fingerprint:
        _refuse(source, {"data": stored.get("data")}, {"data": source.fingerprint})
    # a cache from before the forward was recorded is refused once the parameters are checked too
    if "forward" in stored and stored["forward"] != forward:
        _refuse_forward(source, stored["forward"], forward)


def open_pairs(cfg: ExperimentConfig, mesh: Mesh) -> Optional[PairSource]:
    """An objective on pairs: the run's preference pairs (olmax.data.pairs), their reference cache checked
    first (check_cache) when the objective has a reference pass (DPO); None for the other objectives."""
    objective = objective_of(cfg)
    if objective.data != "pairs":
        return None
    source = PairSource(cfg.data)
    if objective.reference_pass:
        check_cache(source, forward_key(cfg, mesh.devices.flat[0].platform))
    return source


def reference_logps_cache(
    cfg: ExperimentConfig,
    mesh: Mesh,
    source: PairSource,
    start_params: Callable[[], dict],
    fingerprint: str,
    *,
    log=print,
) -> np.ndarray:
    """(pairs, 2) float32 reference log-probs of the kept pairs, from the cache or computed into it.
    `start_params()` gives the starting parameters, sharded (called only when something is missing);
    `fingerprint` is theirs (`params_fingerprint`)."""
    directory = source.root / CACHE_DIR
    key = cache_key(cfg, mesh, source, fingerprint)
    stored = _stored_key(source)
    if stored is not None and (stored.get("parameters"), stored.get("data")) != (key["parameters"], key["data"]):
        _refuse(source, stored, key)
    if stored is not None and stored.get("forward") != key["forward"]:
        _refuse_forward(source, stored.get("forward"), key["forward"])
    primary = jax.process_index() == 0
    if primary and stored is None:
        directory.mkdir(parents=True, exist_ok=True)
        _write_atomic(directory / KEY_FILE, (json.dumps(key, indent=1) + "\n").encode())
    if (directory / COMPLETE).is_file():
        logps = np.load(directory / COMPLETE)
        if logps.shape != (len(source), 2):
            raise ConfigError(f"{directory / COMPLETE} holds {logps.shape[0]} pairs, the data {len(source)}")
        return logps
    chunks = _contiguous_chunks(directory)
    done = chunks[-1][1] if chunks else 0
    if jax.process_count() > 1:  # every process must run the same forwards: process 0's listing decides
        done = int(multihost_utils.broadcast_one_to_all(np.int32(done)))
        chunks = [c for c in chunks if c[1] <= done]
        if (chunks[-1][1] if chunks else 0) != done:
            raise RuntimeError(f"{directory}: this process sees other chunks than process 0 (up to pair {done})")
    if done:
        log(f"DPO reference pass: resuming at pair {done:,} of {len(source):,} ({directory})")
    else:
        log(f"DPO reference pass over {len(source):,} pairs into {directory}")
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


def pair_logps(cfg: ExperimentConfig, mesh: Mesh, source: PairSource, params: dict) -> np.ndarray:
    """(pairs, 2) float32 summed response log-probs of every kept pair under `params`, as the reference
    pass computes them but not cached: for scoring a checkpoint on pairs it did not train on."""
    return np.concatenate(_compute(cfg, mesh, source, params, 0, None, lambda _: None)).astype(np.float32)


def _compute(cfg: ExperimentConfig, mesh: Mesh, source: PairSource, params: dict, start: int, directory, log) -> list:
    """Pairs start.. in forwards of (batch shards x micro-batch) pairs, each chunk written as it comes;
    a line at every tenth of the pairs (the pass over AI2's 7B data is hours)."""
    layout = batch_layout(cfg, mesh)
    per_forward = layout.batch_shards * layout.micro_batch
    fields = pair_fields(cfg, reference=False)
    shardings = {k: field_sharding(f, mesh) for k, f in fields.items()}
    seq_len, model, chunk = cfg.data.seq_len, cfg.model, cfg.trainer.loss_chunk

    def forward(params, input_ids, response_mask):
        rows = input_ids.shape[0] * 2
        flat = response_logps(
            params, input_ids.reshape(rows, seq_len), response_mask.reshape(rows, seq_len), model, chunk=chunk
        ).total
        return jax.lax.stop_gradient(flat.reshape(rows // 2, 2))

    step = jax.jit(
        forward,
        in_shardings=(param_shardings(model, mesh), shardings["input_ids"], shardings["response_mask"]),
        out_shardings=NamedSharding(mesh, PartitionSpec()),
    )
    parts = []
    for begin in range(start, len(source), per_forward):
        end = min(begin + per_forward, len(source))
        # the last forward is filled up with its last pair again (a fixed shape: one compilation)
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
            log(f"DPO reference pass: {end:,} of {len(source):,} pairs")
    return parts


def _contiguous_chunks(directory: Path) -> list[tuple[int, int]]:
    """(start, end) of the chunk files that cover pairs 0.. without a gap, in order."""
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
