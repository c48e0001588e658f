"""olmax checkpoints: an Orbax `CheckpointManager` directory with one sub-directory per step.

Each step holds named items, so later items add to the same layout without changing these:

    CKPT_DIR/<step>/params   the parameter pytree (Orbax StandardSave; shapes as olmax.model.olmo3.param_specs)
    CKPT_DIR/<step>/config   the ModelConfig as a JSON dict (dataclasses.asdict)
    CKPT_DIR/<step>/meta     JSON: olmax version, where the weights came from, the source dtype

A converted checkpoint is step 0. A training run's checkpoints (`RunCheckpoints`) add opt_state,
data and experiment items (docs/checkpoints.md). Orbax only lists a step once it has been written
completely, so a half-written step is never picked up as "latest".

CKPT_DIR is a local path or a gs:// URL (`checkpoint_path`); everything here works on both.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import re
import sys
import warnings
from importlib.metadata import version
from pathlib import Path
from typing import Any, Optional

import jax
import orbax.checkpoint as ocp
from etils import epath

from olmax.config.io import from_dict
from olmax.config.model import CONTEXT_FIELDS, ModelConfig
from olmax.errors import ConfigError
from olmax.model.olmo3 import abstract_params

PARAMS, CONFIG, META = "params", "config", "meta"


class CheckpointError(ValueError):
    """A checkpoint directory that cannot be read or written as asked; the message names it."""


class CheckpointWriteError(CheckpointError):
    """A save that failed on the storage (disk full, no permission): unlike the other checkpoint
    errors, rerunning once the storage is fixed succeeds, so launchers retry it."""


def olmax_version() -> str:
    return version("olmax")


def checkpoint_path(directory: str | os.PathLike) -> Path | epath.Path:
    """The path object to read and write checkpoint `directory` with: for a URL (gs://bucket/dir) an
    `etils.epath.Path`, which reaches the store through fsspec (gcsfs), as Orbax does; otherwise the
    absolute local Path (Orbax wants absolute paths; a URL must never be made absolute)."""
    text = os.fspath(directory)
    if "://" in text:
        return epath.Path(text)
    if re.match(r"^[a-z][a-z0-9+.-]*:/[^/]", text):  # what pathlib.Path makes of "gs://b/x"
        raise CheckpointError(
            f"checkpoint directory {text} looks like a URL that lost a '/' (pathlib.Path "
            f"turns 'gs://b/x' into 'gs:/b/x'); pass the URL as a string"
        )
    return Path(text).absolute()


def _is_gcs(path: Path | epath.Path) -> bool:
    """Whether Orbax writes `path` the GCS way: with no atomic rename there, a step is written in place
    and marked complete by `<step>/commit_success.txt`, written last (Orbax's CommitFileTemporaryPath)."""
    return path.as_posix().startswith("gs://")


# `save_params` / `load_params` move a whole model through host memory. Orbax buffers the (compressed)
# chunks of every array in flight; left unbounded that is most of one more copy of the model
# (docs/conversion.md, "Streaming and memory"). Bounding the bytes in flight keeps the peak at the
# parameters + ~1 GB + the largest array, so converting the 7B stays near 1.2x its size. Orbax
# refuses an array larger than the bound ("Requested more bytes than we reserved space for"), so the
# bound grows to the largest array (the 7B's stacked MLP weights are 5.8 GB each).
PARAMS_CONCURRENT_GB = 1


def _concurrent_gb(tree) -> int:
    """The in-flight bound for `tree` (arrays or ShapeDtypeStructs): 1 GB, or the largest array in
    float32 (what a checkpoint may hold whatever dtype is asked for), in Orbax's units of 1e9 bytes."""
    largest = max((math.prod(x.shape) * 4 for x in jax.tree.leaves(tree)), default=0)
    return max(PARAMS_CONCURRENT_GB, math.ceil(largest / 1e9))


def _handlers(concurrent_gb: Optional[int] = None) -> dict[str, ocp.CheckpointHandler]:
    params = (
        ocp.StandardCheckpointHandler()
        if concurrent_gb is None
        else ocp.StandardCheckpointHandler(save_concurrent_gb=concurrent_gb, restore_concurrent_gb=concurrent_gb)
    )
    return {PARAMS: params, CONFIG: ocp.JsonCheckpointHandler(), META: ocp.JsonCheckpointHandler()}


def _manager(
    path: Path | epath.Path, *, create: bool, concurrent_gb: int = PARAMS_CONCURRENT_GB
) -> ocp.CheckpointManager:
    # A run checkpoint's other items are registered too, so that reading only the parameters of one
    # does not warn about each item it leaves alone.
    return ocp.CheckpointManager(
        path,
        item_handlers={**run_handlers(), **_handlers(concurrent_gb)},
        options=ocp.CheckpointManagerOptions(create=create),
    )


def save_params(
    directory: str | os.PathLike, params: dict, model_cfg: ModelConfig, meta: dict, *, step: int = 0
) -> Path | epath.Path:
    """Write `params` (jax arrays, any sharding; numpy works but Orbax then makes a full extra copy),
    the model config and `meta` as `step` of `directory` (a local path or a gs:// URL).

    `meta` gets `olmax_version` added. Refuses to overwrite an existing step. Returns `checkpoint_path(directory)`.
    """
    path = checkpoint_path(directory)
    _check_shapes(_flat_shapes(params), model_cfg, f"the parameters to save in {directory}")
    mngr = _manager(path, create=True, concurrent_gb=_concurrent_gb(params))
    try:
        if step in mngr.all_steps():
            raise CheckpointError(f"{directory} already has a checkpoint at step {step}; choose an empty directory")
        mngr.save(
            step,
            args=ocp.args.Composite(
                **{
                    PARAMS: ocp.args.StandardSave(params),
                    CONFIG: ocp.args.JsonSave(dataclasses.asdict(model_cfg)),
                    META: ocp.args.JsonSave({**meta, "olmax_version": olmax_version()}),
                }
            ),
        )
        mngr.wait_until_finished()
    finally:
        mngr.close()
    return path


def _open_step(
    directory: str | os.PathLike, step: Optional[int], concurrent_gb: int = PARAMS_CONCURRENT_GB
) -> tuple[ocp.CheckpointManager, int]:
    path = checkpoint_path(directory)
    if not path.is_dir():
        raise CheckpointError(f"checkpoint directory {directory} does not exist")
    mngr = _manager(path, create=False, concurrent_gb=concurrent_gb)
    steps = mngr.all_steps()
    if not steps:
        mngr.close()
        raise CheckpointError(f"{directory} holds no complete checkpoint (no finished step directory)")
    if step is None:
        step = max(steps)
    elif step not in steps:
        mngr.close()
        raise CheckpointError(f"{directory} has no checkpoint at step {step}; it has steps {sorted(steps)}")
    return mngr, step


def _read_config(mngr: ocp.CheckpointManager, step: int, directory: str | os.PathLike) -> tuple[ModelConfig, dict]:
    try:
        items = mngr.restore(
            step, args=ocp.args.Composite(**{CONFIG: ocp.args.JsonRestore(), META: ocp.args.JsonRestore()})
        )
    except (FileNotFoundError, ValueError) as e:
        raise CheckpointError(f"cannot read the config/meta items of {directory} step {step}: {e}") from None
    try:
        model_cfg = from_dict(items[CONFIG], ModelConfig)
    except ConfigError as e:
        raise CheckpointError(f"the model config stored in {directory} step {step} is invalid: {e}") from None
    return model_cfg, dict(items[META])


def read_config(directory: str | os.PathLike, step: Optional[int] = None) -> tuple[ModelConfig, dict]:
    """The model config and meta of a checkpoint (default: its latest step), without loading arrays.
    Use it to build the target shardings for `load_params`."""
    model_cfg, meta, _ = _config_at(directory, step)
    return model_cfg, meta


def _config_at(directory: str | os.PathLike, step: Optional[int]) -> tuple[ModelConfig, dict, int]:
    """read_config, plus the step it resolved (the latest when `step` is None)."""
    mngr, step = _open_step(directory, step)
    try:
        return (*_read_config(mngr, step, directory), step)
    finally:
        mngr.close()


def _flat_shapes(tree, is_leaf=None) -> dict[str, tuple]:
    """{"['layers']['q_proj']": shape, ...} for a tree of arrays, ShapeDtypeStructs or array metadata."""
    return {
        jax.tree_util.keystr(k): tuple(v.shape) for k, v in jax.tree_util.tree_leaves_with_path(tree, is_leaf=is_leaf)
    }


def _check_shapes(found: dict[str, tuple], model_cfg: ModelConfig, what: str) -> None:
    """Compare flat shapes with what `model_cfg` declares; the error names every mismatch."""
    expected = _flat_shapes(abstract_params(model_cfg))
    problems = [f"{k}: missing" for k in expected if k not in found]
    problems += [f"{k}: unexpected" for k in found if k not in expected]
    problems += [f"{k}: shape {found[k]}, config says {v}" for k, v in expected.items() if k in found and found[k] != v]
    if problems:
        raise CheckpointError(f"{what} do not match the model config: " + "; ".join(problems))


def load_params(
    directory: str | os.PathLike, step: Optional[int] = None, shardings: Any = None
) -> tuple[dict, ModelConfig, dict]:
    """Restore (params, model config, meta) from a checkpoint (default: its latest step).

    `shardings`: a pytree of `jax.sharding.Sharding` shaped like the params (e.g.
    `olmax.model.olmo3.param_shardings(cfg, mesh)`, with `cfg` from `read_config`);
    the arrays are restored directly onto it, whatever sharding they were saved with.
    None puts every array on the first device. Arrays are restored in `model_cfg.param_dtype`.
    """
    # the config first: the in-flight bound depends on the largest array it declares
    model_cfg, meta, step = _config_at(directory, step)
    mngr, step = _open_step(directory, step, _concurrent_gb(abstract_params(model_cfg)))
    try:
        stored = mngr.item_metadata(step)[PARAMS]
        if stored is None:
            raise CheckpointError(f"{directory} step {step} has no '{PARAMS}' item")
        _check_shapes(
            _flat_shapes(stored, is_leaf=lambda x: hasattr(x, "shape")),
            model_cfg,
            f"the parameters stored in {directory} step {step}",
        )
        abstract = abstract_params(model_cfg)
        if shardings is None:
            shardings = jax.tree.map(lambda _: jax.sharding.SingleDeviceSharding(jax.devices()[0]), abstract)
        target = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract, shardings)
        try:
            params = mngr.restore(step, args=ocp.args.Composite(**{PARAMS: ocp.args.StandardRestore(target)}))[PARAMS]
        except (FileNotFoundError, ValueError) as e:
            raise CheckpointError(f"cannot restore the parameters of {directory} step {step}: {e}") from None
    finally:
        mngr.close()
    return params, model_cfg, meta


# ----------------------------------------------------------------------------------------------
# Training runs: the full state, every N steps


OPT_STATE, DATA, DATA_ARRAYS, EXPERIMENT = "opt_state", "data", "data_arrays", "experiment"
TMP_SUFFIX = ".orbax-checkpoint-tmp"  # locally Orbax writes a step here, then renames it when complete
COMMIT_FILE = ocp.path.atomicity.COMMIT_SUCCESS_FILE  # on GCS it writes this last instead (see _is_gcs)


class RunCheckpoints:
    """The checkpoints of one training run (RUN_DIR/checkpoints, or checkpoint.dir: a local path or a
    gs:// URL). Step N holds the state after N completed steps and the data-loader state after N
    batches, so a resume continues with the data of step N+1. Saves are asynchronous (Orbax copies
    the arrays to host before `save` returns, so the next step may donate them); only completely
    written steps are ever listed or restored.

    Items: params, config and meta (as `save_params`, so `load_params` reads a training checkpoint
    too), opt_state ({"step", "opt"}: the optimizer state incl. the skip-step window), data (the
    loader state, JSON), data_arrays (only where the loader state has an "arrays" entry: numpy arrays,
    e.g. the RL loop's rollouts not yet trained on) and experiment (the whole resolved
    ExperimentConfig). There is no RNG item: the only randomness is the initialisation (from
    trainer.seed, at step 0), the data order and the RL loop's sampling (both in the loader state); the
    step itself is deterministic.

    Keep policy (Orbax's preservation policies, applied after each committed save to every complete
    step in the directory, so to those of earlier runs of the run directory too): the newest
    checkpoint.keep steps (LatestN), every multiple of checkpoint.keep_every (EveryNSteps) and the
    steps of checkpoint.keep_steps (CustomSteps); a step any of them keeps stays. The newest complete
    checkpoint is never deleted.
    """

    def __init__(self, directory: str | os.PathLike, cfg, *, allow_config_change: bool = False):
        # `directory` as written names it in messages; `path` is what is read and written
        self.directory, self.path, self.cfg = os.fspath(directory), checkpoint_path(directory), cfg
        self.allow_config_change = allow_config_change
        options = ocp.CheckpointManagerOptions(
            create=True, enable_async_checkpointing=True, preservation_policy=keep_policy(cfg.checkpoint)
        )
        self._mngr = ocp.CheckpointManager(self.path, item_handlers=run_handlers(), options=options)
        self._writing_step: Optional[int] = None  # the newest step handed to Orbax (async: maybe in flight)
        self._failed = False

    def save(self, step: int, state, data_state: dict, mesh) -> None:
        cfg = self.cfg
        data_state = dict(data_state)
        arrays = data_state.pop("arrays", None)
        meta = {
            "olmax_version": olmax_version(),
            "step": step,
            "devices": jax.device_count(),
            "processes": jax.process_count(),
            "mesh": dict(mesh.shape),
            "tokens_seen": step * cfg.rows_per_step * cfg.data.seq_len,
        }
        self._wait(self._writing_step)  # the previous save's write errors surface here, named by its step
        with self._writing(step):
            self._mngr.save(
                step,
                args=ocp.args.Composite(
                    **{
                        PARAMS: ocp.args.StandardSave(state.params),
                        OPT_STATE: ocp.args.StandardSave({"step": state.step, "opt": state.opt_state}),
                        CONFIG: ocp.args.JsonSave(dataclasses.asdict(cfg.model)),
                        META: ocp.args.JsonSave(meta),
                        DATA: ocp.args.JsonSave(data_state),
                        EXPERIMENT: ocp.args.JsonSave(dataclasses.asdict(cfg)),
                        **({DATA_ARRAYS: ocp.args.StandardSave(arrays)} if arrays else {}),
                    }
                ),
            )
        self._writing_step = step

    def restore_latest(self, target):
        """(state, data state) of the newest checkpoint that reads back completely, or None when
        there is none; `target` as for `restore`. A newer step that fails to read (a truncated or
        corrupt save) is skipped with a warning naming it, and moved aside to `<step>.corrupt` so that
        the run can write that step again; a changed config is an error, not a fallback."""
        for name in self._uncommitted():
            warnings.warn(f"ignoring the interrupted save {self._where(name)} (never committed)", stacklevel=2)
        for step in sorted(self._mngr.all_steps(), reverse=True):
            try:
                state, data_state = self.restore(step, target)
            except CheckpointError:
                raise
            except Exception as e:  # noqa: BLE001 - any read failure means "not a usable checkpoint"
                warnings.warn(
                    f"checkpoint {self._where(step)} cannot be restored ({type(e).__name__}: {e}); "
                    f"falling back to the previous complete checkpoint",
                    stacklevel=2,
                )
                if jax.process_index() == 0:
                    (self.path / str(step)).rename(self.path / f"{step}.corrupt")
                self._mngr.reload()
                continue
            return state, data_state
        return None

    def _uncommitted(self) -> list[str]:
        """The saves that never completed (a crash, a preemption, a failed write): locally Orbax's
        `<step>.orbax-checkpoint-tmp*` directories; on GCS step directories without the commit file.
        Orbax lists neither as a step, and removes such a step directory before writing that step again."""
        if not self.path.is_dir():
            return []
        if _is_gcs(self.path):
            return sorted(
                (p.name for p in self.path.iterdir() if p.name.isdigit() and not (p / COMMIT_FILE).exists()), key=int
            )
        return sorted(p.name for p in self.path.glob(f"*{TMP_SUFFIX}*"))

    def _where(self, step: int | str) -> str:
        return f"{self.directory.rstrip('/')}/{step}"

    def restore(self, step: int, target):
        """(state, data-loader state) of `step`. `target` is the caller's abstract train state
        (olmax.step.state.abstract_state: a TrainState of ShapeDtypeStructs with shardings); the state comes
        back in that layout, whatever mesh saved it (Orbax reshards on restore)."""
        saved = self._mngr.restore(
            step, args=ocp.args.Composite(**{EXPERIMENT: ocp.args.JsonRestore(), DATA: ocp.args.JsonRestore()})
        )
        changes = config_changes(saved[EXPERIMENT], self.cfg)
        if any(c.startswith("model architecture ") for c in changes):  # the arrays themselves would not fit
            raise CheckpointError(
                f"cannot resume from {self._where(step)}: the model changed "
                f"({'; '.join(changes)}); start a new run (checkpoint.init_from, olmax ckpt warm-start)"
            )
        if changes and not self.allow_config_change:
            raise CheckpointError(
                f"cannot resume from {self._where(step)}: the run's config changed "
                f"({'; '.join(changes)}); start a new run directory for a different run, or "
                "pass --allow-config-change (allow_config_change=True) to continue anyway"
            )
        if changes:
            warnings.warn(f"resuming {self._where(step)} with a changed config: {'; '.join(changes)}", stacklevel=2)
        items = self._mngr.restore(
            step,
            args=ocp.args.Composite(
                **{
                    PARAMS: ocp.args.StandardRestore(target.params),
                    OPT_STATE: ocp.args.StandardRestore({"step": target.step, "opt": target.opt_state}),
                }
            ),
        )
        state = target._replace(step=items[OPT_STATE]["step"], params=items[PARAMS], opt_state=items[OPT_STATE]["opt"])
        data_state = None if saved[DATA] is None else dict(saved[DATA])
        if (self.path / str(step) / DATA_ARRAYS).exists():  # numpy arrays, read back as they were saved
            arrays = self._mngr.restore(step, args=ocp.args.Composite(**{DATA_ARRAYS: ocp.args.StandardRestore()}))
            data_state["arrays"] = arrays[DATA_ARRAYS]
        return state, data_state

    def close(self) -> None:
        """Wait for the save in flight (its write errors surface here), then release the manager."""
        try:
            if not self._failed:
                self._wait(self._writing_step)
        finally:
            try:
                self._mngr.close()
            except Exception:  # noqa: BLE001
                if not self._failed:  # after a failed save, closing re-raises the failure already reported
                    raise

    def _wait(self, step: Optional[int]) -> None:
        if step is not None:
            with self._writing(step):
                self._mngr.wait_until_finished()

    @contextlib.contextmanager
    def _writing(self, step: int):
        """Turn a failed write (disk full, no permission, a storage error; Orbax raises it from `save`
        or, for an async save, from the next `save` or `wait_until_finished`) into one
        CheckpointWriteError naming the directory. The failed step stays uncommitted (`_uncommitted`),
        which restore ignores, so the previous complete checkpoint remains the one to resume. Any
        other exception (a TypeError, a shape mismatch: a bug a rerun repeats) propagates as itself,
        with a note naming the step, so the run ends CRASHED with its own message and traceback."""
        try:
            yield
        except Exception as e:  # noqa: BLE001 - sorted below: storage failures, and everything else
            self._failed = True  # either way, `close` must not wait on (and re-raise) this save again
            if not storage_failure(e):
                e.add_note(f"(while writing checkpoint step {step} to {self.directory})")
                raise
            previous = self._mngr.all_steps()
            previous = f"step {max(previous)}" if previous else "none"
            raise CheckpointWriteError(
                f"writing checkpoint step {step} to {self.directory} failed "
                f"({type(e).__name__}: {e}). Is the disk full or not writable? The newest "
                f"complete checkpoint ({previous}) is untouched: fix the storage and rerun "
                "to resume from it"
            ) from e


# tensorstore (which writes the arrays) raises every failure as a plain ValueError whose text starts
# with the absl status code (python/tensorstore/status.cc: only INVALID_ARGUMENT loses its prefix and
# UNIMPLEMENTED becomes NotImplementedError). These codes mean the storage, not the request, failed:
# GCS answers 408/409/429/5xx with UNAVAILABLE and 401/403 with PERMISSION_DENIED
# (tensorstore/internal/http/http_response.cc), a full disk RESOURCE_EXHAUSTED and no permission
# PERMISSION_DENIED (tensorstore/internal/os/error_code.cc). A failed system call carries the errno
# as `[os_error_code='N']` in the text (tensorstore 0.1.86), whatever its code: a file over
# RLIMIT_FSIZE (EFBIG) is OUT_OF_RANGE. INVALID_ARGUMENT, FAILED_PRECONDITION, OUT_OF_RANGE,
# INTERNAL, ... without an errno are how tensorstore reports a wrong request (a shape or dtype that
# does not fit, a bad spec): bugs a rerun repeats.
_STORAGE_STATUS = re.compile(
    r"^(UNAVAILABLE|DEADLINE_EXCEEDED|RESOURCE_EXHAUSTED|PERMISSION_DENIED|UNAUTHENTICATED|ABORTED|DATA_LOSS): "
)
_OS_ERROR = "[os_error_code="

# The remote stores' own exception types that mean I/O (fsspec backends used through etils.epath), by
# module: gcsfs 2026.10 raises HttpError (any other HTTP error status) and ChecksumError, aiohttp 3.14
# ClientError (dropped connections, bad payloads), google-auth 2.63 TransportError (the token
# endpoint unreachable). Their timeouts, connection errors, 403/404 answers and requests' errors are
# OSError subclasses already.
_REMOTE_IO_ERRORS = {
    "gcsfs.retry": ("HttpError", "ChecksumError"),
    "aiohttp": ("ClientError",),
    "google.auth.exceptions": ("TransportError",),
}


def storage_failure(exc: BaseException) -> bool:
    """Whether `exc`, or an exception it was raised from (`raise ... from`), is a failure of the storage
    itself (a rerun may succeed once it is fixed), not of the code that asked it to write: an
    OSError (disk full, no permission, a timeout or dropped connection), a remote store's I/O error,
    or a tensorstore I/O status (the notes above)."""
    remote = tuple(
        kind
        for module, names in _REMOTE_IO_ERRORS.items()
        if module in sys.modules  # a store whose module was never imported raised nothing
        for kind in (getattr(sys.modules[module], name, None) for name in names)
        if isinstance(kind, type)  # another version may lack one: never fail while classifying a failure
    )
    while exc is not None:
        if isinstance(exc, (OSError, *remote)):
            return True
        if type(exc) is ValueError and (_STORAGE_STATUS.match(str(exc)) or _OS_ERROR in str(exc)):
            return True
        exc = exc.__cause__
    return False


def keep_policy(ckpt_cfg) -> "ocp.checkpoint_managers.PreservationPolicy":
    """Which complete steps pruning keeps: the newest `keep`, and the landmarks (see RunCheckpoints)."""
    policies = [ocp.checkpoint_managers.LatestN(ckpt_cfg.keep)]
    if ckpt_cfg.keep_every:
        policies.append(ocp.checkpoint_managers.EveryNSteps(ckpt_cfg.keep_every))
    if ckpt_cfg.keep_steps:
        policies.append(ocp.checkpoint_managers.CustomSteps(list(ckpt_cfg.keep_steps)))
    return ocp.checkpoint_managers.AnyPreservationPolicy(policies)


def complete_steps(directory: str | os.PathLike) -> list[int]:
    """The steps of a checkpoint directory (local or gs://) that Orbax lists as complete, i.e. the ones
    `RunCheckpoints` may resume from and `load_params` reads; [] when there is none (or no directory)."""
    path = checkpoint_path(directory)
    if not path.is_dir():
        return []
    mngr = ocp.CheckpointManager(
        path, item_handlers=run_handlers(), options=ocp.CheckpointManagerOptions(create=False, read_only=True)
    )
    try:
        return sorted(mngr.all_steps())
    finally:
        mngr.close()


def read_experiment(directory: str | os.PathLike, step: int) -> Optional[dict]:
    """The experiment config (a dict) the training run saved with `step` of `directory`; None for a
    checkpoint no training run wrote (a conversion, a warm start, a soup)."""
    if not (checkpoint_path(directory) / str(step) / EXPERIMENT).is_dir():
        return None
    options = ocp.CheckpointManagerOptions(create=False, read_only=True)
    mngr = ocp.CheckpointManager(checkpoint_path(directory), item_handlers=run_handlers(), options=options)
    try:
        return mngr.restore(step, args=ocp.args.Composite(**{EXPERIMENT: ocp.args.JsonRestore()}))[EXPERIMENT]
    finally:
        mngr.close()


def run_handlers() -> dict[str, ocp.CheckpointHandler]:
    """The item handlers of a run checkpoint (also used by olmax.checkpoint.surgery)."""
    return {
        **_handlers(),
        OPT_STATE: ocp.StandardCheckpointHandler(),
        DATA: ocp.JsonCheckpointHandler(),
        DATA_ARRAYS: ocp.StandardCheckpointHandler(),
        EXPERIMENT: ocp.JsonCheckpointHandler(),
    }


def config_changes(saved: dict, cfg) -> list[str]:
    """What a resume may not change silently: the model (its architecture: an error, the arrays would
    not fit; its context fields: a change like the others), the global batch, the sequence length and
    the objective (the data itself is checked by the loader's fingerprint)."""
    changes = []
    stored = from_dict(saved["model"], ModelConfig)
    arch = cfg.model.architecture_changes(stored)
    if arch:
        changes.append("model architecture " + arch)
    if saved["trainer"]["global_batch"] != cfg.trainer.global_batch:
        changes.append(f"trainer.global_batch {saved['trainer']['global_batch']} -> {cfg.trainer.global_batch}")
    if saved["data"]["seq_len"] != cfg.data.seq_len:
        changes.append(f"data.seq_len {saved['data']['seq_len']} -> {cfg.data.seq_len}")
    objective = saved["trainer"].get("objective", "lm")  # checkpoints from before DPO have none
    if objective != cfg.trainer.objective:
        changes.append(f"trainer.objective {objective} -> {cfg.trainer.objective}")
    context = cfg.model.changes_from(stored, CONTEXT_FIELDS)
    if context:
        changes.append("model context " + context)
    return changes
