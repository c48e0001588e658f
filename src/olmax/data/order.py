"""OLMo-core's global instance order and per-rank batch assignment, as pure functions.

For epoch e (counting from 1) the order is
`np.random.Generator(np.random.PCG64(seed + e)).shuffle(np.arange(N, dtype=np.uint32))`
(OLMo-core `NumpyFSLDataLoader._build_global_indices`). With a chunk size c > 1 (OLMo-core sets
c = max_target_sequence_length // sequence_length) whole runs of c consecutive instances are
shuffled instead. The permutation is truncated to whole global batches of B instances; batch b is
rows `b*B .. (b+1)*B` of it, and data-parallel rank r of D takes columns `r::D` of that row.
Nothing here depends on the number of processes, devices or loader workers.

The permutation is built once per (seed, epoch, N, c) and kept on disk as a raw uint32 memmap, shuffled
in place there, so it never needs to fit in memory twice.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

_FILL_BLOCK = 1 << 24


class OrderError(ValueError):
    """Batch or rank arguments that do not describe a valid slice of the order."""


def permutation(n: int, seed: int, epoch: int, chunk: int = 1, out: np.ndarray | None = None) -> np.ndarray:
    """The global instance order for `epoch` (into `out` when given, e.g. a memmap)."""
    if epoch < 1:
        raise OrderError(f"epochs count from 1, got {epoch}")
    if n >= np.iinfo(np.uint32).max:
        raise OrderError(f"{n} instances do not fit the uint32 order")
    rng = np.random.Generator(np.random.PCG64(seed + epoch))
    if out is None:
        out = np.empty(n if chunk == 1 else (n // chunk) * chunk, dtype=np.uint32)
    if chunk == 1:
        for start in range(0, n, _FILL_BLOCK):
            stop = min(n, start + _FILL_BLOCK)
            out[start:stop] = np.arange(start, stop, dtype=np.uint32)
        rng.shuffle(out)
        return out
    chunks = np.arange(n // chunk, dtype=np.uint32)
    rng.shuffle(chunks)
    out[:] = ((chunks.astype(np.int64) * chunk)[:, None] + np.arange(chunk)[None, :]).reshape(-1)
    return out


def permutation_file(work_dir: str | Path, n: int, seed: int, epoch: int, chunk: int = 1) -> Path:
    name = f"order_seed{seed}_epoch{epoch}_n{n}" + (f"_chunk{chunk}" if chunk > 1 else "") + ".u32"
    return Path(work_dir) / name


def cached_permutation(work_dir: str | Path, n: int, seed: int, epoch: int, chunk: int = 1) -> np.ndarray:
    """The order as a read-only memmap under `work_dir`, built there on first use.

    Several processes may build it at once: each writes its own temp file and renames it into place;
    the content is the same, so whichever rename lands last is fine.
    """
    path = permutation_file(work_dir, n, seed, epoch, chunk)
    length = n if chunk == 1 else (n // chunk) * chunk
    if not path.is_file() or path.stat().st_size != 4 * length:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        if length:
            mm = np.memmap(tmp, dtype=np.uint32, mode="w+", shape=(length,))
            permutation(n, seed, epoch, chunk, out=mm)
            mm.flush()
            del mm
        else:
            tmp.write_bytes(b"")
        os.replace(tmp, path)
    if length == 0:
        return np.zeros(0, dtype=np.uint32)
    return np.memmap(path, dtype=np.uint32, mode="r", shape=(length,))


def num_batches(n_instances: int, global_batch: int) -> int:
    """Whole global batches in an epoch; the remainder of the permutation is dropped."""
    if global_batch <= 0:
        raise OrderError(f"global batch must be positive, got {global_batch}")
    return n_instances // global_batch


def check_rank(global_batch: int, dp_rank: int, dp_size: int) -> None:
    if dp_size <= 0 or not 0 <= dp_rank < dp_size:
        raise OrderError(f"data-parallel rank {dp_rank} is not in 0..{dp_size - 1}")
    if global_batch % dp_size:
        raise OrderError(f"global batch {global_batch} is not divisible by the data-parallel size {dp_size}")


def check_steps(steps: range, n_instances: int, global_batch: int, epoch: int, seq_len: int) -> None:
    """OrderError unless `steps` (a:b = steps a..b-1, counted from 1 as OLMo-core's trainer counts: step
    s trains on batch s - 1) is a non-empty run of the steps of an epoch of `n_instances` instances."""
    total = num_batches(n_instances, global_batch)
    asked = f"steps {steps.start}:{steps.stop}"
    if total == 0:
        raise OrderError(
            f"the data has {n_instances} instances of {seq_len} tokens, fewer than one global batch of "
            f"{global_batch}: no step exists"
        )
    if steps.start >= steps.stop:
        raise OrderError(f"{asked} is empty: a:b means steps a..b-1")
    if steps.start < 1:
        raise OrderError(f"{asked} start before step 1: steps count from 1 (step s trains on batch s - 1)")
    if steps.stop - 1 > total:
        raise OrderError(
            f"{asked} go past the last step {total} of epoch {epoch}: {n_instances} instances of {seq_len} "
            f"tokens make {total} global batches of {global_batch} (the tail that fills no batch is dropped)"
        )


def batch_ids(order: np.ndarray, batch: int, global_batch: int) -> np.ndarray:
    """All instance ids of global batch `batch` (0-based), in OLMo-core's row order."""
    total = num_batches(len(order), global_batch)
    if not 0 <= batch < total:
        raise OrderError(f"batch {batch} is not in 0..{total - 1} ({len(order)} instances, {global_batch} per batch)")
    return np.asarray(order[batch * global_batch : (batch + 1) * global_batch], dtype=np.int64)


def rank_ids(order: np.ndarray, batch: int, global_batch: int, dp_rank: int, dp_size: int) -> np.ndarray:
    """The instance ids that data-parallel rank `dp_rank` of `dp_size` trains on in `batch`."""
    check_rank(global_batch, dp_rank, dp_size)
    return batch_ids(order, batch, global_batch)[dp_rank::dp_size]
