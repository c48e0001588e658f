"""kill -9 under resume-until-done: the local backend's trainer is killed at random moments,
at least once in the middle of a checkpoint write, and the launcher resubmits it each time. The run
finishes, and its metrics.jsonl rows (one per step: a resumed trainer drops rows after its checkpoint,
olmax.trainer.metrics) and final parameters equal those of an uninterrupted run bit for bit."""

import json
import os
import random
import signal
import subprocess
import time

import jax
import numpy as np
import pytest
from small_run import EXACT_KEYS, OLMAX
from small_run import SMALL as BASE

from olmax.checkpoint.store import TMP_SUFFIX, load_params
from olmax.config.io import apply_overrides
from olmax.config.recipes import get_recipe
from olmax.launch.resume import LOCK_FILE
from olmax.trainer.run import train

SMALL = BASE + ["trainer.max_steps=12", "eval.every=0"]
KEYS = [*EXACT_KEYS, "data/repeats"]
# What each kill waits for: "save", a checkpoint write in progress (a new <step>.orbax-checkpoint-tmp);
# "step", a random step at least 5 past the newest checkpoint (so one more commits), then a random part of a step;
# "startup", a random moment in the first 3 s (imports, restore, compilation).
KILLS = ["save", "step", "startup", "save", "step"]


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return not open(f"/proc/{pid}/stat").read().split(") ")[-1].startswith("Z")


def _trainer_pid(run_dir, killed, deadline):
    """The launcher's current child, once it is a new one (the lock file records it)."""
    while time.time() < deadline:
        try:
            pid = json.loads((run_dir / LOCK_FILE).read_text())["child_pid"]
        except (FileNotFoundError, json.JSONDecodeError):
            pid = None
        if pid and pid not in killed and _alive(pid):
            return pid
        time.sleep(0.01)
    raise TimeoutError("no trainer started")


def _writes(ckpts, since):
    """Checkpoint writes in progress that started after `since` (older ones are interrupted saves)."""
    if not ckpts.is_dir():
        return []
    return sorted(n for n in os.listdir(ckpts) if TMP_SUFFIX in n and os.stat(ckpts / n).st_mtime >= since)


def _logged(run_dir, since):
    """Steps in metrics.jsonl once this attempt writes it (before, it may hold rows the attempt drops)."""
    path = run_dir / "metrics.jsonl"
    try:
        return len(path.read_text().splitlines()) if path.stat().st_mtime >= since else 0
    except FileNotFoundError:
        return 0


def _wait_for(kind, pid, run_dir, started, rng, deadline):
    ckpts = run_dir / "checkpoints"
    if kind == "save":
        while _alive(pid) and not _writes(ckpts, started) and time.time() < deadline:
            time.sleep(0.001)
    elif kind == "step":
        newest = max([int(n) for n in os.listdir(ckpts) if n.isdigit()], default=0) if ckpts.is_dir() else 0
        # past the next checkpoint (every 3 steps) and its write: an attempt killed here leaves progress,
        # whatever the other kills did (three "save" kills all in the first write once left none)
        target = rng.randint(min(newest + 5, 11), 11)
        while _alive(pid) and _logged(run_dir, started) < target and time.time() < deadline:
            time.sleep(0.005)
        time.sleep(rng.uniform(0.0, 0.3))
    else:
        time.sleep(rng.uniform(0.0, 3.0))


@pytest.mark.slow  # ~3-4 min on 2 shared cores: 6 trainer starts and a reference run
def test_kill_9_at_random_moments_then_resume_until_done_equals_an_uninterrupted_run(tmp_path):
    seed = int(os.environ.get("OLMAX_KILL_SEED", "0")) or random.randrange(1, 10**6)
    rng = random.Random(seed)
    overrides = SMALL + [f"data.work_dir={tmp_path / 'cache'}"]
    run_dir, ckpts = tmp_path / "run", tmp_path / "run" / "checkpoints"
    t0 = time.time()
    launcher = subprocess.Popen(
        [
            *OLMAX,
            *("launch", "resume-until-done", "--backend", "local", "--recipe", "tiny", "--total-devices", "8"),
            *("--run-dir", str(run_dir), "--retry-backoff", "0", "--max-retries", "10", *overrides),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    killed, during_save = [], []
    deadline = time.time() + 600
    for kind in KILLS:
        pid = _trainer_pid(run_dir, killed, deadline)
        started = time.time() - 0.01
        _wait_for(kind, pid, run_dir, started, rng, deadline)
        if not _alive(pid):  # it finished first: nothing to kill
            break
        os.kill(pid, signal.SIGKILL)
        while _alive(pid):
            time.sleep(0.001)
        killed.append(pid)
        writes = _writes(ckpts, started)
        if writes:  # the write it was in the middle of can never be committed now
            during_save.append(writes)
    out, _ = launcher.communicate(timeout=600)
    wall = time.time() - t0
    assert launcher.returncode == 0, out[-4000:]
    print(
        f"\nseed {seed}: {len(killed)} kills ({len(during_save)} during a checkpoint write: {during_save}); "
        f"resume-until-done finished in {wall:.0f} s"
    )
    assert len(killed) >= 3, out[-4000:]
    assert during_save, "no kill landed in a checkpoint write"
    assert f"after {len(killed) + 1} attempt(s)" in out.splitlines()[-1], out[-4000:]
    resumed_from = [int(line.split("from step ")[1].split(";")[0]) for line in out.splitlines() if "from step" in line]
    print(f"attempts started from steps {resumed_from}")
    assert max(resumed_from) > 0  # later attempts resumed from checkpoints, not from scratch
    logs = "".join(p.read_text() for p in (run_dir / "launch").glob("attempt-*.log"))
    assert "ignoring the interrupted save" in logs

    straight = train(apply_overrides(get_recipe("tiny"), overrides), tmp_path / "straight", progress=False)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, 13))
    for a, b in zip(straight, rows):
        assert {k: a[k] for k in KEYS} == {k: b[k] for k in KEYS}, a["step"]
    final, _, _ = load_params(ckpts, 12)
    reference, _, _ = load_params(tmp_path / "straight" / "checkpoints", 12)
    for a, b in zip(jax.tree.leaves(final), jax.tree.leaves(reference)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
