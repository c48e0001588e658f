"""The training loop, thin on purpose: every step takes the next batch, runs the jitted step
(olmax.step.train_step) and logs the previous step's metrics, read only after this step is dispatched (no
host sync); held-out evaluation (olmax.evals.heldout) and checkpoints (olmax.checkpoint.store) run at
their steps, with the step time measured before them. SIGTERM (a preemption notice) ends the run at
the next step boundary with a checkpoint."""

from __future__ import annotations

import contextlib
import fcntl
import signal
import threading
import time
from pathlib import Path
from typing import Optional

import jax
from jax.experimental import multihost_utils

from olmax.checkpoint.store import RunCheckpoints
from olmax.config.experiment import ExperimentConfig
from olmax.errors import ConfigError
from olmax.evals.heldout import HeldoutEvaluator
from olmax.fit import compile_cache
from olmax.rundir import paths
from olmax.step.state import TrainState
from olmax.step.train_step import make_train_step
from olmax.trainer.batches import StepBatches
from olmax.trainer.metrics import MetricsLog, Progress, loss_name


def run_loop(
    cfg: ExperimentConfig,
    mesh,
    state: TrainState,
    batches: StepBatches,
    ckpts: RunCheckpoints,
    preempted: "PreemptionNotice",
    run_dir: str,
    last: int,
    *,
    compiled=None,
    peak_tflops: Optional[float] = None,
    progress: bool = True,
    start_times: Optional[dict] = None,
) -> list[dict]:
    """Steps state.step + 1 .. `last`; returns the metrics rows logged. Closes the batches, the metrics
    writers and the checkpoints when it ends, however it ends. `compiled`: this config's step as
    model.remat=auto's search compiled it (olmax.fit.remat), run instead of compiling it again.
    `start_times`: seconds the run's start took, by phase, logged with the first row (`start/...`,
    with `start/loop_s`: from here to that row, the step's compile or cache load and first run)."""
    loop_t0 = time.perf_counter()
    start = int(state.step)
    step_fn = _step_program(make_train_step(cfg, mesh, epoch_batches=batches.batches_per_epoch), compiled, cfg)
    primary = jax.process_index() == 0  # metrics are global: process 0 writes and shows them
    log = MetricsLog(run_dir, cfg, mesh.size, peak_tflops, start_step=start, write=primary)
    evaluator = HeldoutEvaluator(cfg, mesh)
    bar = Progress(
        start,
        last,
        cfg.rows_per_step * cfg.data.seq_len,
        enabled=progress and primary,
        every=cfg.trainer.log_every,
        loss=loss_name(cfg),
    )
    rows = []
    first = dict(start_times or {})  # the start's figures, for the first row only

    def once() -> dict:
        out = {**first, "start/loop_s": time.perf_counter() - loop_t0} if first else {}
        first.clear()
        return out

    try:
        pending = None  # the previous step's metrics, read after the next step is dispatched (no host sync)
        t_last = time.perf_counter()
        for step in range(start + 1, last + 1):
            state, metrics = step_fn(state, batches.next(state.params))
            metrics = {**metrics, **batches.metrics()}
            if pending is not None:
                _log(pending, log, rows, bar, t_last, extra=once)
                t_last = time.perf_counter()
                if step == start + 2:  # the first step is compiled and has run: every host keeps its program
                    compile_cache.share_with_hosts()
            pending = (step, metrics, batches.repeats())
            stop = preempted.reached(step)
            eval_due = evaluator.due(step)
            ckpt_due = step % cfg.checkpoint.every == 0 or step == last or stop or cfg.checkpoint.is_landmark(step)
            if eval_due or ckpt_due:
                # step time is measured before evaluation and checkpointing, which it excludes
                _log(pending, log, rows, bar, t_last, extra=lambda: {**once(), **evaluator(step, state.params)})  # noqa: B023
                pending = None
                if ckpt_due:
                    ckpts.save(step, state, batches.state(), mesh)
                    log.sync()  # a gs:// run directory gets the metrics up to this checkpoint
                t_last = time.perf_counter()
            if stop:
                bar.write(f"SIGTERM: saved step {step} in {ckpts.directory}; exiting")
                break
    finally:
        batches.close()
        bar.close()
        log.close()
        ckpts.close()
    return rows


def _step_program(step_fn, compiled, cfg: ExperimentConfig):
    """The step to run: `compiled` (the search's program of this very step) when the first step's
    inputs are the ones it was compiled for, else the jitted `step_fn`, which compiles (or reads its
    program from the persistent cache) on its first call. The search's program assumes no epoch horizon
    (it counts trainer.max_steps batches per epoch), so a schedule over epochs compiles its own."""
    if not isinstance(compiled, jax.stages.Compiled) or cfg.schedule.t_max_epochs is not None:
        return step_fn
    chosen = None

    def step(state, batch):
        nonlocal chosen
        if chosen is None:
            chosen = compiled if _compiled_for(compiled, (state, batch)) else step_fn
        return chosen(state, batch)

    return step


def _compiled_for(compiled, args) -> bool:
    """Whether `args` are what `compiled` takes: the same tree, shapes, dtypes and shardings."""
    leaves, tree = jax.tree.flatten((args, {}))
    if tree != compiled.in_tree:
        return False
    avals, shardings = jax.tree.leaves(compiled.in_avals), jax.tree.leaves(compiled.input_shardings)
    return all(
        (x.shape, x.dtype) == (a.shape, a.dtype) and x.sharding == s for x, a, s in zip(leaves, avals, shardings)
    )


def _log(pending, log: MetricsLog, rows: list, bar: Progress, t_last: float, extra=dict) -> None:
    """Record one step: waits for that step's metrics only, then adds `extra()` (e.g. evaluations)."""
    step, metrics, repeats = pending
    metrics = jax.device_get(metrics)
    step_time = time.perf_counter() - t_last
    row = log.record(
        step, metrics, total_tokens=int(step * metrics["tokens"]), step_time=step_time, repeats=repeats, extra=extra()
    )
    rows.append(row)
    bar.update(row)


@contextlib.contextmanager
def exclusive(run_dir: str):
    """One trainer per run directory: a second one would interleave checkpoints and logs. flock is
    released by the kernel when the holder dies, even by kill -9, so no stale lock survives a crash.
    Process 0 holds it on behalf of a multi-process run (shared filesystems may not support flock).
    An object store (gs://) has no lock: there one owner (resume-until-done with its lock, a Slurm
    singleton job, one xpk workload at a time) keeps a second trainer away (docs/training.md)."""
    if jax.process_index() != 0 or paths.is_url(run_dir):
        yield
        return
    run_dir = Path(run_dir)
    with open(run_dir / "train.lock", "w") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ConfigError(
                f"another olmax train is running in {run_dir} (it holds {run_dir / 'train.lock'})"
            ) from None
        yield


class PreemptionNotice:
    """SIGTERM (a preemption notice leaves seconds to minutes) ends the run at a step boundary, with a
    checkpoint. One process: while active, SIGTERM sets an event instead of killing the process (only
    the main thread can install the handler; elsewhere this does nothing). Several processes: JAX's
    preemption sync manager, which jax.distributed.initialize sets up with its own SIGTERM handler,
    spreads a notice received by any host and picks the one step at which all hosts stop together
    (multihost_utils.reached_preemption_sync_point, asked at every step); hosts stopping at different
    steps would deadlock in the next collective."""

    def __enter__(self) -> "PreemptionNotice":
        self.event = threading.Event()
        self._previous = None
        if jax.process_count() == 1 and threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGTERM, lambda *_: self.event.set())
        return self

    def reached(self, step: int) -> bool:
        if jax.process_count() > 1:
            return multihost_utils.reached_preemption_sync_point(step)
        return self.event.is_set()

    def __exit__(self, *exc) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)
