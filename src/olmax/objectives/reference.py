"""The DPO reference pass: every kept pair's reference log-probs, computed once from the run's starting
parameters and cached beside the tokenized pairs (open-instruct `dpo_tune_cache.py` caches them so too,
then frees the reference model).

    reference = reference_logps_cache(cfg, mesh, source, start_params, log=print)   # (pairs, 2) float32

- Where: DIR/reference_logps/ for data.paths = [DIR]: `key.json` (what they were computed from),
  `chunk_START_END.npy` (pairs START..END-1 of the kept pairs, (n, 2) float32: chosen, rejected),
  written atomically one forward at a time, and `logps.npy`, all pairs, once the pass is complete.
- Key: the starting checkpoint (checkpoint.init_from and its latest complete step; a run without one
  starts from the random init of trainer.seed) and the pairs' fingerprint (both sides' shard digests and
  data.seq_len, olmax.data.pairs). A cache with another key is refused (ConfigError: exit 2), naming both.
- Resumable: a pass that stopped (killed, preempted) continues after the last contiguous chunk; the
  chunks need not have the same size (a resume may run on another mesh).
- Sharded as the step: each forward takes one micro-batch of pairs per batch shard (data x fsdp), the
  parameters in their training layout; the log-probs come back replicated, so every process has them
  and process 0 writes them.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Callable

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from olmax.checkpoint import complete_steps
from olmax.config import ConfigError, ExperimentConfig
from olmax.data.pairs import PairSource
from olmax.objectives import dpo
from olmax.state import param_shardings
from olmax.train_step import batch_layout, batch_sharding

CACHE_DIR, KEY_FILE, COMPLETE = "reference_logps", "key.json", "logps.npy"
_CHUNK = re.compile(r"chunk_(\d+)_(\d+)\.npy$")


def cache_key(cfg: ExperimentConfig, source: PairSource) -> dict:
    """What the reference log-probs depend on: the starting parameters and the pairs."""
    init = cfg.checkpoint.init_from
    if init is None:
        start = {"init": f"random, trainer.seed={cfg.trainer.seed}"}
    else:
        steps = complete_steps(init)
        start = {"checkpoint": str(init), "step": max(steps) if steps else None}
    return {**start, "data": source.fingerprint}


def check_cache_key(cfg: ExperimentConfig, source: PairSource) -> dict:
    """The run's cache key; a ConfigError naming both when the cache holds another (the trainer asks
    before it loads the starting parameters, so a wrong cache costs no checkpoint read)."""
    directory = source.root / CACHE_DIR
    key = cache_key(cfg, source)
    if (directory / KEY_FILE).is_file():
        stored = json.loads((directory / KEY_FILE).read_text())
        if stored != key:
            raise ConfigError(
                f"the DPO reference log-probs in {directory} were computed for {json.dumps(stored)}, but this run "
                f"starts from {json.dumps(key)}: delete {directory} to compute them again"
            )
    return key


def reference_logps_cache(
    cfg: ExperimentConfig, mesh: Mesh, source: PairSource, start_params: Callable[[], dict], *, log=print
) -> np.ndarray:
    """(pairs, 2) float32 reference log-probs of the kept pairs, from the cache or computed into it.
    `start_params()` gives the starting parameters, sharded (called only when something is missing)."""
    directory = source.root / CACHE_DIR
    key = check_cache_key(cfg, source)
    primary = jax.process_index() == 0
    if primary and not (directory / KEY_FILE).is_file():
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
        parts += _compute(cfg, mesh, source, start_params(), done, directory if primary else None, log)
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
    shardings = dpo.pair_batch_shardings(mesh, batch_sharding(cfg, mesh).spec[0])
    seq_len, model, chunk = cfg.data.seq_len, cfg.model, cfg.trainer.loss_chunk

    def forward(params, input_ids, response_mask):
        rows = input_ids.shape[0] * 2
        flat = dpo.reference_logps(
            params, input_ids.reshape(rows, seq_len), response_mask.reshape(rows, seq_len), model, chunk=chunk
        )
        return flat.reshape(rows // 2, 2)

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
