"""How far a run goes and where it keeps its checkpoints, read from its run directory without jax:
the config `olmax train` wrote to RUN_DIR/config.yaml, the step the run ends after (trainer.max_steps,
--stop-at, or the end of the data's epochs once the trainer has counted them), its checkpoint
directory and the newest checkpoint there. The trainer, the launcher and `olmax status` all ask here."""

from __future__ import annotations

import json
import os
from typing import Optional

import yaml

from olmax.config.experiment import ExperimentConfig
from olmax.config.io import from_dict
from olmax.errors import ConfigError
from olmax.rundir import paths


def read_run_config(run_dir: str) -> ExperimentConfig:
    """The config of the run in `run_dir`, as its trainer wrote it (a ConfigError naming the file when
    there is none)."""
    text = paths.read_text(run_dir, "config.yaml")
    if text is None:
        raise ConfigError(
            f"{paths.join(run_dir, 'config.yaml')} does not exist: is {run_dir} a run directory "
            "(olmax train writes it when the run starts)?"
        )
    return from_dict(yaml.safe_load(text), ExperimentConfig)


def end_step(cfg: ExperimentConfig, stop_at: Optional[int] = None) -> Optional[int]:
    """The step a run of `cfg` ends after: trainer.max_steps, or `stop_at` when that is earlier; None
    when neither is known yet (trainer.max_steps=null before the run has opened its data)."""
    return min((s for s in (cfg.trainer.max_steps, stop_at) if s is not None), default=None)


def run_end_step(run_dir: str, cfg: ExperimentConfig, stop_at: Optional[int] = None) -> Optional[int]:
    """`end_step` of the run in `run_dir` started from `cfg`: with trainer.max_steps=null, that of the
    run's config.yaml, where `olmax train` wrote the end of the data's epochs when it opened the data."""
    if cfg.trainer.max_steps is None and paths.size(paths.join(run_dir, "config.yaml")) is not None:
        cfg = read_run_config(run_dir)
    return end_step(cfg, stop_at)


def run_checkpoint_dir(cfg, run_dir: str | os.PathLike) -> str | os.PathLike:
    """Where the run in `run_dir` keeps its checkpoints: checkpoint.dir (a local path or a gs:// URL)
    when set, else RUN_DIR/checkpoints. The trainer and resume-until-done both ask here."""
    return cfg.checkpoint.dir or paths.join(run_dir, "checkpoints")


# Orbax's layout of a checkpoint directory (orbax-checkpoint 0.12, _src/path/temporary_paths.py): a step
# is a folder named by its number; one still being written carries a ".orbax-checkpoint-tmp-" suffix on a
# local disk, and on an object store is complete once it holds commit_success.txt. A JSON item is the
# file `metadata` in the item's folder (JsonCheckpointHandler's default name).
ORBAX_COMMIT, ORBAX_JSON = "commit_success.txt", "metadata"


def newest_checkpoint(directory: str | os.PathLike, item: str = "data") -> tuple[Optional[int], Optional[dict]]:
    """(the newest complete step of a run's checkpoint directory, that step's JSON `item`, the data
    state by default), read as files: what `olmax status` shows without opening Orbax (which needs jax).
    (None, None) when there is none."""
    remote = paths.is_url(directory)
    steps = sorted((int(name) for name in paths.list_dir(directory) if name.isdigit()), reverse=True)
    for step in steps:
        folder = paths.join(directory, str(step))
        if remote and paths.size(paths.join(folder, ORBAX_COMMIT)) is None:
            continue
        text = paths.read_text(folder, f"{item}/{ORBAX_JSON}")
        return step, (json.loads(text) if text else None)
    return None, None
