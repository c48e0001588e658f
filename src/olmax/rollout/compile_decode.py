"""`olmax compile-check --decode`: compile a GRPO recipe's rollout sampler (olmax.rollout.sampler:
prefill and the while-loop decode, one program) for a TPU topology, a GPU cluster or JAX's devices,
from abstract arrays, as olmax.fit.compile_check does the train step: the parameters laid out as the
trainer lays them out, the KV cache as olmax.rollout.cache.cache_spec says, the program's shapes the
recipe's rollout shapes (grpo.sample_prompts prompts x grpo.samples_per_prompt rows, prompts of
grpo.max_prompt_len tokens, responses of grpo.max_response_len, bucketed as the sampler buckets them).
On a TPU its decoding steps' attention is the Pallas kernel that reads the blocks each row holds
(olmax.rollout.decode_attention), compiled with the rest, and the report's KV cache is counted as the
TPU holds it, in whole tiles (`kv_cache_gib`).

It reports the compiler's per-device memory against the chip's budget (olmax.fit.compiler.budget_gib) less
the optimizer state, which stays on the devices while the trainer samples, and, when the configured
chunk of prompts does not fit, the largest power-of-two grpo.sample_prompts that does, found by
compiling (bisection: the program's memory grows with its rows per device, so only
chunks whose rows the batch axes split are tried; a chunk whose rows are not split, every device
holding them all, may be smaller than the one that fits).

grpo.sample_prompts=auto is that search: all of a step's prompts first, then the bisection.
`olmax train` runs it on its own devices (choose_sample_prompts) and keeps the choice in the run
directory, as model.remat=auto keeps its own (olmax.fit.remat_search).
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import math
import time
from typing import Callable, Optional

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding

from olmax.config.experiment import ExperimentConfig
from olmax.config.objective import data_kind
from olmax.config.remat import AUTO
from olmax.errors import ConfigError
from olmax.fit.chips import chip_of_device
from olmax.fit.compile_check import held_words
from olmax.fit.compiler import (
    GIB,
    CompileResult,
    CompilerRefused,
    DoesNotFit,
    budget_gib,
    compile_lowered,
    memory_of,
    target,
    target_options,
)
from olmax.fit.remat_search import cached, describe_devices, search_key, store
from olmax.model.sharding import LOGICAL_AXIS_RULES, make_mesh
from olmax.rollout.cache import cache_spec, init_cache
from olmax.rollout.sampler import lower_rollout, widths
from olmax.step.state import abstract_state, per_device_bytes

SEARCH_FILE = "sample_prompts_search.json"


def chunk_of(cfg: ExperimentConfig) -> int:
    """Prompts in the first sampler program compiled: grpo.sample_prompts, 0 and auto meaning all of
    the step's."""
    n = cfg.grpo.sample_prompts
    return cfg.grpo.prompts_per_step if n in (0, AUTO) else n


def split_chunks(cfg: ExperimentConfig, mesh, most: int) -> list[int]:
    """The powers of two up to `most` whose rows (samples_per_prompt each) the batch axes split: a
    chunk whose rows they do not divide is not split (olmax.model.sharding.logical_to_spec) but held whole
    by every device, more per device than the smallest split chunk (on 128 TPU devices, 16 prompts x 8)."""
    ways = math.prod(mesh.shape[a] for a in dict(LOGICAL_AXIS_RULES)["batch"])
    rows = cfg.grpo.samples_per_prompt
    return [1 << k for k in range(most.bit_length()) if (rows << k) % ways == 0]


def compile_decode(cfg: ExperimentConfig, mesh, params, prompts: int, options: dict, where: str):
    """The rollout program for `prompts` prompts compiled on `mesh` (a CompileResult). CompilerRefused
    when the compiler runs out of device memory."""
    rl = cfg.grpo
    t0 = time.perf_counter()
    lowered = lower_rollout(
        params, cfg.model, prompts, rl.samples_per_prompt, rl.max_prompt_len, rl.max_response_len, mesh
    )
    t1 = time.perf_counter()
    what = f"{cfg.name}'s rollout of {prompts} prompts does not fit on {where}"
    compiled, heap = compile_lowered(lowered, options, what, mesh.devices.flat[0].platform)
    return CompileResult(compiled, t1 - t0, time.perf_counter() - t1, heap)


def kv_cache_gib(cfg: ExperimentConfig, mesh, rows: int, length: int) -> float:
    """GiB per device of the KV cache of `rows` rows of `length` positions, laid out by cache_spec, as the
    devices hold it: on a TPU each array's last two axes in whole tiles (128 lanes; 8 sublanes of 32-bit
    values, 16 of 16-bit), which is why a head's key and value share one row (olmax.rollout.cache: a
    64-wide head's 2 x 64 fill the lanes, where separate keys and values took twice their bytes)."""
    tpu = mesh.devices.flat[0].platform == "tpu"

    def held(a):
        shard = a.sharding.shard_shape(a.shape)
        if tpu:
            sublanes = 32 // a.dtype.itemsize
            shard = (*shard[:-2], -(-shard[-2] // sublanes) * sublanes, -(-shard[-1] // 128) * 128)
        return math.prod(shard) * a.dtype.itemsize

    place = lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=NamedSharding(mesh, cache_spec(a.shape, mesh)))
    cache = jax.tree.map(place, jax.eval_shape(lambda: init_cache(cfg.model, rows, length)))
    return sum(held(a) for a in jax.tree.leaves(cache)) / GIB


def decode_report(
    cfg: ExperimentConfig,
    devices=None,
    topology: Optional[str] = None,
    num_slices: int = 1,
    log: Callable[[str], None] = lambda line: None,
    options: Optional[dict] = None,
) -> dict:
    """Compile cfg's rollout program for grpo.sample_prompts prompts on a TPU topology or GPU cluster
    (`topology`) or `devices` (default: JAX's) and report what the compiler says; when it does not fit
    the chip's budget, also the largest power-of-two sample_prompts that does among those whose rows
    the batch axes split (each candidate compiled and logged; above the chunk only where its rows
    are not split). `options`: the compiler's (default: the chip's flag profile, as a run sets it; a
    run's own process passes {} to compile with its flags)."""
    if data_kind(cfg.objective_config) != "rollouts":
        raise ConfigError(
            f"--decode compiles the GRPO rollout sampler: {cfg.name} has trainer.objective="
            f"{cfg.trainer.objective}, not grpo"
        )
    devices, chip, where = target(topology, num_slices, devices)
    platform = devices[0].platform
    try:
        mesh = make_mesh(cfg.mesh, devices)
    except ConfigError as e:  # the mesh does not divide this target: say which target
        raise ConfigError(f"{cfg.name} on {where}: {e}") from None
    with jax.set_mesh(mesh):
        state = abstract_state(cfg, mesh)
    params, opt_state_gib = state.params, per_device_bytes(state.opt_state) / GIB
    # the trainer samples between its steps: its optimizer moments stay on the devices beside the
    # program (its parameters are the program's argument, counted in the peak)
    options = target_options(chip, platform) if options is None else options
    budget = budget_gib(chip)
    budget = None if budget is None else budget - opt_state_gib
    rl, chunk = cfg.grpo, chunk_of(cfg)
    width, steps = widths(rl.max_prompt_len, rl.max_response_len)

    attempt = functools.partial(_attempt, cfg, mesh, params, options, where, chip, budget, log)
    if budget is not None:
        log(
            f"compiling {cfg.name}'s rollout on {where} against a budget of {budget:.2f} GiB per device "
            f"(the chip's {budget + opt_state_gib:.2f} less the optimizer state's {opt_state_gib:.2f})"
        )
    first = attempt(chunk)
    search, largest = _search(cfg, mesh, chunk, attempt) if first["fits"] is False else ([], None)
    rows = chunk * rl.samples_per_prompt
    auto = rl.sample_prompts == AUTO
    return {
        "recipe": cfg.name,
        "mode": "decode",
        "platform": platform,
        "topology": topology,
        "num_slices": num_slices if topology is not None else 1,
        "devices": mesh.size,
        "device_kind": devices[0].device_kind,
        "chip": chip.name if chip is not None else None,
        "mesh": dict(mesh.shape),
        "sample_prompts": chunk,
        "samples_per_prompt": rl.samples_per_prompt,
        "rows": rows,
        # the program's shapes, bucketed as the sampler buckets them (olmax.rollout.sampler.widths)
        "prompt_width": width,
        "cache_len": width + steps,
        "max_response_len": rl.max_response_len,
        "params_gib": per_device_bytes(params) / GIB,
        "opt_state_gib": opt_state_gib,
        "kv_cache_gib": kv_cache_gib(cfg, mesh, rows, width + steps),
        "per_device": first["per_device"],
        "refused": first["refused"],
        "lower_s": first["lower_s"],
        "compile_s": first["compile_s"],
        "hbm_limit_gib": None if chip is None else chip.hbm_limit_gib,
        "hbm_headroom": None if chip is None else chip.hbm_headroom,
        # the program's: the chip's budget less the optimizer state (None: no budget on these devices)
        "budget_gib": budget,
        "fits": first["fits"],
        # when the chunk does not fit: each smaller power of two compiled, and the largest that fits
        # (None: none does, or none was tried)
        "search": search,
        "largest_fitting_sample_prompts": largest,
        # grpo.sample_prompts=auto: what it chose (0: all of the step's prompts in one program; None:
        # nothing fits); None when the config gave a number
        "auto_sample_prompts": None if not auto else 0 if first["fits"] is not False else largest,
    }


def _attempt(cfg, mesh, params, options, where, chip, budget, log, prompts: int) -> dict:
    """One chunk size compiled: its figures, or the compiler's refusal."""
    t0 = time.perf_counter()
    try:
        compiled, lower_s, compile_s, heap = compile_decode(cfg, mesh, params, prompts, options, where)
    except CompilerRefused as e:
        if e.memory != "HBM":  # a kernel's tiles: no chunk size changes that
            raise
        out = {"sample_prompts": prompts, "per_device": None, "fits": False, "refused": e.reason}
        out.update(lower_s=None, compile_s=time.perf_counter() - t0)
    else:
        per_device = memory_of(compiled, heap, None if chip is None else chip.hbm_limit_gib)
        fits = None if budget is None else per_device["peak_gib"] <= budget
        out = {"sample_prompts": prompts, "per_device": per_device, "fits": fits, "refused": None}
        out.update(lower_s=lower_s, compile_s=compile_s)
    peak = out["per_device"] and out["per_device"]["peak_gib"]
    log(
        f"rollout of {prompts} prompts x {cfg.grpo.samples_per_prompt} samples: "
        + (f"refused ({out['refused']})" if peak is None else f"peak {peak:.2f} GiB")
        + ("" if out["fits"] is None else f", {'fits' if out['fits'] else 'does not fit'}")
        + f" ({out['compile_s']:.0f} s)"
    )
    return out


def _search(cfg, mesh, chunk: int, attempt) -> tuple[list[dict], Optional[int]]:
    """A chunk over the budget: bisect over the split chunks (fewer rows per device, less memory) for the
    largest that fits; (every attempt, that size or None)."""
    sizes = split_chunks(cfg, mesh, cfg.grpo.prompts_per_step)
    if chunk in sizes:  # split and over the budget: so is every larger chunk
        sizes = sizes[: sizes.index(chunk)]
    search: list[dict] = []
    lo, hi = -1, len(sizes)  # sizes[lo] fits (or none known to), sizes[hi] does not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        search.append(attempt(sizes[mid]))
        lo, hi = (mid, hi) if search[-1]["fits"] else (lo, mid)
    return search, sizes[lo] if lo >= 0 else None


def check_decode_fits(r: dict) -> None:
    """DoesNotFit, naming the figures and what sample_prompts fits, when the rollout does not fit (with
    grpo.sample_prompts=auto: when no chunk does)."""
    if r["fits"] is not False or r["auto_sample_prompts"] is not None:
        return
    where = r["topology"] or f"{r['devices']} {r['platform']} devices"
    peak = r["per_device"] and r["per_device"]["peak_gib"]
    need = f"needs {peak:.1f} GiB per device" if peak is not None else f"was refused by the compiler ({r['refused']})"
    fix = (
        f"grpo.sample_prompts={r['largest_fitting_sample_prompts']} fits"
        if r["largest_fitting_sample_prompts"]
        else "no power-of-two grpo.sample_prompts whose rows the batch axes split fits: "
        "split the model wider (mesh.tensor) or shorten the rollout"
    )
    raise DoesNotFit(
        f"{r['recipe']}'s rollout of {r['sample_prompts']} prompts x {r['samples_per_prompt']} samples "
        f"({r['rows']} rows, cache {r['cache_len']} tokens) does not fit on {where}: it {need}, over the "
        f"budget of {r['budget_gib']:.2f} GiB ({r['hbm_headroom']:.0%} of {r['chip']}'s {r['hbm_limit_gib']:.2f} GiB "
        f"less the optimizer state's {r['opt_state_gib']:.2f}); {fix}"
    )


def format_decode_report(r: dict) -> str:
    d = r["per_device"]
    lines = [
        f"{r['recipe']} rollout on {r['devices']} {r['device_kind']} devices "
        f"({r['topology'] or r['platform']}), mesh {r['mesh']}",
        f"{r['sample_prompts']} prompts x {r['samples_per_prompt']} samples = {r['rows']} rows per program; "
        f"prompt width {r['prompt_width']}, cache {r['cache_len']} tokens (responses up to {r['max_response_len']})",
        f"per device: parameters {r['params_gib']:.2f} GiB, KV cache {r['kv_cache_gib']:.2f} GiB, and beside the "
        f"program the optimizer state {r['opt_state_gib']:.2f} GiB",
    ]
    if d is None:
        lines.append(f"compiler refused it in {r['compile_s']:.1f} s: {r['refused']}")
    else:
        lines += [
            f"lowered in {r['lower_s']:.1f} s, compiled in {r['compile_s']:.1f} s",
            f"XLA: arguments {d['arguments_gib']:.2f} + outputs {d['outputs_gib']:.2f} + temporaries "
            f"{d['temporaries_gib']:.2f} = total {d['total_gib']:.2f} GiB; peak {d['peak_gib']:.2f} GiB"
            + held_words(d),
        ]
    if r["hbm_limit_gib"] is not None:
        lines.append(
            f"HBM limit {r['hbm_limit_gib']:.2f} GiB per device ({r['chip']}): "
            f"{'fits' if r['fits'] else 'DOES NOT FIT'} (budget {r['hbm_headroom']:.0%} less the optimizer state: "
            f"{r['budget_gib']:.2f} GiB)"
        )
    if r["search"]:
        tried = ", ".join(
            f"{c['sample_prompts']}: "
            + ("refused" if c["per_device"] is None else f"{c['per_device']['peak_gib']:.1f} GiB")
            + (" fits" if c["fits"] else "")
            for c in r["search"]
        )
        best = r["largest_fitting_sample_prompts"]
        lines.append(f"grpo.sample_prompts tried {tried}: " + (f"{best} fits" if best else "none fits"))
    if r["auto_sample_prompts"] is not None:
        chosen = r["auto_sample_prompts"]
        lines.append(
            f"grpo.sample_prompts=auto: {chosen}"
            + (" (all of the step's prompts in one program)" if chosen == 0 else "")
        )
    return "\n".join(lines)


def choose_sample_prompts(
    cfg: ExperimentConfig,
    mesh,
    record_dir: Optional[str] = None,
    log: Callable[[str], None] = lambda line: None,
    chip_flags: bool = False,
) -> ExperimentConfig:
    """cfg with grpo.sample_prompts=auto chosen for `mesh`'s devices: 0 (every prompt of a step in one
    program) where that fits the chip's budget, and on devices without one (CPU), else the largest
    power of two that fits (decode_report's search, compiled with this process's own flags as the
    run's sampler will be, or with `chip_flags` the chip's flag profile, for a process started
    without them); DoesNotFit when none does. The choice and its figures are kept in RECORD_DIR/SEARCH_FILE under
    the key of what decides them (olmax.fit.remat_search.search_key and the rollout's shapes), so a restart
    reads it back; with several processes all take process 0's (one program runs the collectives)."""
    rl = cfg.grpo
    if rl.sample_prompts != AUTO:
        return cfg
    devices = list(mesh.devices.flat)
    where = describe_devices(devices)
    chosen_cfg = lambda n: dataclasses.replace(cfg, grpo=dataclasses.replace(rl, sample_prompts=n))
    if chip_of_device(devices[0]) is None:
        log(f"grpo.sample_prompts=auto on {where}: no HBM budget known, so all prompts in one program")
        return chosen_cfg(0)
    shapes = ("prompts_per_step", "samples_per_prompt", "max_prompt_len", "max_response_len")
    key = {**search_key(cfg, mesh), "rollout": {k: getattr(rl, k) for k in shapes}}
    record = cached(record_dir, key, SEARCH_FILE)
    if record is not None:
        log(f"grpo.sample_prompts=auto on {where}: {record['sample_prompts']}, as searched on {record['searched']}")
    else:
        t0 = time.perf_counter()
        r = decode_report(chosen_cfg(AUTO), devices=devices, log=log, options=None if chip_flags else {})
        check_decode_fits(r)
        tried = [r] + r["search"]
        record = {
            "key": key,
            "sample_prompts": r["auto_sample_prompts"],
            "candidates": [{k: c[k] for k in ("sample_prompts", "per_device", "fits", "refused")} for c in tried],
            "budget_gib": r["budget_gib"],
            "search_s": time.perf_counter() - t0,
            "searched": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        }
        log(f"grpo.sample_prompts=auto on {where}: {record['sample_prompts']}, {len(tried)} compiles")
        if jax.process_index() == 0:
            store(record_dir, record, SEARCH_FILE)
    chosen = record["sample_prompts"]
    if jax.process_count() > 1:
        chosen = int(multihost_utils.broadcast_one_to_all(np.int32(chosen)))
    return chosen_cfg(chosen)
