"""Checkpoint surgery: warm-starting a new stage from a run's checkpoint, and inspecting checkpoints.

Warm start (stage 2 from stage 1): `warm_start(SRC, DST, keep={"params", "moments"}, reset_step=True)`
writes DST as a one-step run checkpoint; a run with `checkpoint.init_from=DST` starts from it.

- params are always kept; "moments" keeps AdamW's first and second moments AND its bias-correction
  counter. That is what OLMo-core does when a stage-2 trainer loads stage-1 optimizer state with
  `load_trainer_state=False`: its AdamW keeps a per-parameter `state["step"]` inside the optimizer
  state dict (olmo_core/optim/adamw.py), so the counter comes back with the moments and bias
  correction continues from stage 1, while the trainer's global step (and with it the LR schedule)
  starts again at 0. Without "moments" the optimizer is fresh (zero moments, counter 0).
- reset_step: the step becomes 0 (so the schedule restarts), the skip-step window is emptied (OLMo-core
  keeps that window in memory, so a loaded stage 2 starts with an empty one) and the data-loader state
  is dropped (stage 2 reads its own data from the start). Without it all three are kept.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

from olmax.checkpoint import (
    CONFIG,
    DATA,
    EXPERIMENT,
    META,
    OPT_STATE,
    PARAMS,
    CheckpointError,
    RunCheckpoints,
    checkpoint_path,
    olmax_version,
    read_config,
    run_handlers,
)
from olmax.config import ConfigError, ExperimentConfig, MeshConfig, from_dict
from olmax.optim import AdamWState, OptState, skip_window_init
from olmax.sharding import make_mesh
from olmax.state import TrainState, abstract_state

KEEP_CHOICES = ("params", "moments")
WARM_START = "warm_start"  # the meta key that marks a warm-start checkpoint (and says what it kept)


def _open(directory: str | os.PathLike, step: Optional[int]) -> tuple[ocp.CheckpointManager, int]:
    path = checkpoint_path(directory)
    if not path.is_dir():
        raise CheckpointError(f"checkpoint directory {directory} does not exist")
    mngr = ocp.CheckpointManager(
        path, item_handlers=run_handlers(), options=ocp.CheckpointManagerOptions(create=False, read_only=True)
    )
    steps = mngr.all_steps()
    if not steps:
        raise CheckpointError(f"{directory} holds no complete checkpoint")
    if step is None:
        step = max(steps)
    if step not in steps:
        raise CheckpointError(f"{directory} has no checkpoint at step {step}; it has steps {sorted(steps)}")
    return mngr, step


def _json_items(mngr: ocp.CheckpointManager, step: int, directory: str | os.PathLike) -> dict:
    names = [n for n in (EXPERIMENT, META, DATA) if (checkpoint_path(directory) / str(step) / n).is_dir()]
    if EXPERIMENT not in names:
        raise CheckpointError(f"{directory} step {step} is not a training-run checkpoint (no '{EXPERIMENT}' item)")
    items = mngr.restore(step, args=ocp.args.Composite(**{n: ocp.args.JsonRestore() for n in names}))
    return {n: items[n] for n in names}


def restore_state(src: str | os.PathLike, step: int, cfg: ExperimentConfig, mesh=None):
    """The TrainState of run checkpoint `src` step `step`, sharded over `mesh` (default: FSDP over
    every device), so no device holds more than its shard of the parameters and both moments."""
    mesh = mesh if mesh is not None else make_mesh(MeshConfig(data=1, fsdp=-1, tensor=1))
    ckpts = RunCheckpoints(src, cfg)
    try:
        with jax.set_mesh(mesh):
            return ckpts.restore(step, abstract_state(cfg, mesh))[0]
    finally:
        ckpts.close()


def check_keep(keep: tuple[str, ...]) -> None:
    if set(keep) - set(KEEP_CHOICES) or "params" not in keep:
        raise ConfigError(f"keep must list params and optionally moments (from {KEEP_CHOICES}), got {sorted(keep)}")


def require_new_output(dst: str | os.PathLike) -> None:
    """A warm-start checkpoint goes to a new or empty directory: nothing is ever overwritten."""
    out_path = checkpoint_path(dst)
    if out_path.exists() and any(out_path.iterdir()):
        raise CheckpointError(f"{dst} is not empty; choose a new directory for the warm-start checkpoint")


def write_warm_start(
    dst: str | os.PathLike,
    step: int,
    params,
    opt: OptState,
    model_cfg,
    meta: dict,
    data_state: Optional[dict],
    experiment: dict,
) -> None:
    """Write the one-step run checkpoint DST that `load_warm_start` reads (`meta` holds WARM_START)."""
    out = ocp.CheckpointManager(
        checkpoint_path(dst), item_handlers=run_handlers(), options=ocp.CheckpointManagerOptions(create=True)
    )
    try:
        out.save(
            step,
            args=ocp.args.Composite(
                **{
                    PARAMS: ocp.args.StandardSave(params),
                    OPT_STATE: ocp.args.StandardSave({"step": np.int32(step), "opt": opt}),
                    CONFIG: ocp.args.JsonSave(dataclasses.asdict(model_cfg)),
                    META: ocp.args.JsonSave(meta),
                    DATA: ocp.args.JsonSave(data_state),
                    EXPERIMENT: ocp.args.JsonSave(experiment),
                }
            ),
        )
        out.wait_until_finished()
    finally:
        out.close()


def warm_start(
    src: str | os.PathLike,
    dst: str | os.PathLike,
    *,
    keep: tuple[str, ...] = KEEP_CHOICES,
    reset_step: bool = True,
    step: Optional[int] = None,
    mesh=None,
) -> dict:
    """Write the warm-start checkpoint DST from run checkpoint SRC (default its latest step); see the
    module doc. Either may be a local path or a gs:// URL. The state passes through sharded over
    `mesh` (default: FSDP over every device; restore_state), never whole on one device. Returns a
    summary (source step, written step, what was kept)."""
    check_keep(keep)
    require_new_output(dst)
    mngr, step = _open(src, step)
    try:
        saved = _json_items(mngr, step, src)
    finally:
        mngr.close()
    cfg = from_dict(saved[EXPERIMENT], ExperimentConfig)
    state = restore_state(src, step, cfg, mesh)
    adam = state.opt_state.adam
    if "moments" not in keep:  # zeros in the moments' own layout
        adam = jax.jit(
            lambda a: jax.tree.map(jnp.zeros_like, a), out_shardings=jax.tree.map(lambda x: x.sharding, adam)
        )(adam)
    window = skip_window_init(cfg.optimizer.skip_window) if reset_step else state.opt_state.window
    new_step = 0 if reset_step else int(state.step)
    data_state = None if reset_step else saved.get(DATA)
    meta = {
        **saved.get(META, {}),
        "olmax_version": olmax_version(),
        "step": new_step,
        "tokens_seen": 0 if reset_step else saved.get(META, {}).get("tokens_seen"),
        WARM_START: {
            "from": str(checkpoint_path(src)),
            "from_step": step,
            "keep": sorted(keep),
            "reset_step": reset_step,
        },
    }
    write_warm_start(
        dst, new_step, state.params, OptState(AdamWState(*adam), window), cfg.model, meta, data_state, saved[EXPERIMENT]
    )
    return {
        "source": os.fspath(src),
        "source_step": step,
        "destination": os.fspath(dst),
        "step": new_step,
        "keep": sorted(keep),
        "reset_step": reset_step,
        "adam_count": int(adam.count),
    }


def load_warm_start(directory: str | os.PathLike, cfg: ExperimentConfig, mesh):
    """(TrainState on `mesh`, data-loader state or None) of a warm-start checkpoint, for the run `cfg`
    (checkpoint.init_from). The model must be the same; batch, data, schedule and the rest may change."""
    mngr, step = _open(directory, None)
    try:
        saved = _json_items(mngr, step, directory)
        stored = from_dict(saved[EXPERIMENT], ExperimentConfig)
        changed = cfg.model.architecture_changes(stored.model)
        if changed:
            raise ConfigError(f"checkpoint.init_from={directory} holds a different model from the run's ({changed})")
        if stored.optimizer.skip_window != cfg.optimizer.skip_window:
            raise ConfigError(
                f"checkpoint.init_from={directory} has a skip window of {stored.optimizer.skip_window}, "
                f"the run optimizer.skip_window={cfg.optimizer.skip_window}"
            )
        target = abstract_state(cfg, mesh)
        items = mngr.restore(
            step,
            args=ocp.args.Composite(
                **{
                    PARAMS: ocp.args.StandardRestore(target.params),
                    OPT_STATE: ocp.args.StandardRestore({"step": target.step, "opt": target.opt_state}),
                }
            ),
        )
    finally:
        mngr.close()
    return TrainState(items[OPT_STATE]["step"], items[PARAMS], items[OPT_STATE]["opt"]), saved.get(DATA)


def is_warm_start(directory: str | os.PathLike) -> bool:
    """Whether `directory` was written by `warm_start` (then checkpoint.init_from restores what it kept)."""
    return WARM_START in read_config(directory)[1]


# ----------------------------------------------------------------------------------------------
# Inspect


def _arrays(metadata) -> dict[str, dict]:
    return {
        jax.tree_util.keystr(k): {"shape": list(v.shape), "dtype": str(v.dtype)}
        for k, v in jax.tree_util.tree_leaves_with_path(metadata, is_leaf=lambda x: hasattr(x, "shape"))
    }


def _flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def inspect(
    directory: str | os.PathLike, *, step: Optional[int] = None, against: Optional[str | os.PathLike] = None
) -> dict:
    """Step, tokens, mesh, array shapes and dtypes, data state and config of a run checkpoint; with
    `against`, the config keys that differ from that checkpoint's ({key: [this, other]})."""
    mngr, step = _open(directory, step)
    try:
        items = _json_items(mngr, step, directory)
        arrays = mngr.item_metadata(step)
        report = {
            "directory": os.fspath(directory),
            "step": step,
            "steps": sorted(mngr.all_steps()),
            "meta": items.get(META, {}),
            "tokens_seen": items.get(META, {}).get("tokens_seen"),
            "params": _arrays(arrays[PARAMS]),
            "opt_state": _arrays(arrays[OPT_STATE]),
            "data": items.get(DATA),
            "experiment": items[EXPERIMENT],
        }
    finally:
        mngr.close()
    if against is not None:
        other = inspect(against)
        mine, theirs = _flatten(report["experiment"]), _flatten(other["experiment"])
        report["against"] = other["directory"]
        report["config_diff"] = {
            k: [mine.get(k), theirs.get(k)] for k in sorted(set(mine) | set(theirs)) if mine.get(k) != theirs.get(k)
        }
    return report
