"""How a trainer ends: the row of the exit-status table (olmax.rundir.exits) an exception that ended
`olmax train` falls in, and the record process 0 leaves for the launcher and `olmax status`."""

from __future__ import annotations

from pathlib import Path

import jax

from olmax.checkpoint.store import CheckpointError, CheckpointWriteError
from olmax.convert.tensors import ConversionError
from olmax.data.loader import DataStateError
from olmax.data.order import OrderError
from olmax.data.sources import DataSourceError, RemoteReadError
from olmax.data.tokenize import TokenizeError
from olmax.data.tokenizer import TokenizerError
from olmax.errors import ConfigError
from olmax.rundir import paths
from olmax.rundir.exits import RECORD_FILE, ExitStatus, write_record

# Storage or a remote server failed: rerunning may succeed.
TRANSIENT_ERRORS = (CheckpointWriteError, RemoteReadError, ConnectionError, TimeoutError)
# The input needs fixing: a config typo, a wrong path, a changed data fingerprint, a checkpoint that
# does not fit. Never retried.
USER_ERRORS = (
    ConfigError,
    CheckpointError,
    ConversionError,
    DataStateError,
    DataSourceError,
    OrderError,
    TokenizeError,
    TokenizerError,
)


def status_of(exc: BaseException) -> ExitStatus:
    """The row of an exception that ended `olmax train`."""
    if isinstance(exc, TRANSIENT_ERRORS):
        return ExitStatus.TRANSIENT
    if isinstance(exc, USER_ERRORS):
        return ExitStatus.USER_ERROR
    return ExitStatus.CRASHED


def record_exit(run_dir: str | Path, status: ExitStatus, message: str) -> None:
    """Process 0 writes how this trainer ended to RUN_DIR/exit_status.json (olmax.rundir.exits), for the
    launcher and `olmax status`. Best effort: the storage that failed may be the run directory's."""
    if jax.process_index() != 0:
        return
    try:
        write_record(paths.clean(run_dir), status, message)
    except Exception as e:  # noqa: BLE001 - the exit status still tells the row
        print(f"could not write {paths.join(run_dir, RECORD_FILE)}: {type(e).__name__}: {e}")
