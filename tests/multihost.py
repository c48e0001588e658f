"""Two JAX processes on this host (jax.distributed over 127.0.0.1, two CPU devices each), as the
multi-host tests run them."""

import os
import subprocess
import sys
from pathlib import Path
from typing import Callable

import portpicker

PROCESSES = 2


def run_processes(script: str, tmp_path: Path, args_of: Callable[[int], list[str]], timeout: float = 240) -> None:
    """Run `script` (source) as PROCESSES processes: `python worker.py PORT PID *args_of(PID)`, each
    with two CPU devices; fails, with their output, unless every one exits 0."""
    worker = tmp_path / "worker.py"
    worker.write_text(script)
    port = portpicker.pick_unused_port()
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=2", "JAX_PLATFORMS": "cpu"}
    procs = [
        subprocess.Popen(
            [sys.executable, str(worker), str(port), str(pid), *args_of(pid)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for pid in range(PROCESSES)
    ]
    logs = [p.communicate(timeout=timeout)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), "\n".join(logs)
