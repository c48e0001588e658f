"""Training on two hosts, as `olmax launch --backend slurm` runs it: two worker processes (Slurm's
variables, jax.distributed on 127.0.0.1, 4 CPU devices each) train `tiny` to step 4, each loading only
its ranks' rows; one writes the metrics. A single process on 8 devices then resumes their checkpoint
to step 6. Every step's losses equal one single-process run's (fp32, 1e-6 relative)."""

import json
import signal
import sys
import time

import pytest
from launch_env import slurm_tasks
from small_run import SMALL as BASE

from olmax.config.io import apply_overrides
from olmax.config.recipes import get_recipe
from olmax.trainer.run import train

SMALL = BASE + ["checkpoint.every=2", "eval.every=2", "eval.batches=1"]
KEYS = ["train/CE loss", "train/Z loss", "optim/total grad norm", "eval/demo-heldout/CE loss"]


def _two_workers(run, *args):
    worker = [sys.executable, "-m", "olmax.cli.worker", "train", "--recipe", "tiny", "--run-dir", str(run)]
    return slurm_tasks([*worker, *args], local_devices=4)


@pytest.mark.slow  # ~1-2 min on 2 cores: two JAX processes, then two single-process runs
def test_two_processes_train_like_one(tmp_path):
    overrides = SMALL + [f"data.work_dir={tmp_path / 'cache'}"]
    run = tmp_path / "two_hosts"
    procs = _two_workers(run, "--stop-at", "4", *overrides)
    logs = [p.communicate(timeout=600)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), "\n".join(log[-3000:] for log in logs)

    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]  # written once, by process 0
    cfg = apply_overrides(get_recipe("tiny"), overrides)
    rows += train(cfg, run, progress=False)  # one process, 8 devices, from the two-process checkpoint of step 4
    straight = train(cfg, tmp_path / "one_host", progress=False)
    assert [r["step"] for r in rows] == [r["step"] for r in straight] == [1, 2, 3, 4, 5, 6]
    assert [r["step"] for r in rows if KEYS[-1] in r] == [2, 4, 6]  # the in-loop eval ran on both hosts
    for a, b in zip(rows, straight):
        for key in KEYS:
            if key in b:
                assert a[key] == pytest.approx(b[key], rel=1e-6), (a["step"], key)


@pytest.mark.slow  # ~1 min: two JAX processes
def test_sigterm_to_one_host_stops_both_at_the_same_step(tmp_path):
    """A preemption notice reaching only one host: JAX's preemption sync manager makes both save the
    same step and exit cleanly (stopping apart would hang the other host in its next collective)."""
    from olmax.checkpoint.store import complete_steps

    run = tmp_path / "two_hosts"
    overrides = SMALL + [
        f"data.work_dir={tmp_path / 'cache'}",
        "trainer.max_steps=400",
        "checkpoint.every=1000",
        "eval.every=0",
    ]
    procs = _two_workers(run, *overrides)
    metrics, deadline = run / "metrics.jsonl", time.monotonic() + 300
    while not (metrics.exists() and len(metrics.read_text().splitlines()) >= 3):
        assert time.monotonic() < deadline and all(p.poll() is None for p in procs), "no progress"
        time.sleep(0.5)
    procs[1].send_signal(signal.SIGTERM)  # the host that does not write the metrics
    logs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [143, 143], "\n".join(log[-3000:] for log in logs)  # PREEMPTED
    steps = complete_steps(run / "checkpoints")
    last = json.loads(metrics.read_text().splitlines()[-1])["step"]
    assert steps == [last] and 3 <= last < 400  # one checkpoint, of the step both stopped after
