"""Running a backend's commands: once (`olmax launch`), or until the run is done (resume-until-done).

resume-until-done, in order:
1. take RUN_DIR/launch.lock (refused while another launcher holds it: see RunLock);
2. read the newest complete checkpoint (the caller's `complete_steps`: Orbax's list of committed
   steps, the ones the trainer resumes from) in the run's checkpoint directory (checkpoint.dir, which
   may be a gs:// URL, else RUN_DIR/checkpoints); stop with success once it is the final step
   (trainer.max_steps, or --stop-at);
3. otherwise run one attempt (the backend's commands: the trainer, `sbatch --wait`, or xpk create +
   wait), which resumes from that checkpoint by itself, then go to 2;
4. the attempt's outcome decides (olmax.launch.outcome: a job the scheduler reports cancelled on
   purpose, scancel or a deleted xpk workload, is never resubmitted and the launcher exits 143;
   else the row of the exit-status table, olmax.rundir.exits, from the trainer's RUN_DIR/exit_status.json,
   else from the backend's reading of the job): USER_ERROR is never retried; CRASHED and TRANSIENT
   without a newer complete checkpoint count as failed retries, and after `max_retries` of them in a
   row the launcher gives up; PREEMPTED is resubmitted without counting; an attempt that saved
   progress resets the count (a long run is preempted many times). Before every resubmission it waits
   `backoff_s`. RUN_DIR/launch_state.json keeps the attempts, retries and the last failure.

Every event goes to stdout and RUN_DIR/launch.log; attempt N's output to RUN_DIR/launch/attempt-N.log
(for a gs:// run directory, these and the lock are in a local directory instead: launch_dir).
SIGTERM or Ctrl-C to the launcher is passed on to the running command (the trainer saves and exits)
and ends the loop without resubmitting.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Optional, TextIO

from olmax.errors import LaunchError
from olmax.launch.env import RETRY_VARS, positive_int, read_env
from olmax.launch.outcome import CANCELLED, Ended, attempt_outcome
from olmax.launch.plan import Command, LaunchPlan
from olmax.rundir.exits import RECORD_FILE, ExitStatus
from olmax.rundir.paths import clean, is_url, read_text, remove, write_text
from olmax.rundir.progress import run_checkpoint_dir

LOCK_FILE, LOG_FILE, ATTEMPT_DIR = "launch.lock", "launch.log", "launch"


@dataclass(frozen=True)
class RetryPolicy:
    max_retries: int = 10  # failed attempts in a row (no new checkpoint) before giving up
    backoff_s: float = 300.0  # wait before each resubmission


def retry_policy(
    environ: Mapping[str, str], max_retries: Optional[int] = None, backoff_s: Optional[float] = None
) -> RetryPolicy:
    """The options if given, else OLMAX_MAX_RETRIES / OLMAX_RETRY_BACKOFF_SECONDS, else the defaults."""
    env = read_env(RETRY_VARS, environ, "resume-until-done")
    if max_retries is None:
        max_retries = positive_int(env, "OLMAX_MAX_RETRIES", allow_zero=True)
    if backoff_s is None:
        backoff_s = positive_int(env, "OLMAX_RETRY_BACKOFF_SECONDS", allow_zero=True)
    if max_retries < 0 or backoff_s < 0:
        raise LaunchError(f"--max-retries ({max_retries}) and --retry-backoff ({backoff_s}) must be >= 0")
    return RetryPolicy(max_retries, float(backoff_s))


class LaunchLog:
    """Timestamped lines to stdout and RUN_DIR/launch.log (appended: one file across launchers)."""

    def __init__(self, run_dir: Path, echo: Callable[[str], None] = print):
        run_dir.mkdir(parents=True, exist_ok=True)
        self._file: TextIO = open(run_dir / LOG_FILE, "a")
        self._echo = echo

    def __call__(self, message: str) -> None:
        line = f"{time.strftime('%Y-%m-%d %H:%M:%S')} {message}"
        self._file.write(line + "\n")
        self._file.flush()
        self._echo(line)

    def close(self) -> None:
        self._file.close()


class RunLock:
    """RUN_DIR/launch.lock, JSON {pid, host, child_pid}: one launcher per run directory.

    Created with O_EXCL, so of two launchers starting at once exactly one gets it. A lock left by a
    launcher that died (kill -9, a crash) is stale when its host is this host and neither its pid
    nor its current child (the trainer, sbatch or xpk it was running) is alive: it is then taken
    over, with a log line. A lock from another host cannot be checked and is always refused.
    """

    def __init__(self, run_dir: Path, log: Callable[[str], None]):
        self.path, self._log = run_dir / LOCK_FILE, log
        self._held = False

    def __enter__(self) -> "RunLock":
        for _ in range(2):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                self._take_over_if_stale()
                continue
            with os.fdopen(fd, "w") as f:
                json.dump(self._record(None), f)
            self._held = True
            return self
        raise LaunchError(f"{self.path} was taken by another launcher just now")

    def set_child(self, pid: Optional[int]) -> None:
        tmp = self.path.with_name(LOCK_FILE + ".tmp")
        tmp.write_text(json.dumps(self._record(pid)))
        os.replace(tmp, self.path)

    def __exit__(self, *exc) -> None:
        if self._held:
            self.path.unlink(missing_ok=True)

    @staticmethod
    def _record(child: Optional[int]) -> dict:
        return {"pid": os.getpid(), "host": socket.gethostname(), "child_pid": child}

    def _take_over_if_stale(self) -> None:
        try:
            holder = json.loads(self.path.read_text())
        except FileNotFoundError:  # released meanwhile: try again
            return
        except json.JSONDecodeError:
            raise LaunchError(
                f"{self.path} is not a launcher lock (not JSON); if no launcher runs for this run directory, delete it"
            ) from None
        running = [p for p in (holder.get("pid"), holder.get("child_pid")) if p and _alive(p)]
        if holder.get("host") != socket.gethostname() or running:
            raise LaunchError(
                f"run directory {self.path.parent} is being launched by pid {holder.get('pid')} on host "
                f"{holder.get('host')} (lock {self.path}); not starting a second copy. If that launcher "
                "is gone and its job has ended, delete the lock file"
            )
        self._log(
            f"removing the stale lock {self.path} of pid {holder.get('pid')} (neither it nor its child "
            f"{holder.get('child_pid')} is running)"
        )
        self.path.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    # a zombie (exited, not yet reaped by its parent) no longer runs
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[-1][:1] != "Z"
    except OSError:
        return True


class _Runner:
    """Runs commands one at a time; remembers the current child so a signal can be passed on."""

    def __init__(self, lock: Optional[RunLock] = None):
        self.lock, self.child = lock, None
        self.stopping = threading.Event()

    def run(self, command: Command, output: Optional[TextIO]) -> int:
        redirect = {} if output is None else {"stdout": output, "stderr": subprocess.STDOUT}
        self.child = subprocess.Popen(command.argv, env={**os.environ, **command.env}, **redirect)
        if self.lock is not None:
            self.lock.set_child(self.child.pid)
        try:
            return self.child.wait()
        finally:
            self.child = None
            if self.lock is not None:
                self.lock.set_child(None)

    @contextlib.contextmanager
    def forwarding_signals(self):
        """While active, SIGTERM and SIGINT to the launcher become SIGTERM to the running command (the
        trainer's preemption notice: it saves at the next step boundary and exits) and stop the loop."""

        def forward(signum, frame):
            self.stopping.set()
            if self.child is not None:
                self.child.send_signal(signal.SIGTERM)

        if threading.current_thread() is not threading.main_thread():  # only there can handlers be set
            yield
            return
        previous = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            yield
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)


def _write_files(files: dict[str, str], log: Callable[[str], None]) -> None:
    for path, content in files.items():
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(content)
        log(f"wrote {path}")


def launch_once(backend, plan: LaunchPlan, *, hold_lock: bool, echo: Callable[[str], None] = print) -> int:
    """Run the backend's launch commands in the foreground (output to this terminal); the exit status
    of the first that fails, else 0. `hold_lock` (local): hold RUN_DIR/launch.lock while they run.
    Nothing else is written to the run directory, which for xpk need not exist here."""
    echo(f"{backend.name}: {plan.layout.describe()}")
    _write_files(backend.files(), echo)
    lock = None
    if hold_lock:
        where = launch_dir(plan.run_dir)
        where.mkdir(parents=True, exist_ok=True)
        lock = RunLock(where, echo)
    runner = _Runner(lock)
    with lock if lock is not None else contextlib.nullcontext(), runner.forwarding_signals():
        for command in backend.launch_steps():
            echo(f"running: {command.shell()}")
            status = runner.run(command, None)
            if status != 0 and not command.may_fail:
                echo(f"exit status {status}: {command.argv[0]}")
                return status
    return 0


def resume_until_done(
    backend,
    plan: LaunchPlan,
    policy: RetryPolicy,
    *,
    complete_steps: Callable[[str], list[int]],
    sleep: Optional[Callable[[float], object]] = None,
    echo: Callable[[str], None] = print,
) -> int:
    """Attempts until the run's newest complete checkpoint is its final step (module docstring).
    Returns DONE (0), USER_ERROR (2) when an attempt ended so, the last failure's status (CRASHED 1 or
    TRANSIENT 75) when out of retries, PREEMPTED (143) when stopped by a signal or when the scheduler
    reports the job cancelled on purpose (olmax.rundir.exits, olmax.launch.outcome).
    `complete_steps`: the complete steps of a checkpoint directory (olmax.checkpoint.store.complete_steps,
    Orbax's list; the launcher itself imports no jax or Orbax).
    `sleep`: waits out the backoff (default: a wait that a signal to the launcher cuts short)."""
    run_dir = launch_dir(plan.run_dir)
    ckpt_dir = run_checkpoint_dir(plan.resolve(), plan.run_dir)
    log = LaunchLog(run_dir, echo)
    newest = lambda: max(complete_steps(ckpt_dir), default=0)
    try:
        with RunLock(run_dir, log) as lock:
            runner = _Runner(lock)
            with runner.forwarding_signals():
                return _attempts(backend, plan, policy, runner, log, newest, sleep or runner.stopping.wait, run_dir)
    finally:
        log.close()


def _final_name(plan: LaunchPlan) -> str:
    final = plan.final()
    return "the end of the data's epochs (trainer.max_steps=null, not yet counted)" if final is None else str(final)


def _attempts(backend, plan, policy, runner: _Runner, log, newest, sleep, local: Path) -> int:
    """The loop; `local`: where the lock, the launch log and the attempt logs are (launch_dir)."""
    log(
        f"resume-until-done, {backend.name}: {plan.layout.describe()}; final step {_final_name(plan)}; "
        f"max retries {policy.max_retries}, backoff {policy.backoff_s:g} s"
    )
    state = LaunchState.load(plan.run_dir)
    attempt, failures, last_failure = 0, 0, ExitStatus.CRASHED
    outcome = None  # the previous attempt's, once there is one
    step = newest()
    while True:
        final = plan.final()
        if final is not None and step >= final:
            log(f"done: complete checkpoint at step {step} (final step {final}) after {attempt} attempt(s)")
            return ExitStatus.DONE
        if failures > policy.max_retries:
            log(
                f"giving up: {failures} attempts in a row ended without a new checkpoint (max retries "
                f"{policy.max_retries}); newest complete checkpoint: step {step}"
            )
            return last_failure
        if outcome is not None:
            log(f"resubmitting in {policy.backoff_s:g} s")
            state.retrying(preempted=outcome.status is ExitStatus.PREEMPTED)
            sleep(policy.backoff_s)
            if runner.stopping.is_set():
                return _stopped(log, step)
        attempt += 1
        remove(plan.run_dir, RECORD_FILE)  # what the trainer of this attempt writes, if it gets to
        ended = _run_attempt(backend, attempt, step, runner, log, local)
        if runner.stopping.is_set():
            return _stopped(log, newest())
        outcome = attempt_outcome(backend, ended, plan.run_dir)
        before, step = step, newest()
        log(
            f"attempt {attempt} ended: exit status {ended.code}, {outcome.name} ({outcome.why}); "
            f"newest complete checkpoint: step {step}"
        )
        state.ended(outcome.status, ended.code, outcome.why, step, cancelled=outcome.cancelled)
        if outcome.cancelled:
            log(
                f"cancelled on purpose through the scheduler: not resubmitting. Newest complete checkpoint: "
                f"step {step}; rerun to continue from it"
            )
            return outcome.status  # PREEMPTED (143), as when a signal stops the launcher itself
        if not outcome.retried:
            log(f"{outcome.name} is never retried: {outcome.status.meaning} (see the attempt log), then rerun")
            return outcome.status
        if step > before:
            failures = 0  # progress: a long run on preemptible machines is interrupted many times
        elif outcome.status.counted or outcome.status is ExitStatus.DONE:  # DONE without the final checkpoint
            failures += 1
            last_failure = outcome.status if outcome.status.counted else ExitStatus.CRASHED


def launch_dir(run_dir: str) -> Path:
    """Where the launcher keeps its lock, its log and the attempts' output: the run directory, or for a
    gs:// run directory (objects cannot be locked or appended to) a local directory,
    $OLMAX_LAUNCH_DIR/<bucket>/<path> (default ~/.cache/olmax/launch/...). Its state
    (launch_state.json) and the trainer's exit record are in the run directory either way."""
    if not is_url(run_dir):
        return Path(run_dir)
    chosen = read_env(RETRY_VARS, os.environ, "resume-until-done")["OLMAX_LAUNCH_DIR"]
    base = Path(chosen or Path.home() / ".cache" / "olmax" / "launch")
    return base / clean(run_dir).split("://", 1)[1]


class LaunchState:
    """RUN_DIR/launch_state.json, what `olmax status` shows of the launcher: attempts and retries so
    far (over every launcher of the run directory), the preemptions among them, and the last
    failure's status. Rewritten whole after each attempt."""

    FILE = "launch_state.json"

    def __init__(self, run_dir: str, data: dict):
        self.run_dir, self.data = run_dir, data

    @classmethod
    def load(cls, run_dir: str) -> "LaunchState":
        text = read_text(run_dir, cls.FILE)
        try:
            data = json.loads(text) if text else {}
        except json.JSONDecodeError:
            data = {}
        return cls(run_dir, {"attempts": 0, "retries": 0, "preemptions": 0, "last_failure": None, **data})

    def ended(self, status: ExitStatus, code: int, why: str, step: int, *, cancelled: bool = False) -> None:
        """An attempt ended with row `status`; `cancelled`: stopped on purpose (olmax.launch.outcome)."""
        self.data["attempts"] += 1
        self.data["last_attempt"] = {
            "status": int(status),
            "name": CANCELLED if cancelled else status.name,
            "exit_code": code,
            "why": why,
            "newest_checkpoint": step,
            "time": time.strftime("%Y-%m-%d %H:%M:%S"),
        }
        if cancelled or status is not ExitStatus.DONE:
            self.data["last_failure"] = self.data["last_attempt"]
        self._write()

    def retrying(self, preempted: bool) -> None:
        self.data["retries"] += 1
        self.data["preemptions"] += int(preempted)
        self._write()

    def _write(self) -> None:
        write_text(self.run_dir, self.FILE, json.dumps(self.data, indent=1) + "\n")


def _run_attempt(backend, attempt: int, step: int, runner: _Runner, log, run_dir: Path) -> Ended:
    """The backend's commands of this attempt, until one fails (a clean-up step may) or a signal."""
    out_path = run_dir / ATTEMPT_DIR / f"attempt-{attempt}.log"
    out_path.parent.mkdir(parents=True, exist_ok=True)
    log(f"attempt {attempt}: from step {step}; output in {out_path}")
    _write_files(backend.files(), log)
    with open(out_path, "a") as out:
        for command in backend.attempt_steps(attempt):
            log(f"attempt {attempt}: running {command.shell()}")
            status = runner.run(command, out)
            if (status != 0 and not command.may_fail) or runner.stopping.is_set():
                break
    return Ended(attempt, status, command, out_path)


def _stopped(log, step: int) -> int:
    log(f"stopped by a signal; not resubmitting. Newest complete checkpoint: step {step}")
    return ExitStatus.PREEMPTED  # as a shell reports a process ended by SIGTERM
