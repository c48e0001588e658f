"""The environment Slurm's srun gives one task, for `python -m olmax.launch.worker` processes started
on this machine (jax.distributed over 127.0.0.1, fake CPU devices per process)."""

import os


def slurm_env(rank: int, port: int, *, processes: int = 2, local_devices: int) -> dict:
    return {
        **os.environ,
        "OLMAX_DISTRIBUTED": "slurm",
        "OLMAX_COORDINATOR": f"127.0.0.1:{port}",
        "SLURM_NTASKS": str(processes),
        "SLURM_PROCID": str(rank),
        "XLA_FLAGS": f"--xla_force_host_platform_device_count={local_devices}",
    }
