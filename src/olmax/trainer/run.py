"""`olmax train`: one run, from its resolved config to the end of its loop, as named phases, each one
call into the package that owns it:

1. mesh      the devices laid out as mesh.* says (olmax.model.sharding)
2. fit       model.remat=auto chosen for those devices (olmax.fit.remat), its step compiled once, beside
             what the RL loop's continuous engine keeps on them (olmax.rollout.producer.resident_engine)
3. pairs     DPO only: the preference pairs, checked against their reference cache before any
             parameters load (olmax.trainer.reference)
4. state     resumed from the newest complete checkpoint, or fresh: a random init, checkpoint.init_from
             or a warm start (olmax.trainer.start)
5. data      the objective's batches from the state's data position, with its extras: DPO's reference
             log-probs, RL's rollouts (olmax.trainer.batches)
6. loop      steps until trainer.max_steps or --stop-at (olmax.trainer.loop)

The state comes before the data because a resumed loader continues at the checkpoint's data position,
and a run that has already reached its last step returns without opening its data."""

from __future__ import annotations

import os
import time
from dataclasses import replace
from pathlib import Path
from typing import Optional, Sequence

import jax

from olmax.checkpoint.store import RunCheckpoints
from olmax.config.experiment import ExperimentConfig
from olmax.config.io import to_yaml
from olmax.fit.remat import choose_for_devices
from olmax.model.sharding import make_mesh
from olmax.rollout.producer import resident_engine
from olmax.rundir import paths
from olmax.rundir.progress import end_step, run_checkpoint_dir
from olmax.trainer.batches import objective_batches
from olmax.trainer.loop import PreemptionNotice, exclusive, run_loop
from olmax.trainer.reference import open_pairs
from olmax.trainer.start import ends_with_epochs, start_state


def train(
    cfg: ExperimentConfig,
    run_dir: str | Path,
    *,
    stop_at: Optional[int] = None,
    peak_tflops: Optional[float] = None,
    allow_data_change: bool = False,
    allow_config_change: bool = False,
    devices: Optional[Sequence[jax.Device]] = None,
    progress: bool = True,
) -> list[dict]:
    """Train until trainer.max_steps (or `stop_at`), resuming from the newest complete checkpoint in
    run_dir. Returns the metrics rows logged by this invocation.

    `devices`: the devices of the mesh (default all); a resume may use a different number or mesh
    shape, the global batch stays and accumulation follows from trainer.micro_batch_size.
    `allow_config_change`: resume although the global batch or sequence length changed.
    SIGTERM (a preemption notice) ends the run at the next step boundary, with a checkpoint; the
    last row's step is then below `end_step(cfg, stop_at)`.
    """
    clock = StartClock()
    run_dir = paths.clean(run_dir)
    paths.makedirs(run_dir)
    mesh = clock.mark("mesh", make_mesh(cfg.mesh, devices))  # the devices' runtime starts here
    # the RL loop's continuous engine keeps its cache on the devices beside the step: the fit counts it
    rollout_cfg, resident = resident_engine(cfg, mesh, run_dir)
    choice = clock.mark("fit", choose_for_devices(cfg, mesh, run_dir, resident))
    given, cfg = cfg, replace(choice.cfg, grpo=rollout_cfg.grpo)
    ckpts = RunCheckpoints(run_checkpoint_dir(cfg, run_dir), cfg, allow_config_change=allow_config_change)
    # Under the mesh so that kernels which cannot be partitioned by XLA (splash) run per shard.
    with exclusive(run_dir), jax.set_mesh(mesh), PreemptionNotice() as preempted:
        pairs = open_pairs(cfg, mesh)
        start = clock.mark("state", start_state(cfg, mesh, ckpts, run_dir, given))
        last = end_step(cfg, stop_at)  # None while the end is the data's epoch horizon (trainer.max_steps=null)
        if last is not None and start.step >= last:
            ckpts.close()
            return []
        batches = clock.mark("data", objective_batches(cfg, mesh, start, pairs, run_dir, allow_data_change))
        if cfg.trainer.max_steps is None:  # the epoch horizon's end, known now that the data is open
            cfg = ends_with_epochs(cfg, batches.batches_per_epoch)
            last = end_step(cfg, stop_at)
            if not start.resumed and jax.process_index() == 0:  # for olmax status, the launcher and the CLI
                paths.write_text(run_dir, "config.yaml", to_yaml(ends_with_epochs(given, batches.batches_per_epoch)))
        compiled = choice.compiled.compiled if choice.compiled is not None and choice.cfg == cfg else None
        return run_loop(
            cfg,
            mesh,
            start.state,
            batches,
            ckpts,
            preempted,
            run_dir,
            last,
            compiled=compiled,
            peak_tflops=peak_tflops,
            progress=progress,
            start_times=clock.times,
        )


class StartClock:
    """Seconds each phase of a run's start took, for the first metrics row (`start/PHASE_s`);
    `start/process_s` is the process's age when train() began (imports, the CLI, the config), read from
    Linux's /proc (absent elsewhere)."""

    def __init__(self):
        self.times: dict[str, float] = {}
        age = process_age()
        if age is not None:
            self.times["start/process_s"] = age
        self._last = time.perf_counter()

    def mark(self, phase: str, value):
        """`value` (the phase's result), after noting the seconds since the previous mark."""
        now = time.perf_counter()
        self.times[f"start/{phase}_s"] = now - self._last
        self._last = now
        return value


def process_age() -> Optional[float]:
    """Seconds since this process started (Linux: /proc/self/stat's start time against /proc/uptime)."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return uptime - ticks / os.sysconf("SC_CLK_TCK")
