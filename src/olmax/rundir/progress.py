"""How far a run goes and where it keeps its checkpoints, read from its run directory without jax:
the config `olmax train` wrote to RUN_DIR/config.yaml, the step the run ends after (trainer.max_steps,
--stop-at, or the end of the data's epochs once the trainer has counted them), and its checkpoint
directory. The trainer, the launcher and `olmax status` all ask here."""

from __future__ import annotations

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


def last_step(cfg: ExperimentConfig, stop_at: Optional[int] = None) -> Optional[int]:
    """The step a run of `cfg` ends after: trainer.max_steps, or `stop_at` when that is earlier; None
    when neither is known yet (trainer.max_steps=null before the run has opened its data)."""
    return min((s for s in (cfg.trainer.max_steps, stop_at) if s is not None), default=None)


def run_last_step(run_dir: str, cfg: ExperimentConfig, stop_at: Optional[int] = None) -> Optional[int]:
    """`last_step` of the run in `run_dir` started from `cfg`: with trainer.max_steps=null, that of the
    run's config.yaml, where `olmax train` wrote the end of the data's epochs when it opened the data."""
    if cfg.trainer.max_steps is None and paths.size(paths.join(run_dir, "config.yaml")) is not None:
        cfg = read_run_config(run_dir)
    return last_step(cfg, stop_at)


def run_checkpoint_dir(cfg, run_dir: str | os.PathLike) -> str | os.PathLike:
    """Where the run in `run_dir` keeps its checkpoints: checkpoint.dir (a local path or a gs:// URL)
    when set, else RUN_DIR/checkpoints. The trainer and resume-until-done both ask here."""
    return cfg.checkpoint.dir or paths.join(run_dir, "checkpoints")
