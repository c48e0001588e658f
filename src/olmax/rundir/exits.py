"""The exit statuses of `olmax train`, and what resume-until-done does with each: one table.

- 0 DONE: reached its last step (or --stop-at), or had nothing to do. Resume-until-done stops once
  the final checkpoint exists.
- 1 CRASHED: an unexpected exception, or killed by a signal other than SIGTERM (kill -9, OOM
  killer). Retried; counts against the retry budget.
- 2 USER_ERROR: fix the input: a config typo, a wrong path, a changed data fingerprint, a checkpoint
  that does not fit. Never retried.
- 75 TRANSIENT: storage or a remote server failed (a data read, a checkpoint write); rerunning may
  succeed. Retried; counts.
- 143 PREEMPTED: SIGTERM: saved a checkpoint at the next step boundary and stopped early. Retried;
  does not count.

75 is EX_TEMPFAIL of sysexits.h ("try again later"); 143 is how a shell reports a process ended by
SIGTERM (128 + 15), so a trainer that SIGTERM killed before it could save reads the same. Python
itself exits 1 on an uncaught exception, and typer (click) exits 2 on a usage error.

The trainer also writes its status, with the message, to RUN_DIR/exit_status.json (`write_record`),
so a launcher that only sees a scheduler's verdict (xpk: "failed") still learns which row it was.

Importable without jax: the launcher reads this table without starting a backend.
"""

from __future__ import annotations

import enum
import json
import signal
import time
from typing import Optional

RECORD_FILE = "exit_status.json"


class ExitStatus(enum.IntEnum):
    DONE = 0
    CRASHED = 1
    USER_ERROR = 2
    TRANSIENT = 75
    PREEMPTED = 128 + signal.SIGTERM

    @property
    def retried(self) -> bool:
        """Whether resume-until-done submits the run again after an attempt that ended so."""
        return self is not ExitStatus.USER_ERROR

    @property
    def counted(self) -> bool:
        """Whether such an attempt counts against the retry budget when it saved no new checkpoint."""
        return self in (ExitStatus.CRASHED, ExitStatus.TRANSIENT)

    @property
    def meaning(self) -> str:
        return _MEANING[self]


_MEANING = {
    ExitStatus.DONE: "done",
    ExitStatus.CRASHED: "crashed or killed",
    ExitStatus.USER_ERROR: "user, config or data error: fix the input",
    ExitStatus.TRANSIENT: "transient storage or remote error",
    ExitStatus.PREEMPTED: "preempted (SIGTERM)",
}


def from_returncode(code: int) -> ExitStatus:
    """The row of a process's exit code: subprocess's negative -N (killed by signal N) and a shell's
    or srun's 128 + N both count; SIGTERM is a preemption, any other signal a crash."""
    if code in (-signal.SIGTERM, ExitStatus.PREEMPTED):
        return ExitStatus.PREEMPTED
    if code in (ExitStatus.DONE, ExitStatus.USER_ERROR, ExitStatus.TRANSIENT):
        return ExitStatus(code)
    return ExitStatus.CRASHED


def write_record(run_dir: str, status: ExitStatus, message: str = "") -> None:
    """RUN_DIR/exit_status.json: {status, name, message, time}. A local path or a URL (fsspec)."""
    from olmax.rundir.paths import write_text

    write_text(
        run_dir,
        RECORD_FILE,
        json.dumps(
            {"status": int(status), "name": status.name, "message": message, "time": time.strftime("%Y-%m-%d %H:%M:%S")}
        )
        + "\n",
    )


def read_record(run_dir: str) -> Optional[dict]:
    """The record the last trainer wrote, or None (none, or not readable as one)."""
    from olmax.rundir.paths import read_text

    text = read_text(run_dir, RECORD_FILE)
    try:
        record = json.loads(text) if text is not None else None
        ExitStatus(record["status"])
    except (json.JSONDecodeError, KeyError, TypeError, ValueError):
        return None
    return record
