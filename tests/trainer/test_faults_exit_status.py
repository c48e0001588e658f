"""Each row of the exit-status table (olmax.rundir.exits) by injecting its fault into a real `olmax train`:
a changed shard (USER_ERROR, never retried), a remote server that fails reads and then recovers
(TRANSIENT, retried), SIGTERM (PREEMPTED, retried without counting); kill -9 (CRASHED) under
resume-until-done is tests/trainer/test_faults_kill.py, its decision tests/launch/test_launch_resume.py.

The quick tests share one run trained to step 3 and copy it; the slow ones drive resume-until-done
with the local backend (a trainer subprocess per attempt)."""

import json
import os
import shutil
import signal
import threading
import time

import numpy as np
import pytest
from fake_remote import RangeServer
from small_run import SMALL
from typer.testing import CliRunner

from olmax.checkpoint.store import complete_steps
from olmax.cli.common import app
from olmax.rundir.exits import RECORD_FILE, ExitStatus

VOCAB, SEQ = 5000, 64
SHARDS = ["part-0.npy", "part-1.npy"]


def _data(paths):
    listed = ",".join(f'"{p}"' for p in paths)
    return [
        f"data.paths=[{listed}]",
        f"data.vocab_size={VOCAB}",
        f"data.eos_token_id={VOCAB - 1}",
        "data.pad_token_id=0",
        "eval.every=0",
        "eval.data=[]",
    ]


def _write_shards(root):
    root.mkdir(parents=True, exist_ok=True)
    for i, name in enumerate(SHARDS):
        np.random.default_rng(i).integers(0, VOCAB, size=SEQ * 40).astype(np.uint16).tofile(root / name)


def _train(run_dir, data_root, *extra):
    args = [
        "train",
        "--recipe",
        "tiny",
        "--run-dir",
        str(run_dir),
        *SMALL,
        f"data.work_dir={run_dir.parent / 'cache'}",
        *_data([f"{data_root}/{n}" for n in SHARDS]),
        *extra,
    ]
    return CliRunner().invoke(app, args)


def _record(run_dir):
    return json.loads((run_dir / RECORD_FILE).read_text())


def _preempt_when(metrics, rows):
    """SIGTERM to this process once metrics.jsonl has `rows` rows (the trainer's handler turns it into
    "save and stop at the next step")."""

    def preempt():
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and not (metrics.exists() and len(metrics.read_text().splitlines()) >= rows):
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGTERM)

    thread = threading.Thread(target=preempt, daemon=True)
    thread.start()
    return thread


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """Data shards and a run directory that SIGTERM stopped after a few steps (of 1000), with its
    checkpoint: the PREEMPTED row, and the starting point of the other quick tests."""
    root = tmp_path_factory.mktemp("exit_status")
    _write_shards(root / "data")
    thread = _preempt_when(root / "run" / "metrics.jsonl", 2)
    out = _train(root / "run", root / "data", "trainer.max_steps=1000")
    thread.join()
    return root, out


def _copy(base, tmp_path):
    root, _ = base
    shutil.copytree(root / "run", tmp_path / "run")
    shutil.copytree(root / "data", tmp_path / "data")
    return tmp_path / "run"


def test_a_changed_shard_is_a_user_error(base, tmp_path):
    run = _copy(base, tmp_path)
    with open(tmp_path / "data" / "part-1.npy", "ab") as f:  # one more instance in a shard
        f.write(np.zeros(SEQ, np.uint16).tobytes())
    metrics = (run / "metrics.jsonl").read_text()
    out = _train(run, tmp_path / "data", "trainer.max_steps=1000")
    assert out.exit_code == ExitStatus.USER_ERROR == 2, out.output
    assert (
        "train error (user, config or data error: fix the input): the data differs from the checkpoint's" in out.output
    )
    assert "part-1.npy: 5120 -> 5248 bytes" in out.output and "--allow-data-change" in out.output
    assert "Traceback" not in out.output
    assert _record(run)["name"] == "USER_ERROR"
    assert complete_steps(run / "checkpoints") == complete_steps(base[0] / "run" / "checkpoints")
    assert (run / "metrics.jsonl").read_text() == metrics  # nothing in the run directory changed


@pytest.fixture
def server(tmp_path):
    srv = RangeServer(tmp_path / "data")
    thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()
    thread.join(timeout=5)


def test_a_failing_remote_server_is_transient(base, tmp_path, server):
    run = _copy(base, tmp_path)
    server.fail.add("part-1.npy")  # 500 on every request for it
    out = _train(run, server.base, "trainer.max_steps=1000")
    assert out.exit_code == ExitStatus.TRANSIENT == 75, out.output
    assert (
        f"train error (transient storage or remote error): data file {server.base}/part-1.npy cannot be read"
        in out.output
    )
    assert "500" in out.output and _record(run)["name"] == "TRANSIENT"
    # a missing file is the user's to fix, not a retry
    server.fail.clear()
    (tmp_path / "data" / "part-1.npy").unlink()
    out = _train(run, server.base, "trainer.max_steps=1000")
    assert out.exit_code == 2 and f"data file {server.base}/part-1.npy does not exist" in out.output


def test_sigterm_saves_and_exits_preempted(base):
    root, out = base
    assert out.exit_code == ExitStatus.PREEMPTED == 143, out.output
    metrics = root / "run" / "metrics.jsonl"
    last = json.loads(metrics.read_text().splitlines()[-1])["step"]
    assert 2 <= last < 1000 and complete_steps(root / "run" / "checkpoints")[-1] == last  # saved on SIGTERM
    assert f"preempted (SIGTERM): saved step {last} of 1000; rerun to resume" in out.output
    assert _record(root / "run") | {"time": None} == {
        "status": 143,
        "name": "PREEMPTED",
        "time": None,
        "message": f"stopped after step {last} of 1000",
    }


# ---- under resume-until-done: the launcher's decisions on real trainers --------------------------------


def _launch(run, data_root, *extra, max_retries=3):
    from olmax.launch.backends import make_backend
    from olmax.launch.plan import make_plan
    from olmax.launch.resume import RetryPolicy, resume_until_done

    overrides = [*SMALL, f"data.work_dir={run.parent / 'cache'}", *_data([f"{data_root}/{n}" for n in SHARDS]), *extra]
    plan = make_plan("tiny", overrides, str(run), 8)
    lines = []
    status = resume_until_done(
        make_backend("local", plan, os.environ),
        plan,
        RetryPolicy(max_retries, 0.0),
        complete_steps=complete_steps,
        echo=lines.append,
    )
    return status, lines, json.loads((run / "launch_state.json").read_text())


@pytest.mark.slow  # ~2 min: two trainer subprocesses
def test_resume_until_done_retries_a_flaky_server_and_finishes(tmp_path, server):
    """Once the step-3 checkpoint is committed the server answers 500 to every request for 5 s, then
    recovers: the trainer fails on a batch read from that window (the loader reads a few batches
    ahead, hence 12 steps), attempt 1 ends TRANSIENT, attempt 2 (which starts after the window)
    resumes and finishes; metrics.jsonl has steps 1..12 once each."""
    _write_shards(tmp_path / "data")
    run = tmp_path / "run"

    class FailForAWhile:
        until, failed = None, 0

        def __contains__(self, name):
            now = time.monotonic()
            if self.until is None and (run / "checkpoints" / "3").is_dir():
                self.until = now + 5
            if self.until is not None and now < self.until:
                self.failed += 1
                return True
            return False

    server.fail = FailForAWhile()
    status, lines, state = _launch(run, server.base, "trainer.max_steps=12")
    shown = "\n".join(lines)
    assert status == 0 and server.fail.failed > 0, shown
    assert "attempt 1 ended: exit status 75, TRANSIENT (the trainer: RemoteReadError" in shown, shown
    assert "attempt 2 ended: exit status 0, DONE" in shown, shown
    assert (state["attempts"], state["retries"], state["last_failure"]["name"]) == (2, 1, "TRANSIENT")
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(1, 13))


@pytest.mark.slow  # ~1 min: trainer subprocesses
def test_resume_until_done_stops_on_a_changed_shard_and_resubmits_a_preemption(tmp_path):
    _write_shards(tmp_path / "data")
    run = tmp_path / "run"
    # a preemption is resubmitted even with no retries allowed
    metrics = run / "metrics.jsonl"

    def preempt():
        while not (metrics.exists() and len(metrics.read_text().splitlines()) >= 2):
            time.sleep(0.05)
        pid = json.loads((run / "launch.lock").read_text())["child_pid"]
        os.kill(pid, signal.SIGTERM)

    thread = threading.Thread(target=preempt, daemon=True)
    thread.start()
    status, lines, state = _launch(run, tmp_path / "data", "trainer.max_steps=9", max_retries=0)
    thread.join()
    assert status == 0, "\n".join(lines)
    assert any("attempt 1 ended: exit status 143, PREEMPTED" in line for line in lines), lines
    assert (state["attempts"], state["preemptions"]) == (2, 1)
    # a changed shard: one attempt, not retried, the launcher exits 2
    with open(tmp_path / "data" / "part-0.npy", "ab") as f:
        f.write(np.zeros(SEQ, np.uint16).tobytes())
    status, lines, state = _launch(run, tmp_path / "data", "trainer.max_steps=12")
    assert status == 2, "\n".join(lines)
    assert any("USER_ERROR (the trainer: DataStateError: the data differs" in line for line in lines), lines
    assert lines[-1].endswith(
        "USER_ERROR is never retried: user, config or data error: fix the input (see the attempt log), then rerun"
    )
    assert state["attempts"] == 3 and not (run / "launch" / "attempt-4.log").exists()
