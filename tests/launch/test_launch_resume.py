"""resume-until-done's loop with a stand-in trainer (a few lines of Python that 'checkpoint' by making
the step directory Orbax lists as complete, then exit as told): resubmission, retries and backoff,
giving up, no retry on a config error, the run-directory lock, signal forwarding. The real trainer
under kill -9 is tests/trainer/test_faults_kill.py."""

import json
import os
import signal
import socket
import subprocess
import sys

import pytest

from olmax.checkpoint.store import complete_steps
from olmax.errors import LaunchError
from olmax.launch.backends import make_backend
from olmax.launch.outcome import from_exit_code
from olmax.launch.plan import Command, make_plan
from olmax.launch.resume import LOCK_FILE, RetryPolicy, RunLock, launch_once, resume_until_done, retry_policy

# argv: run_dir, attempt, then per attempt "STEP:EXIT" (STEP 0: no checkpoint; EXIT kill: SIGKILL itself;
# EXIT term: ask the launcher to stop and wait for its SIGTERM; EXIT recN: write the trainer's exit record
# with status N, then exit 1 as a scheduler that only says "failed")
FAKE_TRAINER = """
import json, os, signal, sys, time
run_dir, attempt, actions = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
step, how = actions[attempt - 1].split(":")
lock = json.load(open(os.path.join(run_dir, "launch.lock")))
assert lock["child_pid"] == os.getpid(), lock  # the launcher records its running child
if int(step):
    os.makedirs(os.path.join(run_dir, "checkpoints", step))
print("attempt", attempt, "step", step, flush=True)
if how == "kill":
    os.kill(os.getpid(), signal.SIGKILL)
if how.startswith("rec"):
    with open(os.path.join(run_dir, "exit_status.json"), "w") as f:
        json.dump({"status": int(how[3:]), "name": "?", "message": "the trainer's own words"}, f)
    sys.exit(1)
if how == "term":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    os.kill(os.getppid(), signal.SIGTERM)
    time.sleep(60)
sys.exit(int(how))
"""


class FakeBackend:
    name = "fake"

    def __init__(self, run_dir, actions):
        self.run_dir, self.actions = str(run_dir), actions

    def attempt_steps(self, attempt):
        return [Command([sys.executable, "-c", FAKE_TRAINER, self.run_dir, str(attempt), *self.actions])]

    def files(self):
        return {}

    def outcome(self, ended):
        return from_exit_code(ended.code)


def _run(tmp_path, actions, max_retries=3, final=12):
    plan = make_plan("tiny", [f"trainer.max_steps={final}"], str(tmp_path), 8)
    sleeps, lines = [], []
    status = resume_until_done(
        FakeBackend(tmp_path, actions),
        plan,
        RetryPolicy(max_retries, 7.0),
        complete_steps=complete_steps,
        sleep=sleeps.append,
        echo=lines.append,
    )
    return status, sleeps, lines


def test_resubmits_after_kill_and_failure_until_the_final_checkpoint(tmp_path):
    status, sleeps, lines = _run(tmp_path, ["4:kill", "8:1", "12:0"])
    assert status == 0 and sleeps == [7.0, 7.0]
    assert any(
        "attempt 1 ended: exit status -9, CRASHED (exit code); newest complete checkpoint: step 4" in line
        for line in lines
    )
    assert any("attempt 2: from step 4" in line for line in lines)
    assert lines[-1].endswith("done: complete checkpoint at step 12 (final step 12) after 3 attempt(s)")
    assert (tmp_path / "launch.log").read_text().splitlines()[-1] == lines[-1]
    assert "attempt 2 step 8" in (tmp_path / "launch" / "attempt-2.log").read_text()
    assert not (tmp_path / LOCK_FILE).exists()


def test_gives_up_after_max_retries_without_progress_and_progress_resets_the_count(tmp_path):
    status, sleeps, lines = _run(tmp_path, ["2:1", "0:1", "0:1", "4:1", "0:1", "0:1", "0:1"], max_retries=2)
    assert status == 1 and len(sleeps) == 6  # attempt 4 made progress, so 3 more were allowed
    assert "giving up: 3 attempts in a row ended without a new checkpoint (max retries 2)" in lines[-1]


def test_config_error_is_not_retried_and_a_done_run_is_not_resubmitted(tmp_path):
    status, sleeps, lines = _run(tmp_path / "a", ["0:2"])
    assert status == 2 and sleeps == [] and "USER_ERROR is never retried" in lines[-1]
    (tmp_path / "b" / "checkpoints" / "12").mkdir(parents=True)
    status, sleeps, lines = _run(tmp_path / "b", ["0:1"])
    assert status == 0 and not (tmp_path / "b" / "launch" / "attempt-1.log").exists()
    assert "after 0 attempt(s)" in lines[-1]


def test_sigterm_to_the_launcher_reaches_the_trainer_and_stops_the_loop(tmp_path):
    status, sleeps, lines = _run(tmp_path, ["2:term", "4:0"])
    assert status == 128 + signal.SIGTERM and sleeps == []
    assert "stopped by a signal; not resubmitting. Newest complete checkpoint: step 2" in lines[-1]
    assert not (tmp_path / "launch" / "attempt-2.log").exists()


def test_lock_refuses_a_second_launcher_and_takes_over_a_stale_one(tmp_path):
    log = []
    with RunLock(tmp_path, log.append):
        with pytest.raises(LaunchError, match="not starting a second copy"):
            _run(tmp_path, ["12:0"])
    # a launcher that was killed: its pid and its child are gone
    exited = subprocess.Popen([sys.executable, "-c", "pass"])
    exited.wait()
    dead = exited.pid
    lock = tmp_path / LOCK_FILE
    lock.write_text(json.dumps({"pid": dead, "host": socket.gethostname(), "child_pid": None}))
    status, _, lines = _run(tmp_path, ["12:0"])
    assert status == 0 and any(f"removing the stale lock {lock} of pid {dead}" in line for line in lines)
    # a live child keeps the lock (the launcher died, its trainer still runs): refused
    lock.write_text(json.dumps({"pid": dead, "host": socket.gethostname(), "child_pid": os.getpid()}))
    with pytest.raises(LaunchError, match=f"being launched by pid {dead}"):
        _run(tmp_path, ["12:0"], final=24)
    lock.write_text(json.dumps({"pid": 1, "host": "another-host", "child_pid": None}))
    with pytest.raises(LaunchError, match="on host another-host"):
        _run(tmp_path, ["12:0"], final=24)


def test_retry_policy_from_options_or_environment():
    assert retry_policy({}) == RetryPolicy(10, 300.0)
    assert retry_policy({"OLMAX_MAX_RETRIES": "3", "OLMAX_RETRY_BACKOFF_SECONDS": "0"}) == RetryPolicy(3, 0.0)
    assert retry_policy({"OLMAX_MAX_RETRIES": "3"}, max_retries=5, backoff_s=1.5) == RetryPolicy(5, 1.5)
    with pytest.raises(LaunchError, match="OLMAX_RETRY_BACKOFF_SECONDS='soon'"):
        retry_policy({"OLMAX_RETRY_BACKOFF_SECONDS": "soon"})


def test_single_local_launch_holds_the_lock_and_returns_the_trainer_status(tmp_path):
    stub = tmp_path / "python"  # stands in for OLMAX_PYTHON: checks the lock names it, exits 3
    stub.write_text(
        f"#!{sys.executable}\nimport json, os, sys\n"
        "run_dir = sys.argv[sys.argv.index('--run-dir') + 1]\n"
        "assert json.load(open(os.path.join(run_dir, 'launch.lock')))['child_pid'] == os.getpid()\n"
        "assert sys.argv[1:5] == ['-m', 'olmax.cli', 'train', '--recipe']\n"
        "sys.exit(3)\n"
    )
    stub.chmod(0o755)
    plan = make_plan("tiny", [], str(tmp_path / "r"), 8)
    lines = []
    assert (
        launch_once(make_backend("local", plan, {"OLMAX_PYTHON": str(stub)}), plan, hold_lock=True, echo=lines.append)
        == 3
    )
    assert lines[-1] == f"exit status 3: {stub}" and not (tmp_path / "r" / LOCK_FILE).exists()


def test_each_exit_status_row_decides_the_retry(tmp_path):
    """PREEMPTED (143) is resubmitted without counting, TRANSIENT (75) and CRASHED count; the state
    file keeps the tally for `olmax status`."""
    status, sleeps, lines = _run(tmp_path / "a", ["0:143", "0:143", "0:143", "0:75", "0:-9", "12:0"], max_retries=2)
    assert status == 0 and len(sleeps) == 5
    assert any("attempt 1 ended: exit status 143, PREEMPTED (exit code)" in line for line in lines)
    assert any("attempt 4 ended: exit status 75, TRANSIENT (exit code)" in line for line in lines)
    state = json.loads((tmp_path / "a" / "launch_state.json").read_text())
    assert (state["attempts"], state["retries"], state["preemptions"]) == (6, 5, 3)
    assert state["last_failure"]["name"] == "CRASHED" and state["last_attempt"]["name"] == "DONE"
    # out of retries: the launcher ends with the last failure's status
    status, sleeps, lines = _run(tmp_path / "b", ["0:75", "0:75", "0:75"], max_retries=1)
    assert status == 75 and len(sleeps) == 1 and "giving up: 2 attempts in a row" in lines[-1]


def test_the_trainers_record_wins_over_the_schedulers_verdict(tmp_path):
    """A backend that only says "failed" (exit 1): the trainer's RUN_DIR/exit_status.json tells the row."""
    status, sleeps, lines = _run(tmp_path / "a", ["0:rec2"])
    assert status == 2 and sleeps == []
    assert any("exit status 1, USER_ERROR (the trainer: the trainer's own words; exit code)" in line for line in lines)
    status, sleeps, lines = _run(tmp_path / "b", ["0:rec143", "0:rec143", "12:0"], max_retries=0)
    assert status == 0 and len(sleeps) == 2  # preemptions do not count against max_retries=0
