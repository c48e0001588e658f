"""`python -m olmax.cli.worker ARGS...`: what every host of a multi-host run executes. It sets up
jax.distributed as OLMAX_DISTRIBUTED says, then runs `olmax ARGS...` (e.g. `train --recipe ...`).

OLMAX_DISTRIBUTED:
- unset or `none`: one process, nothing to set up (the local backend);
- `auto`: `jax.distributed.initialize()` with no arguments; JAX finds the coordinator and this
  process's rank itself on Cloud TPU / GKE slices (the xpk backend);
- `slurm`: coordinator OLMAX_COORDINATOR (host:port; the sbatch script exports the job's first node),
  process count SLURM_NTASKS, rank SLURM_PROCID, with JAX's own cluster detection switched off: left
  on, it binds each process to the single GPU numbered SLURM_LOCALID (jax/_src/clusters/cluster.py),
  which suits one process per GPU, whereas here one process per node drives all of its GPUs: every
  GPU Slurm gives the task (JAX_LOCAL_DEVICE_IDS, if set, restricts them: jax.distributed reads it).
  The trainer's mesh then keeps tensor and fsdp within a node (olmax.model.sharding.make_mesh).
"""

from __future__ import annotations

import os
import sys
from typing import Mapping, Optional, Sequence

from olmax.errors import LaunchError

MODES = ("none", "auto", "slurm")


def distributed_args(environ: Mapping[str, str]) -> Optional[dict]:
    """Keyword arguments of jax.distributed.initialize for this environment; None: single process."""
    mode = environ.get("OLMAX_DISTRIBUTED", "") or "none"
    if mode not in MODES:
        raise LaunchError(f"OLMAX_DISTRIBUTED={mode!r} is not one of {', '.join(MODES)}")
    if mode == "none":
        return None
    if mode == "auto":
        return {}
    missing = [v for v in ("OLMAX_COORDINATOR", "SLURM_NTASKS", "SLURM_PROCID") if not environ.get(v)]
    if missing:
        raise LaunchError(
            f"OLMAX_DISTRIBUTED=slurm needs {', '.join(missing)} (set by the sbatch script "
            "that `olmax launch --backend slurm` writes, and by srun)"
        )
    try:
        count, rank = int(environ["SLURM_NTASKS"]), int(environ["SLURM_PROCID"])
    except ValueError:
        raise LaunchError(
            f"SLURM_NTASKS={environ['SLURM_NTASKS']!r} and SLURM_PROCID={environ['SLURM_PROCID']!r} must be integers"
        ) from None
    return {
        "coordinator_address": environ["OLMAX_COORDINATOR"],
        "num_processes": count,
        "process_id": rank,
        "cluster_detection_method": "deactivate",
    }


def main(argv: Optional[Sequence[str]] = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        kwargs = distributed_args(os.environ)
    except LaunchError as e:
        print(f"olmax worker: {e}", file=sys.stderr)
        sys.exit(2)
    if kwargs is not None:
        import jax

        jax.distributed.initialize(**kwargs)
        print(
            f"olmax worker: jax.distributed process {jax.process_index()} of {jax.process_count()}, "
            f"{jax.local_device_count()} local of {jax.device_count()} devices",
            file=sys.stderr,
            flush=True,
        )
    from olmax.cli import main as olmax_main

    sys.argv = ["olmax", *args]
    olmax_main()


if __name__ == "__main__":
    main()
