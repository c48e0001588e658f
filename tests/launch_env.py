"""What the launcher tests share: the environment Slurm's srun gives one task, for `python -m
olmax.cli.worker` processes started on this machine (jax.distributed over 127.0.0.1, fake CPU devices
per process); the backends' environments, an override a shell would mangle, and stub commands (srun,
scontrol, kubectl, ...) written as small Python scripts."""

import os
import stat
import subprocess
import sys

import portpicker


def slurm_env(rank: int, port: int, *, processes: int = 2, local_devices: int) -> dict:
    return {
        **os.environ,
        "OLMAX_DISTRIBUTED": "slurm",
        "OLMAX_COORDINATOR": f"127.0.0.1:{port}",
        "SLURM_NTASKS": str(processes),
        "SLURM_PROCID": str(rank),
        "XLA_FLAGS": f"--xla_force_host_platform_device_count={local_devices}",
    }


def slurm_tasks(argv: list[str], *, local_devices: int, processes: int = 2, env: dict | None = None) -> list:
    """`processes` copies of the command `argv`, each with its task's environment (and `env` on top), on
    a fresh coordinator port; stdout and stderr together, as text."""
    port = portpicker.pick_unused_port()
    return [
        subprocess.Popen(
            argv,
            env={**slurm_env(rank, port, processes=processes, local_devices=local_devices), **(env or {})},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in range(processes)
    ]


# an override whose value holds spaces, both quote characters and a $ that a shell would expand
TRICKY = """data.paths=["my corpus/a b.npy", "it's \\"$HOME\\""]"""
SLURM_ENV = {"OLMAX_SLURM_PARTITION": "gpu", "OLMAX_SLURM_GPUS_PER_NODE": "4"}
XPK_ENV = {"OLMAX_XPK_CLUSTER": "c1", "OLMAX_XPK_TPU_TYPE": "v5p-16", "OLMAX_DOCKER_IMAGE": "gcr.io/p/olmax:1"}


def stub(directory, name, body):
    """An executable `name` in `directory` running the Python `body`."""
    path = directory / name
    path.write_text(f"#!{sys.executable}\n{body}")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
