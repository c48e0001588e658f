"""The training loop: thin on purpose. Everything it calls is a tested part of its own:
the jitted step (olmax.train_step), the data loader (olmax.data.loader), checkpoints
(olmax.checkpoint) and the metrics writers (olmax.metrics).

Step semantics (OLMo-core's): step s is 1-based; checkpoint N holds the state after N completed
steps and the loader state after N batches, so a resumed run continues with the data of step N+1.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import signal
import threading
import time
from pathlib import Path
from typing import Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding, PartitionSpec

from olmax import runpath
from olmax.checkpoint import RunCheckpoints, load_params, run_checkpoint_dir
from olmax.chips import chip_of_device_kind
from olmax.compile_check import choose_remat
from olmax.config import ConfigError, ExperimentConfig
from olmax.config_io import to_yaml
from olmax.data.loader import make_loader
from olmax.data.pairs import REFERENCE_FINGERPRINT, PairLoader, PairSource
from olmax.data.tokenizer import load_tokenizer
from olmax.evals.heldout import HeldoutEvaluator
from olmax.exits import ExitStatus, write_record
from olmax.metrics import LOSS_METRIC, MetricsLog, Progress
from olmax.objectives import dpo, grpo
from olmax.objectives.reference import check_cache_data, params_fingerprint, reference_logps_cache
from olmax.remat import AUTO, AUTO_LADDER
from olmax.remat_search import describe_devices, with_remat
from olmax.rollout.batches import RolloutBatches, prompt_set
from olmax.sharding import make_mesh, place
from olmax.state import abstract_state, init_train_state, param_shardings
from olmax.status import last_step
from olmax.surgery import is_warm_start, load_warm_start
from olmax.train_step import batch_layout, batch_sharding, make_train_step


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
    last row's step is then below `last_step(cfg, stop_at)`.
    """
    run_dir = runpath.clean(run_dir)
    runpath.makedirs(run_dir)
    mesh = make_mesh(cfg.mesh, devices)
    given = cfg  # config.yaml keeps model.remat=auto as given: a resume on other devices chooses again
    if cfg.model.remat == AUTO:
        cfg = _choose_remat(cfg, mesh, run_dir)
    last = last_step(cfg, stop_at)  # None while the end is the data's epoch horizon (trainer.max_steps=null)
    ckpts = RunCheckpoints(run_checkpoint_dir(cfg, run_dir), cfg, allow_config_change=allow_config_change)
    rows = []
    # Under the mesh so that kernels which cannot be partitioned by XLA (splash) run per shard.
    with _exclusive(run_dir), jax.set_mesh(mesh), _PreemptionNotice() as preempted:
        pairs = None
        if cfg.trainer.objective == "dpo":  # a cache of other pairs is refused before any parameters load
            pairs = PairSource(cfg.data)
            check_cache_data(pairs)
        restored = ckpts.restore_latest(abstract_state(cfg, mesh))
        if restored is None:
            state, data_state = _fresh_state(cfg, mesh)
            if jax.process_index() == 0:
                runpath.write_text(run_dir, "config.yaml", to_yaml(given))
        else:
            state, data_state = restored
        start = int(state.step)
        if last is not None and start >= last:
            ckpts.close()
            return rows
        # One process reads the whole global batch; with several, each reads its ranks' rows.
        n_proc, proc = jax.process_count(), jax.process_index()
        batch_layout(cfg, mesh)  # refuses a batch the mesh cannot split before the data is prepared
        dpo_run = pairs is not None
        rl_run = cfg.trainer.objective == "grpo"
        if rl_run:  # the rollout phase: prompts -> sample -> verify -> pack (olmax.rollout.batches)
            tok = load_tokenizer(cfg.data.tokenizer)
            reference = None
            if cfg.grpo.beta > 0:
                # the kl3 penalty's reference: the starting parameters (a copy: the step donates the
                # state's), made again from the start (seed or checkpoint.init_from) on a resume
                reference = (
                    jax.tree.map(jnp.copy, state.params) if restored is None else _fresh_state(cfg, mesh)[0].params
                )
            loader = RolloutBatches(
                cfg,
                mesh,
                prompt_set(cfg, tok),
                tok,
                reference=reference,
                state=data_state,
                allow_mismatch=allow_data_change,
                record_dir=run_dir,
            )
        elif dpo_run:
            # the reference pass runs on the starting parameters: the fresh state's, which a resumed
            # run makes again only if the cache is missing (it is written before step 1); their
            # fingerprint keys the cache: a resumed run's is the one its data state recorded at the start
            def start_params():
                return state.params if restored is None else _fresh_state(cfg, mesh)[0].params

            if restored is None:
                fingerprint = params_fingerprint(state.params)
            else:  # a data state from before the record has none: the starting parameters are made again
                fingerprint = data_state.get(REFERENCE_FINGERPRINT) or params_fingerprint(start_params())
            loader = _pair_loader(
                cfg, mesh, pairs, start_params, fingerprint, data_state, n_proc, proc, allow_data_change
            )
        else:
            loader = make_loader(
                cfg.data,
                cfg.trainer.global_batch,
                dp_rank=proc,
                dp_size=n_proc,
                state=data_state,
                allow_fingerprint_mismatch=allow_data_change,
            )
        if cfg.trainer.max_steps is None:  # the epoch horizon's end, known now that the data is open
            cfg = ends_with_epochs(cfg, loader.batches_per_epoch)
            last = last_step(cfg, stop_at)
            if restored is None and jax.process_index() == 0:  # for olmax status, the launcher and the CLI
                runpath.write_text(run_dir, "config.yaml", to_yaml(ends_with_epochs(given, loader.batches_per_epoch)))
        step_fn = make_train_step(cfg, mesh, epoch_batches=loader.batches_per_epoch)
        to_global = batch_sharding(cfg, mesh)
        if dpo_run:
            shardings = dpo.pair_batch_shardings(mesh, to_global.spec[0])
        elif rl_run:  # every array is (rows, seq) token-aligned, placed as input_ids
            shardings = {k: to_global for k in (*grpo.BATCH_KEYS, "doc_lens")}
        else:
            # instance_mask: the repetition filter is on; doc_lens: data.doc_masking (attention within
            # documents); label_mask: data.label_masks (the loss only where it is True)
            mask_sharding = NamedSharding(mesh, PartitionSpec(to_global.spec[0]))
            shardings = {"input_ids": to_global, "instance_mask": mask_sharding, "doc_lens": to_global}
            shardings["label_mask"] = to_global
        primary = jax.process_index() == 0  # metrics are global: process 0 writes and shows them
        log = MetricsLog(run_dir, cfg, mesh.size, peak_tflops, start_step=start, write=primary)
        evaluator = HeldoutEvaluator(cfg, mesh)
        batches = iter(loader)
        bar = Progress(
            start,
            last,
            cfg.rows_per_step * cfg.data.seq_len,
            enabled=progress and primary,
            every=cfg.trainer.log_every,
            loss=LOSS_METRIC[cfg.trainer.objective],
        )
        try:
            pending = None  # the previous step's metrics, read after the next step is dispatched (no host sync)
            t_last = time.perf_counter()
            for step in range(start + 1, last + 1):
                if rl_run:
                    # the parameters the step starts from: a new rollout is sampled with them (with
                    # grpo.async_steps=1 the one after the step's) and its old log-probs computed
                    loader.params = state.params
                local = next(batches)
                # the RL loop's batch is whole on every process (olmax.rollout.batches), the others' the
                # process's own rows
                put = place if rl_run else jax.make_array_from_process_local_data
                batch = {k: put(sharding, local[k]) for k, sharding in shardings.items() if k in local}
                state, metrics = step_fn(state, batch)
                if rl_run:
                    metrics = {**metrics, **loader.metrics()}
                if pending is not None:
                    _log(pending, log, rows, bar, t_last)
                    t_last = time.perf_counter()
                pending = (step, metrics, loader.audit()["repeats_in_epoch"])
                stop = preempted.reached(step)
                eval_due = evaluator.due(step)
                ckpt_due = step % cfg.checkpoint.every == 0 or step == last or stop or cfg.checkpoint.is_landmark(step)
                if eval_due or ckpt_due:
                    # step time is measured before evaluation and checkpointing, which it excludes
                    _log(pending, log, rows, bar, t_last, extra=lambda: evaluator(step, state.params))  # noqa: B023
                    pending = None
                    if ckpt_due:
                        ckpts.save(step, state, loader.state(), mesh)
                        log.sync()  # a gs:// run directory gets the metrics up to this checkpoint
                    t_last = time.perf_counter()
                if stop:
                    bar.write(f"SIGTERM: saved step {step} in {ckpts.directory}; exiting")
                    break
        finally:
            if rl_run:
                loader.close()
            bar.close()
            log.close()
            ckpts.close()
    return rows


def _pair_loader(
    cfg,
    mesh,
    source: PairSource,
    start_params,
    fingerprint,
    data_state,
    n_proc: int,
    proc: int,
    allow_data_change: bool,
) -> PairLoader:
    """trainer.objective=dpo: the pairs with their reference log-probs, from the cache beside them or
    from the reference pass, run now (olmax.objectives.reference). `fingerprint`: the starting
    parameters' (`params_fingerprint`), which the loader's state records for a resume."""
    primary = jax.process_index() == 0
    log = print if primary else lambda _: None
    reference = reference_logps_cache(cfg, mesh, source, start_params, fingerprint, log=log)
    return PairLoader(
        cfg.data,
        source,
        reference,
        cfg.trainer.global_batch,
        dp_rank=proc,
        dp_size=n_proc,
        state=data_state,
        allow_fingerprint_mismatch=allow_data_change,
        reference_fingerprint=fingerprint,
    )


def ends_with_epochs(cfg: ExperimentConfig, batches_per_epoch: int) -> ExperimentConfig:
    """`cfg` with trainer.max_steps=null made the end of its epoch horizon, schedule.t_max_epochs x the
    data's whole global batches per epoch: OLMo-core 3.0.0's trainer ends a Duration.epochs run there
    (olmo_core/train/trainer.py, `_get_max_steps`), as AI2's SFT and open-instruct's DPO ran."""
    steps = cfg.schedule.t_max_epochs * batches_per_epoch
    return dataclasses.replace(cfg, trainer=dataclasses.replace(cfg.trainer, max_steps=steps))


def _choose_remat(cfg: ExperimentConfig, mesh, run_dir: str) -> ExperimentConfig:
    """model.remat=auto chosen for the run's devices (olmax.compile_check.choose_remat), compiled with
    the process's own flags as the step will be; the record of the search is RUN_DIR/remat_search.json,
    so a restart reads it back instead of searching. Every process searches (or reads) alike, and all
    take process 0's choice: one program runs the step's collectives."""
    devices = list(mesh.devices.flat)
    primary = jax.process_index() == 0
    choice = choose_remat(
        cfg,
        mesh,
        chip_of_device_kind(devices[0].device_kind),
        describe_devices(devices),
        {},
        run_dir,
        log=lambda line: print(line, flush=True) if primary else None,
        write_record=primary,
    ).cfg
    if jax.process_count() == 1:
        return choice
    picks = [(remat, serial) for remat in AUTO_LADDER for serial in (False, True)]
    mine = picks.index((choice.model.remat, choice.model.remat_serial))
    return with_remat(cfg, *picks[int(multihost_utils.broadcast_one_to_all(np.int32(mine)))])


def record_exit(run_dir: str | Path, status: ExitStatus, message: str) -> None:
    """Process 0 writes how this trainer ended to RUN_DIR/exit_status.json (olmax.exits), for the
    launcher and `olmax status`. Best effort: the storage that failed may be the run directory's."""
    if jax.process_index() != 0:
        return
    try:
        write_record(runpath.clean(run_dir), status, message)
    except Exception as e:  # noqa: BLE001 - the exit status still tells the row
        print(f"could not write {runpath.join(run_dir, 'exit_status.json')}: {type(e).__name__}: {e}")


@contextlib.contextmanager
def _exclusive(run_dir: str):
    """One trainer per run directory: a second one would interleave checkpoints and logs. flock is
    released by the kernel when the holder dies, even by kill -9, so no stale lock survives a crash.
    Process 0 holds it on behalf of a multi-process run (shared filesystems may not support flock).
    An object store (gs://) has no lock: there one owner (resume-until-done with its lock, a Slurm
    singleton job, one xpk workload at a time) keeps a second trainer away (docs/training.md)."""
    if jax.process_index() != 0 or runpath.is_url(run_dir):
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


class _PreemptionNotice:
    """SIGTERM (a preemption notice leaves seconds to minutes) ends the run at a step boundary, with a
    checkpoint. One process: while active, SIGTERM sets an event instead of killing the process (only
    the main thread can install the handler; elsewhere this does nothing). Several processes: JAX's
    preemption sync manager, which jax.distributed.initialize sets up with its own SIGTERM handler,
    spreads a notice received by any host and picks the one step at which all hosts stop together
    (multihost_utils.reached_preemption_sync_point, asked at every step); hosts stopping at different
    steps would deadlock in the next collective."""

    def __enter__(self) -> "_PreemptionNotice":
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


def _fresh_state(cfg: ExperimentConfig, mesh):
    """(state, data-loader state) of a new run directory. Step 0: random init (OLMo-core's), or the
    parameters of checkpoint.init_from with a fresh optimizer; or, for a checkpoint written by
    `olmax ckpt warm-start`, the state (and data position, unless --reset-step) it kept."""
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
