"""model.remat=auto: the remat policy chosen for the devices a step compiles for, by compiling the
candidates of the ladder (olmax.config.remat.AUTO_LADDER) in the order olmax.fit.remat_search decides,
or read back from the record of an earlier search. `olmax train` calls `choose_for_devices` before its
first step; `olmax compile-check` calls `choose_remat` for a TPU slice or GPU cluster."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Optional

import jax
import numpy as np
from jax.experimental import multihost_utils

from olmax.config.experiment import ExperimentConfig
from olmax.config.remat import AUTO, AUTO_LADDER
from olmax.errors import ConfigError
from olmax.fit import compile_cache
from olmax.fit.chips import Chip, chip_of_device
from olmax.fit.compile_cache import warn
from olmax.fit.compiler import GIB, CompileResult, CompilerRefused, DoesNotFit, budget_gib, compile_step
from olmax.fit.remat_search import (
    RECORD_FILE,
    TOP_FIRST,
    Candidate,
    bisect,
    cached,
    describe_devices,
    format_candidate,
    format_choice,
    new_record,
    no_fit_message,
    search_key,
    store,
    tallied_bytes,
    with_remat,
)
from olmax.rundir import paths


@dataclass(frozen=True)
class RematChoice:
    """What `model.remat=auto` became for a step: `cfg` with it chosen; the search's record (None
    where nothing was compiled to choose); the chosen step compiled by the search, if it was;
    `source`, the file a cached record was read from."""

    cfg: ExperimentConfig
    record: Optional[dict] = None
    compiled: Optional[CompileResult] = None
    source: Optional[str] = None


def choose_remat(
    cfg: ExperimentConfig,
    mesh,
    chip: Optional[Chip],
    where: str,
    options: dict,
    cache_dir: Optional[str] = None,
    log: Callable[[str], None] = lambda line: None,
    write_record: bool = True,
    shared_dir: Optional[str] = None,
    resident_bytes: int = 0,
) -> RematChoice:
    """model.remat=auto chosen for `mesh` (olmax.fit.remat_search): the first candidate of the ladder
    whose step the compiler accepts within the chip's budget, found by bisection, or the record of
    an earlier search in cache_dir/remat_search.json, else in shared_dir's (the compilation cache's
    folder, which runs in other run directories on this host share; one there that cannot be read or
    kept is a warning); the search's record goes to both (unless write_record is false). CPU devices
    have no budget: the most kept set, nothing compiled. A step that fits under no policy is
    DoesNotFit, naming what would. `resident_bytes` per device stay on the devices beside the step (the
    RL loop's continuous engine: its KV cache) and come off the budget."""
    budget = budget_gib(chip)
    if budget is not None and resident_bytes:
        log(f"model.remat=auto: {resident_bytes / GIB:.2f} GiB per device stay resident beside the step")
        budget -= resident_bytes / GIB
    if budget is None:
        device = mesh.devices.flat[0]
        if device.platform != "cpu":  # an accelerator the chip table does not know: no budget to fit
            raise ConfigError(
                f"model.remat=auto needs the HBM of {device.device_kind} devices, which olmax.fit.chips does not "
                "list; give model.remat (a policy or the tags to keep)"
            )
        log(f"model.remat=auto on {where}: no HBM budget on CPU devices, so {AUTO_LADDER[0]}, nothing compiled")
        return RematChoice(with_remat(cfg, AUTO_LADDER[0], False))
    key = search_key(cfg, mesh)
    found = recorded_choice(cfg, key, cache_dir, shared_dir, log, write_record)
    if found is not None:
        return found
    fitting: list[tuple] = []  # the latest candidate that fit, compiled: bisection's choice is its last

    def compile(c: ExperimentConfig, m) -> Candidate:
        t0 = time.perf_counter()
        try:
            out = compile_step(c, m, options, where)
        except CompilerRefused as e:
            if e.memory != "HBM":  # a kernel's tiles: the same for every candidate
                raise
            candidate = Candidate(c.model.remat, c.model.remat_serial, None, False, time.perf_counter() - t0, e.reason)
        else:
            peak = out.compiled.memory_analysis().peak_memory_in_bytes / GIB
            candidate = Candidate(c.model.remat, c.model.remat_serial, peak, peak <= budget, time.perf_counter() - t0)
            if candidate.fits:
                fitting[:] = [out]
        log(format_candidate(candidate))
        return candidate

    log(f"model.remat=auto on {where}: compiling candidates against a budget of {budget:.2f} GiB per device")
    t0 = time.perf_counter()
    top_first = tallied_bytes(cfg, mesh) <= TOP_FIRST * budget * GIB
    best, tried = bisect(cfg, mesh, compile, top_first=top_first)
    if best is None:
        log("model.remat=auto: no candidate fits; checking what would (the error below says it)")
        raise DoesNotFit(no_fit_message(cfg, mesh, where, tried, budget, compile))
    record = new_record(key, best, tried, budget, time.perf_counter() - t0)
    if write_record:
        store(cache_dir, record)
        store_shared(shared_dir, record)
    log(format_choice(record))
    return RematChoice(with_remat(cfg, best.remat, best.serial), record, fitting[0])


def recorded_choice(
    cfg: ExperimentConfig,
    key: dict,
    cache_dir: Optional[str],
    shared_dir: Optional[str],
    log: Callable[[str], None],
    write_record: bool = True,
) -> Optional[RematChoice]:
    """The choice an earlier search with this key recorded in cache_dir, else in shared_dir (copied to
    cache_dir then, unless not write_record), or None."""
    for folder in (cache_dir, shared_dir):
        record = cached(folder, key) if folder == cache_dir else shared_record(folder, key)
        if record is not None:
            source = paths.join(folder, RECORD_FILE)
            log(format_choice(record, source))
            if write_record and folder != cache_dir:
                store(cache_dir, record)  # a resume of this run reads it from its run directory
            return RematChoice(with_remat(cfg, record["remat"], record["remat_serial"]), record, source=source)
    return None


# The shared folder (the compilation cache's) is a convenience: a record that cannot be read or written
# there (a folder made read-only or full since the start, a bucket without the permission, whatever
# its filesystem raises) is a warning, and the run goes on with a search, or without keeping it.
def shared_record(folder: Optional[str], key: dict) -> Optional[dict]:
    try:
        return cached(folder, key)
    except Exception as e:
        warn(f"the record of model.remat=auto in {folder} cannot be read ({e}); searching instead")
        return None


def store_shared(folder: Optional[str], record: dict) -> None:
    try:
        store(folder, record)
    except Exception as e:
        warn(f"the record of model.remat=auto cannot be kept in {folder} ({e}); a run in a new run directory searches")


PICKS = [(remat, serial) for remat in AUTO_LADDER for serial in (False, True)]  # what a choice is


def _process_0s_pick(cfg: Optional[ExperimentConfig]) -> Optional[tuple[str, bool]]:
    """Process 0's (model.remat, model.remat_serial) in cfg, or None where it passes none, on every
    process. Collective."""
    mine = -1 if cfg is None else PICKS.index((cfg.model.remat, cfg.model.remat_serial))
    chosen = int(multihost_utils.broadcast_one_to_all(np.int32(mine)))
    return None if chosen < 0 else PICKS[chosen]


def choose_for_devices(cfg: ExperimentConfig, mesh, run_dir: str, resident_bytes: int = 0) -> RematChoice:
    """`choose_remat` for a run's own devices, compiled with the process's own flags as the step will
    be: the record of the search goes to RUN_DIR/remat_search.json and to the compilation cache's folder
    (olmax.fit.compile_cache), so a restart, or a run in a new run directory on the same devices, reads
    it back instead of searching. The choice carries the step the search compiled for it, which the
    trainer runs instead of compiling it again. Any other model.remat: `cfg` as it is.

    Several processes run one program, so all take process 0's choice. Process 0 alone reads and writes
    the records (the other hosts' cache folders may hold none, or an older one) and first says whether
    it has one: if so, every process takes it and none searches; if not, every process searches, as
    process 0 does (each then holds the chosen step compiled), and takes process 0's choice.
    `resident_bytes`: what stays on each device beside the step (choose_remat)."""
    if cfg.model.remat != AUTO:
        return RematChoice(cfg)
    devices = list(mesh.devices.flat)
    chip, where = chip_of_device(devices[0]), describe_devices(devices)
    shared = compile_cache.active_dir()
    if jax.process_count() == 1:
        return choose_remat(
            cfg, mesh, chip, where, {}, run_dir, log=_print, shared_dir=shared, resident_bytes=resident_bytes
        )
    primary = jax.process_index() == 0
    found = None
    if primary and budget_gib(chip) is not None:
        found = recorded_choice(cfg, search_key(cfg, mesh), run_dir, shared, _print)
    pick = _process_0s_pick(found.cfg if found else None)
    if pick is not None:
        return found if primary else RematChoice(with_remat(cfg, *pick))
    choice = choose_remat(
        cfg,
        mesh,
        chip,
        where,
        {},
        run_dir if primary else None,
        log=_print if primary else lambda line: None,
        write_record=primary,
        shared_dir=shared if primary else None,
        resident_bytes=resident_bytes,
    )
    pick = _process_0s_pick(choice.cfg)
    mine = (choice.cfg.model.remat, choice.cfg.model.remat_serial)
    return choice if pick == mine else RematChoice(with_remat(cfg, *pick))


def _print(line: str) -> None:
    print(line, flush=True)
