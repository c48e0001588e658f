"""Training on two hosts, as `olmax launch --backend slurm` runs it: two worker processes (Slurm's
variables, jax.distributed on 127.0.0.1, 4 CPU devices each) train `tiny` to step 4, each loading only
its ranks' rows; one writes the metrics. A single process on 8 devices then resumes their checkpoint
to step 6. Every step's losses equal one single-process run's (fp32, 1e-6 relative)."""

import json
import os
import socket
import subprocess
import sys

import pytest

from olmax.config import apply_overrides
from olmax.recipes import get_recipe
from olmax.train import train

SMALL = ["model.d_model=64", "model.n_layers=2", "model.n_heads=2", "model.n_kv_heads=1", "model.head_dim=32",
         "model.mlp_hidden=128", "model.sliding_window=16", "data.seq_len=64", "trainer.global_batch=8",
         "trainer.loss_chunk=0", "trainer.max_steps=6", "schedule.warmup_steps=2", "checkpoint.every=2",
         "eval.every=2", "eval.batches=1"]
KEYS = ["train/CE loss", "train/Z loss", "optim/total grad norm", "eval/demo-heldout/CE loss"]


@pytest.mark.slow  # ~1-2 min on 2 cores: two JAX processes, then two single-process runs
def test_two_processes_train_like_one(tmp_path):
    overrides = SMALL + [f"data.work_dir={tmp_path / 'cache'}"]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    run = tmp_path / "two_hosts"
    procs = []
    for rank in range(2):
        env = {**os.environ, "OLMAX_DISTRIBUTED": "slurm", "OLMAX_COORDINATOR": f"127.0.0.1:{port}",
               "SLURM_NTASKS": "2", "SLURM_PROCID": str(rank), "XLA_FLAGS": "--xla_force_host_platform_device_count=4"}
        procs.append(subprocess.Popen([sys.executable, "-m", "olmax.launch.worker", "train", "--recipe", "tiny",
                                       "--run-dir", str(run), "--stop-at", "4", *overrides],
                                      env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
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
