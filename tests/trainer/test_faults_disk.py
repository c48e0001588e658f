"""Disk full or no permission while saving: the save fails with a CheckpointWriteError (exit status
TRANSIENT) naming the checkpoint directory and the step, and the previous complete checkpoint stays the
one a rerun resumes from, bit for bit. A bug in what is saved is no storage failure: it propagates as
itself (exit status CRASHED). Which errors of the storage libraries count as storage failures is
checked on errors tensorstore itself raises."""

import errno
import os
import subprocess
import sys

import jax
import numpy as np
import pytest
from etils import epath
from small_run import SMALL as BASE

from olmax.checkpoint.store import (
    CheckpointError,
    CheckpointWriteError,
    RunCheckpoints,
    complete_steps,
    storage_failure,
)
from olmax.config.io import apply_overrides
from olmax.config.recipes import get_recipe
from olmax.model.sharding import make_mesh
from olmax.rundir.exits import ExitStatus
from olmax.step.state import abstract_state, init_train_state
from olmax.trainer.failures import status_of

SMALL = BASE + ["eval.every=0"]
# The tests that save a fresh state never run the model: a 1,024-token output layer instead of dolma2's
# 100k keeps each state they initialise, write and read back some 60 times smaller.
SAVED = SMALL + ["model.vocab_size=1024"]


def _state(cfg, mesh, seed):
    return init_train_state(cfg, mesh, jax.random.key(seed))


def test_disk_full_during_save_names_the_directory_and_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    cfg = apply_overrides(get_recipe("tiny"), SAVED)
    mesh = make_mesh(cfg.mesh)
    directory = tmp_path / "checkpoints"
    ckpts = RunCheckpoints(directory, cfg)
    first = _state(cfg, mesh, 1)
    expected = jax.tree.map(np.asarray, first.params)
    ckpts.save(3, first, {"batches": 3}, mesh)
    ckpts.close()  # step 3 is complete
    ckpts = RunCheckpoints(directory, cfg)

    # Every file Orbax writes through Python (JSON items, metadata) now fails as on a full disk;
    # tensorstore's array writes go through C++ (the slow test below fails those for real).
    def full(path, *args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

    path_type = type(epath.Path(tmp_path))
    monkeypatch.setattr(path_type, "write_text", full)
    monkeypatch.setattr(path_type, "write_bytes", full)
    with pytest.raises(CheckpointError) as failed:
        ckpts.save(6, _state(cfg, mesh, 2), {"batches": 6}, mesh)
        ckpts.close()
    ckpts.close()  # a second close (train's `finally`) releases the manager without raising again
    assert isinstance(failed.value, CheckpointWriteError) and status_of(failed.value) is ExitStatus.TRANSIENT
    message = str(failed.value)
    assert f"writing checkpoint step 6 to {directory} failed" in message, message
    assert "No space left on device" in message and "(step 3) is untouched" in message, message
    monkeypatch.undo()

    assert complete_steps(directory) == [3]
    state, data = RunCheckpoints(directory, cfg).restore_latest(abstract_state(cfg, mesh))
    assert int(state.step) == 0 and data == {"batches": 3}  # init state: step counter 0, saved as step 3
    for a, b in zip(jax.tree.leaves(expected), jax.tree.leaves(state.params)):
        np.testing.assert_array_equal(a, np.asarray(b))


def test_a_bug_in_what_is_saved_is_no_storage_failure(tmp_path):
    cfg = apply_overrides(get_recipe("tiny"), SAVED)
    mesh = make_mesh(cfg.mesh)
    directory = tmp_path / "checkpoints"
    ckpts = RunCheckpoints(directory, cfg)
    state = _state(cfg, mesh, 1)
    ckpts.save(3, state, {"batches": 3}, mesh)
    # a data-loader state that JSON cannot hold: json's own TypeError, raised from inside Orbax's save
    with pytest.raises(TypeError, match="not JSON serializable") as failed:
        ckpts.save(6, state, {"batches": 6, "reader": object()}, mesh)
        ckpts.close()
    ckpts.close()  # train's `finally`: releases the manager without raising the bug a second time
    assert not isinstance(failed.value, CheckpointError), failed.value
    assert status_of(failed.value) is ExitStatus.CRASHED
    assert f"(while writing checkpoint step 6 to {directory})" in failed.value.__notes__
    assert complete_steps(directory) == [3]


def test_storage_failures_are_told_from_bugs(tmp_path):
    import tensorstore as ts

    def zarr(path, **open_args):
        spec = {"driver": "zarr", "kvstore": {"driver": "file", "path": str(path)}}
        return ts.open(spec, shape=[4], **open_args).result()

    (tmp_path / "a_file").write_text("")
    # tensorstore's own errors: a failed system call (ENOTDIR; FAILED_PRECONDITION with its errno) ...
    with pytest.raises(ValueError) as io:
        zarr(tmp_path / "a_file" / "array", create=True, dtype=ts.float32)
    assert str(io.value).startswith("FAILED_PRECONDITION") and "os_error_code='20'" in str(io.value), io.value
    assert storage_failure(io.value)
    # ... and wrong requests: a write of the wrong shape (INVALID_ARGUMENT, raised without its code),
    # a dtype the stored array does not have (FAILED_PRECONDITION, no errno)
    with pytest.raises(ValueError, match="mismatch") as wrong_shape:
        zarr(tmp_path / "ok", create=True, dtype=ts.float32).write(np.zeros(5, np.float32)).result()
    assert not storage_failure(wrong_shape.value)
    with pytest.raises(ValueError, match="dtype") as wrong_dtype:
        zarr(tmp_path / "ok", open=True, dtype=ts.int32)
    assert str(wrong_dtype.value).startswith("FAILED_PRECONDITION") and not storage_failure(wrong_dtype.value)
    # OSError and its subclasses (a full disk, a timeout, a dropped connection), also as a cause
    for exc in (OSError(errno.ENOSPC, "full"), TimeoutError(), ConnectionResetError(), PermissionError()):
        assert storage_failure(exc) and storage_failure(_raised_from(RuntimeError("wrapped"), exc))
    # the remote stores' own I/O errors, as the installed gcsfs and aiohttp raise them
    from aiohttp import ServerDisconnectedError
    from gcsfs.retry import HttpError

    assert storage_failure(HttpError({"code": 503, "message": "Service Unavailable"}))
    assert storage_failure(ServerDisconnectedError())
    for bug in (TypeError("unsupported operand"), KeyError("params"), ValueError("shapes (3,) and (4,)")):
        assert not storage_failure(bug) and not storage_failure(_raised_from(RuntimeError("wrapped"), bug))


def _raised_from(exc, cause):
    exc.__cause__ = cause
    return exc


# A trainer whose array files may not grow past 200 kB (RLIMIT_FSIZE): the kernel refuses the write
# (EFBIG) inside tensorstore, as a full disk refuses it with ENOSPC.
LIMITED_TRAINER = """
import resource, signal, sys
from olmax.cli import main
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # report the failed write instead of dying of the signal
resource.setrlimit(resource.RLIMIT_FSIZE, (200_000, resource.RLIM_INFINITY))
sys.argv = ["olmax", "train", "--recipe", "tiny", "--run-dir", *sys.argv[1:]]
main()
"""


@pytest.mark.slow  # ~50 s on 2 cores: a run to step 3, then a subprocess whose save of step 6 fails
def test_failed_array_write_stops_the_run_and_resume_reproduces_it(tmp_path):
    from olmax.trainer.run import train

    overrides = SMALL + [f"data.work_dir={tmp_path / 'cache'}"]
    cfg = apply_overrides(get_recipe("tiny"), overrides)
    train(cfg, tmp_path / "r", stop_at=3, progress=False)
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=8"}
    proc = subprocess.run(
        [sys.executable, "-c", LIMITED_TRAINER, str(tmp_path / "r"), *overrides],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 75, proc.stderr[-3000:]  # TRANSIENT, not 2 (fix the input): a launcher retries it
    # the error line (Orbax's threads print "Event loop is closed" noise after it at exit)
    label = "train error (transient storage or remote error): "
    # (stripped: the progress bar's carriage-return writes can share the error's line in the capture)
    errors = [line.strip() for line in proc.stderr.splitlines() if line.strip().startswith(label)]
    ckpts = tmp_path / "r" / "checkpoints"
    assert len(errors) == 1, "\n".join(line for line in proc.stderr.splitlines() if "error" in line)[-3000:]
    assert errors[0].startswith(f"{label}writing checkpoint step 6 to {ckpts} failed")
    assert "File too large" in errors[0] and "(step 3) is untouched" in errors[0], errors[0]
    assert complete_steps(ckpts) == [3]
    # the rerun resumes from step 3 and logs what an uninterrupted run logs
    resumed = train(cfg, tmp_path / "r", progress=False)
    straight = train(cfg, tmp_path / "s", progress=False)
    keys = ["train/CE loss", "optim/total grad norm", "optim/LR"]
    assert [r["step"] for r in resumed] == [4, 5, 6]
    assert [{k: r[k] for k in keys} for r in resumed] == [{k: r[k] for k in keys} for r in straight[3:]]
