"""How a run starts: from its newest complete checkpoint (a resume), or at step 0 from a fresh state:
a random init (OLMo-core's), the parameters of checkpoint.init_from with a fresh optimizer, or a
checkpoint `olmax ckpt warm-start` wrote (its state, and its data position unless --reset-step).

Step semantics are OLMo-core's: checkpoint N holds the state after N completed steps and the loader
state after N batches, so a resumed run continues with the data of step N+1."""

from __future__ import annotations

import dataclasses
from typing import NamedTuple, Optional

import jax

from olmax.checkpoint.store import RunCheckpoints, load_params
from olmax.checkpoint.surgery import is_warm_start, load_warm_start
from olmax.config.experiment import ExperimentConfig
from olmax.config.io import to_yaml
from olmax.errors import ConfigError
from olmax.model.olmo3 import param_shardings
from olmax.rundir import paths
from olmax.step.state import TrainState, abstract_state, init_train_state


class Start(NamedTuple):
    state: TrainState
    data_state: Optional[dict]  # the loader's position (None: the data's start)
    resumed: bool  # from the run's own checkpoint (else step 0 of this run directory)

    @property
    def step(self) -> int:
        return int(self.state.step)


def start_state(cfg: ExperimentConfig, mesh, ckpts: RunCheckpoints, run_dir: str, given: ExperimentConfig) -> Start:
    """The newest complete checkpoint of the run, or a fresh state; a fresh run writes its config as
    given (`given`: model.remat=auto kept, so a resume on other devices chooses again) to
    RUN_DIR/config.yaml, for `olmax status`, the launcher and the CLI."""
    restored = ckpts.restore_latest(abstract_state(cfg, mesh))
    if restored is not None:
        return Start(*restored, resumed=True)
    state, data_state = new_run_state(cfg, mesh)
    if jax.process_index() == 0:
        paths.write_text(run_dir, "config.yaml", to_yaml(given))
    return Start(state, data_state, resumed=False)


def new_run_state(cfg: ExperimentConfig, mesh) -> tuple[TrainState, Optional[dict]]:
    """(state, data-loader state) of a new run directory: step 0 of a random init, of the parameters of
    checkpoint.init_from with a fresh optimizer, or the state (and data position) of a warm start."""
    key = jax.random.key(cfg.trainer.seed)
    if not cfg.checkpoint.init_from:
        return init_train_state(cfg, mesh, key), None
    if is_warm_start(cfg.checkpoint.init_from):
        return load_warm_start(cfg.checkpoint.init_from, cfg, mesh)
    params, stored, _ = load_params(cfg.checkpoint.init_from, shardings=param_shardings(cfg.model, mesh))
    changed = cfg.model.architecture_changes(stored)
    if changed:
        raise ConfigError(
            f"checkpoint.init_from={cfg.checkpoint.init_from} holds a different model from the run's ({changed})"
        )
    return init_train_state(cfg, mesh, key, params), None


def starting_params(cfg: ExperimentConfig, mesh, start: Start) -> dict:
    """The parameters the run started from: the state's own at step 0, made again for a resumed run
    (the objectives that keep a reference policy, DPO and GRPO's KL penalty, need them)."""
    return start.state.params if not start.resumed else new_run_state(cfg, mesh)[0].params


def ends_with_epochs(cfg: ExperimentConfig, batches_per_epoch: int) -> ExperimentConfig:
    """`cfg` with trainer.max_steps=null made the end of its epoch horizon, schedule.t_max_epochs x the
    data's whole global batches per epoch: OLMo-core 3.0.0's trainer ends a Duration.epochs run there
    (olmo_core/train/trainer.py, `_get_max_steps`), as AI2's SFT and open-instruct's DPO ran."""
    steps = cfg.schedule.t_max_epochs * batches_per_epoch
    return dataclasses.replace(cfg, trainer=dataclasses.replace(cfg.trainer, max_steps=steps))
