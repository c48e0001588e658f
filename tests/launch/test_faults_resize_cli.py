"""Resizing a run from the command line: `olmax train --recipe tiny --run-dir D --stop-at 8` on
8 (fake CPU) devices, then the same with `--stop-at 20` on 2, logs what one run to 20 on 8 logs (per
step, losses within 1e-6 relative: 2 devices sum the batch in another order). The device count is fixed per
process, so every run is a subprocess."""

import json
import os
import subprocess

import pytest
from small_run import OLMAX

# The tiny recipe shrunk to run in about a minute on 2 shared cores (the full one takes several):
# a narrower, shallower model on shorter sequences, no held-out evaluation; batch, data, schedule as is.
SHRINK = [
    "model.d_model=64",
    "model.n_layers=2",
    "model.n_heads=2",
    "model.n_kv_heads=1",
    "model.mlp_hidden=128",
    "model.sliding_window=16",
    "data.seq_len=64",
    "trainer.loss_chunk=0",
    "eval.every=0",
]
# relative tolerance per logged value after the resize: the losses within 1e-6; the gradient norm, a
# sum of squares over every parameter, accumulates more rounding (docs/launcher.md has the measured deltas)
TOLERANCE = {
    "train/CE loss": 1e-6,
    "train/Z loss": 1e-6,
    "optim/total grad norm": 1e-5,
    "optim/LR": 0.0,
    "optim/step skipped": 0.0,
}


def _olmax_train(run_dir, stop_at, devices, cache):
    env = {**os.environ, "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}"}
    train = [*OLMAX, "train", "--recipe", "tiny", "--run-dir", str(run_dir), "--stop-at", str(stop_at)]
    cmd = [*train, f"data.work_dir={cache}", *SHRINK]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]


def _rows(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow  # ~1-2 min on 2 cores: three trainer processes
def test_stop_at_8_on_8_devices_then_20_on_2_logs_one_run_to_20(tmp_path):
    cache = tmp_path / "cache"
    _olmax_train(tmp_path / "straight", 20, 8, cache)
    _olmax_train(tmp_path / "resized", 8, 8, cache)
    _olmax_train(tmp_path / "resized", 20, 2, cache)
    straight, resized = _rows(tmp_path / "straight"), _rows(tmp_path / "resized")
    assert [r["step"] for r in straight] == [r["step"] for r in resized] == list(range(1, 21))
    worst = dict.fromkeys(TOLERANCE, 0.0)
    for a, b in zip(straight, resized):
        if a["step"] <= 8:  # the same 8 devices: bit for bit
            assert {k: a[k] for k in TOLERANCE} == {k: b[k] for k in TOLERANCE}, a["step"]
        for k, tol in TOLERANCE.items():
            rel = abs(a[k] - b[k]) / max(abs(a[k]), 1e-30)
            worst[k] = max(worst[k], rel)
            assert rel <= tol, (a["step"], k, a[k], b[k])
    print("max relative delta, steps 9-20 on 2 devices:", {k: f"{v:.1e}" for k, v in worst.items()})
