"""benchmarks/gpu_mfu.py, the one-command GPU benchmark, end to end on CPU: its --dry-run runs a row
in a process of its own with the chip's GPU profile from olmax.fit.chips (the caller's XLA flags after
it, so they win), times the real train step and prints the table; without a GPU and without
--dry-run it refuses with exit status 2."""

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from olmax.fit.chips import GPU_XLA_FLAGS

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_mfu.py"


def _run(*args, env=None):
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=600)


@pytest.mark.slow  # ~25 s: a process of its own compiling a 7B-shaped row
def test_dry_run_times_the_step_with_the_gpu_profile(tmp_path):
    out = tmp_path / "gpu_mfu.json"
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
    # a vocabulary of 1024 through --set: the compile dominates, and --set must reach the row
    run = _run(
        "--dry-run", "--rows", "7b", "--steps", "2", "--set", "model.vocab_size=1024", "--json", str(out), env=env
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    (row,) = json.loads(out.read_text())["rows"]
    assert row["row"] == "7b" and row["backend"] == "cpu" and row["loss_finite"]
    assert "model.vocab_size=1024" in row["overrides"] and "model.remat=full" in row["overrides"]
    assert row["XLA_FLAGS"] == " ".join(GPU_XLA_FLAGS) + " --xla_force_host_platform_device_count=2"
    assert row["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.95"  # the whole 7B's own, over the profile's 0.90
    assert len(row["step_times_s"]) == 2 and row["s_per_step"] == statistics.median(row["step_times_s"])
    flops = row["flops"]
    assert flops["tokens_per_step"] == 256 and flops["peak_tflops_per_device"] == 989.0  # the h200 default
    assert flops["tokens_per_s"] == 256 / row["s_per_step"]
    table = run.stdout.splitlines()
    header = next(i for i, line in enumerate(table) if line.startswith("row "))
    assert table[header + 1].split()[:2] == ["7b", "256"] and "MFU against 989 TFLOP/s (h200)" in table[header + 2]


def test_without_a_gpu_it_refuses():
    run = _run("--rows", "7b-4l", env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert run.returncode == 2, run.stdout[-2000:] + run.stderr[-2000:]
    assert "JAX sees no GPU (backend 'cpu'" in run.stdout and "or run with --dry-run" in run.stdout
