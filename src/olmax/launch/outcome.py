"""How resume-until-done reads the end of an attempt: the trainer's own record and the scheduler's
verdict, and which of the two decides.

Two sources see an attempt end. The trainer writes its exit-status row (olmax.rundir.exits) to
RUN_DIR/exit_status.json; the backend reads what the scheduler did with the job (the child's exit
code locally, Slurm's job state, xpk's wait and whether the workload still exists). They disagree
in one case that matters: someone stopping the job on purpose (`scancel`, `xpk workload delete`)
reaches the trainer as SIGTERM, the same notice a preemption gives, so the trainer saves and records
PREEMPTED. Only the scheduler knows the stop was deliberate. Hence, in this order:

1. the scheduler says the job was cancelled on purpose: CANCELLED, never resubmitted, whatever the
   trainer recorded (the launcher exits 143, as when it is stopped by a signal itself);
2. else the trainer's record, which knows why it stopped better than any scheduler;
3. else the scheduler's reading (its own table per backend), else the exit code.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from olmax.launch.plan import Command
from olmax.rundir.exits import ExitStatus, from_returncode, read_record

CANCELLED = "CANCELLED"  # the name of an attempt stopped on purpose, in the log and launch_state.json


@dataclass(frozen=True)
class Ended:
    """How an attempt's commands ended: `code` is the exit status of `command`, the last one run
    (the first that failed, or the last of all); `log` holds their output."""

    attempt: int
    code: int
    command: Command
    log: Path


@dataclass(frozen=True)
class Outcome:
    """An attempt's row of the exit-status table and where it came from. `cancelled`: stopped on
    purpose through the scheduler; its row is PREEMPTED (the job was ended by SIGTERM) but it is
    never resubmitted."""

    status: ExitStatus
    why: str
    cancelled: bool = False

    @property
    def name(self) -> str:
        return CANCELLED if self.cancelled else self.status.name

    @property
    def retried(self) -> bool:
        return self.status.retried and not self.cancelled


def cancelled(why: str) -> Outcome:
    """A job the scheduler reports as stopped on purpose."""
    return Outcome(ExitStatus.PREEMPTED, why, cancelled=True)


def from_exit_code(code: int) -> Outcome:
    return Outcome(from_returncode(code), "exit code")


def attempt_outcome(backend, ended: Ended, run_dir: str) -> Outcome:
    """The outcome of an attempt (the module docstring's order). The scheduler's part names itself
    in `why` where it differs from the trainer's."""
    job: Outcome = backend.outcome(ended)
    record = read_record(run_dir)
    said = record and f"the trainer: {record.get('message') or record['name']}"
    if job.cancelled:
        return Outcome(job.status, f"{job.why}; {said}" if said else job.why, cancelled=True)
    if record is None:
        return job
    status = ExitStatus(record["status"])
    return Outcome(status, said if job.status is status else f"{said}; {job.why}")
