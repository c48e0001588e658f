"""Checkpoint surgery: warm-starting a new stage from a run's checkpoint, souping checkpoints into
their weighted average, and inspecting checkpoints.

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

Soup: `soup([CKPT, ...], DST, weights=None, params_only=False)` writes the weighted average of the
checkpoints (see `soup`).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
from typing import Callable, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

from olmax.checkpoint.store import (
    CONFIG,
    DATA,
    EXPERIMENT,
    META,
    OPT_STATE,
    PARAMS,
    CheckpointError,
    RunCheckpoints,
    checkpoint_path,
    complete_steps,
    olmax_version,
    read_config,
    run_handlers,
    save_params,
)
from olmax.config.experiment import ExperimentConfig
from olmax.config.io import from_dict
from olmax.config.mesh import MeshConfig
from olmax.errors import ConfigError
from olmax.model.olmo3 import abstract_params, param_shardings
from olmax.model.sharding import make_mesh
from olmax.step.optim import AdamWState, OptState, skip_window_init
from olmax.step.state import TrainState, abstract_state

KEEP_CHOICES = ("params", "moments")
WARM_START = "warm_start"  # the meta key that marks a warm-start checkpoint (and says what it kept)
SOUP = "soup"  # the meta key that marks a soup (and lists its checkpoints and weights)


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


def fsdp_mesh():
    """The mesh that surgery passes a state through: FSDP over every device, so each device holds
    1/devices of every matrix (parameters and both moments)."""
    return make_mesh(MeshConfig(data=1, fsdp=-1, tensor=1))


def restore_state(src: str | os.PathLike, step: int, cfg: ExperimentConfig, mesh=None):
    """The TrainState of run checkpoint `src` step `step`, sharded over `mesh` (default: `fsdp_mesh`),
    so no device holds more than its shard of the parameters and both moments."""
    mesh = mesh if mesh is not None else fsdp_mesh()
    ckpts = RunCheckpoints(src, cfg)
    try:
        with jax.set_mesh(mesh):
            return ckpts.restore(step, abstract_state(cfg, mesh))[0]
    finally:
        ckpts.close()


def check_keep(keep: tuple[str, ...]) -> None:
    if set(keep) - set(KEEP_CHOICES) or "params" not in keep:
        raise ConfigError(f"keep must list params and optionally moments (from {KEEP_CHOICES}), got {sorted(keep)}")


def require_new_output(dst: str | os.PathLike, what: str = "the warm-start checkpoint") -> None:
    """A checkpoint that surgery writes goes to a new or empty directory: nothing is ever overwritten."""
    out_path = checkpoint_path(dst)
    if out_path.exists() and any(out_path.iterdir()):
        raise CheckpointError(f"{dst} is not empty; choose a new directory for {what}")


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
# Soup


def soup_source(text: str) -> tuple[str, int]:
    """(checkpoint directory, step) that a soup's CKPT names: DIR, a checkpoint directory (its newest
    complete step), or DIR/N, step N's own directory inside one (as `ls DIR` lists it)."""
    steps = complete_steps(text)
    if steps:
        return text, steps[-1]
    parent, name = os.path.split(text.rstrip("/"))  # on the string, so that gs:// URLs stay whole
    parent_steps = complete_steps(parent or ".") if name.isdigit() else []
    if parent_steps:
        if int(name) not in parent_steps:
            raise CheckpointError(f"{parent} has no checkpoint at step {int(name)}; it has steps {parent_steps}")
        return parent or ".", int(name)
    if not checkpoint_path(text).exists():
        raise CheckpointError(f"checkpoint {text} does not exist")
    raise CheckpointError(
        f"{text} holds no complete checkpoint (give a checkpoint directory, e.g. RUN_DIR/checkpoints, or DIR/STEP)"
    )


def soup_weights(weights: Optional[Sequence[float]], n: int) -> list[float]:
    """What each of `n` checkpoints is multiplied by: 1/n by default, as OLMo-core's merge script; given
    weights must be n positive numbers and are divided by their sum, so the soup is always a weighted
    mean (1,1,2 and 0.25,0.25,0.5 are the same soup)."""
    if n < 1:
        raise ConfigError("a soup needs at least one checkpoint")
    if weights is None:
        return [1.0 / n] * n
    if len(weights) != n:
        raise ConfigError(f"got {len(weights)} weights for {n} checkpoints; give one per checkpoint, in their order")
    bad = [w for w in weights if not (math.isfinite(w) and w > 0)]
    if bad:
        raise ConfigError(f"soup weights must be positive numbers, got {bad[0]}")
    total = math.fsum(weights)
    return [w / total for w in weights]


@functools.partial(jax.jit, donate_argnums=0)
def _scaled(arrays, weight):
    return jax.tree.map(lambda x: weight * x, arrays)


@functools.partial(jax.jit, donate_argnums=0)
def _add_scaled(total, arrays, weight):
    return jax.tree.map(lambda t, x: t + weight * x, total, arrays)


def average(
    checkpoints: Sequence[tuple[str, int]], weights: Sequence[float], target: dict, split: Callable[[dict], tuple]
):
    """(sum over i of weights[i] * the averaged arrays of checkpoint i, the rest of the first checkpoint).

    `target` maps item names to the abstract trees to restore (ShapeDtypeStructs with shardings; the
    averaged arrays in float32, so Orbax casts them as it reads them); `split(items)` gives (the arrays
    to average, the rest). The checkpoints are read one at a time, each onto the target's shardings,
    and added in float32 where they lie: at most the running sum and one checkpoint are in memory,
    each spread over the mesh as the target is (no device or host holds a whole state)."""
    total = first_rest = None
    for (directory, step), weight in zip(checkpoints, weights, strict=True):
        mngr, step = _open(directory, step)
        try:
            items = mngr.restore(
                step, args=ocp.args.Composite(**{k: ocp.args.StandardRestore(v) for k, v in target.items()})
            )
        finally:
            mngr.close()
        arrays, rest = split(items)
        del items
        if total is None:
            total, first_rest = _scaled(arrays, np.float32(weight)), rest
        else:
            total = _add_scaled(total, arrays, np.float32(weight))
        del arrays
    return total, first_rest


def _in_float32(tree):
    return jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, jnp.float32, sharding=a.sharding), tree)


def _has_item(directory: str, step: int, name: str) -> bool:
    return (checkpoint_path(directory) / str(step) / name).is_dir()


def soup(
    sources: Sequence[str],
    dst: str | os.PathLike,
    *,
    weights: Optional[Sequence[float]] = None,
    params_only: bool = False,
    mesh=None,
) -> dict:
    """Write DST, the weighted average of the checkpoints `sources` (each DIR or DIR/STEP: `soup_source`),
    as OLMo-core's merge script (its repository's src/scripts/merge_core_checkpoints.py) does: every
    array summed with its weight (`soup_weights`: 1/N by default) in float32 and written in float32.

    - params_only: the averaged parameters as a parameters checkpoint (what `load_params`, the eval
      commands and `checkpoint.init_from` with a fresh optimizer read); any checkpoint with
      parameters may go in.
    - otherwise the whole train state: parameters and both AdamW moments averaged; what is not an
      array of the model (the step, AdamW's bias-correction counter, the skip-step window, the
      data-loader state, the experiment config, tokens seen) comes from the first checkpoint, as the
      merge script takes non-tensor entries and the trainer state from its first. DST is a warm-start
      checkpoint that keeps moments without a step reset: `checkpoint.init_from=DST` continues from
      it, `warm_start(DST, ...)` makes a new stage of it. Every input must be a training-run (or
      warm-start) checkpoint.

    Every checkpoint must hold the first one's model (`ModelConfig.architecture_changes`: the context
    fields may differ; DST keeps the first's config). DST is written at the first checkpoint's step.
    The state passes through sharded over `mesh` (default: `fsdp_mesh`; `average`). Returns a summary."""
    weights = soup_weights(weights, len(sources))
    require_new_output(dst, "the soup")
    picked = [soup_source(os.fspath(s)) for s in sources]
    (first, first_step), configs = picked[0], [read_config(d, s) for d, s in picked]
    model = configs[0][0]
    for (directory, step), (other, _) in zip(picked[1:], configs[1:]):
        changed = other.architecture_changes(model)
        if changed:
            raise CheckpointError(
                f"cannot soup {directory} step {step} with {first} step {first_step}: a different model "
                f"({changed}; the first's value -> this one's)"
            )
    record = {
        "checkpoints": [{"checkpoint": os.fspath(d), "step": s, "weight": w} for (d, s), w in zip(picked, weights)],
        "params_only": params_only,
    }
    meta = {k: v for k, v in configs[0][1].items() if k not in (WARM_START, SOUP)}
    meta[SOUP] = record
    mesh = mesh if mesh is not None else fsdp_mesh()
    with jax.set_mesh(mesh):
        if params_only:
            target = jax.tree.map(
                lambda a, s: jax.ShapeDtypeStruct(a.shape, jnp.float32, sharding=s),
                abstract_params(model),
                param_shardings(model, mesh),
            )
            params, _ = average(picked, weights, {PARAMS: target}, lambda items: (items[PARAMS], None))
            save_params(dst, params, model, meta, step=first_step)
        else:
            _soup_state(picked, weights, dst, meta, mesh)
    return {"destination": os.fspath(dst), "step": first_step, **record}


def _soup_state(picked: list[tuple[str, int]], weights: list[float], dst, meta: dict, mesh) -> None:
    """The whole-state soup of `soup`: parameters and moments averaged, the rest from the first."""
    saved = []  # the JSON items (experiment, data, meta) of each checkpoint
    for directory, step in picked:
        if not _has_item(directory, step, OPT_STATE):
            raise CheckpointError(
                f"{directory} step {step} holds no optimizer state; soup the parameters only (--params-only)"
            )
        mngr, step = _open(directory, step)
        try:
            saved.append(_json_items(mngr, step, directory))
        finally:
            mngr.close()
    (first, first_step), cfg = picked[0], from_dict(saved[0][EXPERIMENT], ExperimentConfig)
    for (directory, step), items in zip(picked[1:], saved[1:]):
        window = from_dict(items[EXPERIMENT], ExperimentConfig).optimizer.skip_window
        if window != cfg.optimizer.skip_window:
            raise CheckpointError(
                f"{directory} step {step} has a skip window of {window}, {first} step {first_step} one of "
                f"{cfg.optimizer.skip_window}; the soup keeps the first's window: soup the parameters only"
            )
    abstract = abstract_state(cfg, mesh)
    adam = abstract.opt_state.adam
    opt = OptState(adam._replace(mu=_in_float32(adam.mu), nu=_in_float32(adam.nu)), abstract.opt_state.window)
    target = {PARAMS: _in_float32(abstract.params), OPT_STATE: {"step": abstract.step, "opt": opt}}

    def split(items):
        o = items[OPT_STATE]["opt"]
        return (items[PARAMS], o.adam.mu, o.adam.nu), (o.adam.count, o.window)

    (params, mu, nu), (count, window) = average(picked, weights, target, split)
    meta = {
        **meta,
        "olmax_version": olmax_version(),
        "step": first_step,
        WARM_START: {
            "from": str(checkpoint_path(first)),
            "from_step": first_step,
            "keep": sorted(KEEP_CHOICES),
            "reset_step": False,
        },
    }
    opt_state = OptState(AdamWState(count, mu, nu), window)
    write_warm_start(dst, first_step, params, opt_state, cfg.model, meta, saved[0].get(DATA), saved[0][EXPERIMENT])


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
