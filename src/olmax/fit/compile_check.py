"""Lower and compile the real train step for a recipe, with abstract arrays only, and report what
the compiler says about it: per-device memory, whether that fits the chip's HBM, whether the fast
attention kernel is in the step, and its FLOPs. Nothing of the model's size is allocated.

Three targets:
- a TPU topology (`topology="v5p:4x4x4"`, optionally several slices): libtpu's topology description
  gives abstract devices of that pod slice and the TPU compiler compiles for them on a host without
  a TPU, Pallas/Mosaic kernels included, with the chip's flag profile (olmax.fit.chips) as compiler
  options: the same flags the launcher sets for a run;
- a GPU cluster (`topology="h100:64x8"`: 64 nodes of 8 GPUs): XLA's GPU compiler (the CUDA plugin,
  jax-cuda12-plugin) compiles for abstract devices made from XLA's target description of the GPU
  (olmax/fit/gpu_targets) on a host without a GPU, cuDNN's fused attention included, with the chip's
  XLA flag profile as compiler options. The devices carry their node as process_index. JAX itself
  must run on the CPU (JAX_PLATFORMS=cpu): with a GPU platform requested but no GPU, the plugin's
  start-up check fails and it is not registered;
- the devices JAX has (`olmax compile-check --devices N` makes N fake CPU devices).

`olmax compile-check --decode` compiles a GRPO recipe's rollout sampler instead, with this module's
targets, compiler options and memory figures (olmax.rollout.compile_decode).

`attention=auto` resolves to the target's kernel (splash for a TPU topology, cudnn for a GPU
cluster, xla there with documents masked or a context axis), as it will when the step runs there.
"""

from __future__ import annotations

import collections
import re
from typing import Callable, Optional

import jax

from olmax.config.experiment import ExperimentConfig
from olmax.config.mesh import describe_node_split
from olmax.config.remat import AUTO, REMAT_TAGS, remat_policy_of
from olmax.errors import ConfigError
from olmax.fit.chips import libtpu_topology, tpu_type
from olmax.fit.compiler import (
    GIB,
    KERNEL_CALLS,
    MOSAIC_KERNEL,
    DoesNotFit,
    _hlo_flops,
    budget_gib,
    compile_step,
    memory_of,
    target,
    target_options,
)
from olmax.fit.flops import exact_step_flops, recompute_flops
from olmax.fit.remat import RematChoice, choose_remat
from olmax.model.attention import resolve_backend
from olmax.model.sharding import make_mesh
from olmax.step.state import abstract_state, per_device_bytes
from olmax.step.train_step import batch_layout


def compile_report(
    cfg: ExperimentConfig,
    devices=None,
    topology: Optional[str] = None,
    num_slices: int = 1,
    cache_dir: Optional[str] = None,
    log: Callable[[str], None] = lambda line: None,
    resident: Optional[Callable] = None,
) -> dict:
    """Compile cfg's step for a TPU topology or GPU cluster (`topology`) or for `devices` (default:
    JAX's) and report what the compiler says. model.remat=auto is chosen first (choose_remat, which
    logs each candidate as it is compiled; cache_dir: where its record is kept and looked for, None =
    nowhere). `resident(cfg, mesh)`: bytes per device that stay beside the step (the RL loop's
    continuous engine), counted against the budget."""
    devices, chip, where = target(topology, num_slices, devices)
    platform = devices[0].platform
    try:
        mesh = make_mesh(cfg.mesh, devices)
        layout = batch_layout(cfg, mesh)
    except ConfigError as e:  # the batch or mesh does not divide this target: say which target
        raise ConfigError(f"{cfg.name} on {where}: {e}") from None
    options = target_options(chip, platform)
    resident_bytes = 0 if resident is None else resident(cfg, mesh)
    choice, auto = RematChoice(cfg), cfg.model.remat == AUTO
    if auto:
        choice = choose_remat(cfg, mesh, chip, where, options, cache_dir, log, resident_bytes=resident_bytes)
        cfg = choice.cfg
    compiled, lower_s, compile_s, heap = choice.compiled or compile_step(cfg, mesh, options, where)
    with jax.set_mesh(mesh):
        state = abstract_state(cfg, mesh)
    per_device = memory_of(compiled, heap, None if chip is None else chip.hbm_limit_gib)
    budget = budget_gib(chip)
    hlo = compiled.as_text()
    policy = remat_policy_of(cfg.model.remat)
    nodes = len({d.process_index for d in devices}) if platform == "gpu" else None
    seq_len = cfg.data.seq_len
    backend, model_flops, recompute = _step_flops(cfg, policy, platform, mesh)
    return {
        "recipe": cfg.name,
        "platform": platform,
        # libtpu's name of the slice, and Cloud TPU's (the accelerator type) for a TPU
        "topology": topology and libtpu_topology(topology),
        "tpu_type": tpu_type(topology) if topology and platform == "tpu" else None,
        "num_slices": num_slices if topology is not None else 1,
        "devices": mesh.size,
        "device_kind": devices[0].device_kind,
        "chip": chip.name if chip is not None else None,
        "mesh": dict(mesh.shape),
        "global_batch": cfg.trainer.global_batch,
        "seq_len": seq_len,
        "per_device_batch": layout.per_device,
        "micro_batch": layout.micro_batch,
        "accum_steps": layout.accum_steps,
        "remat": cfg.model.remat,
        # the block activations the backward pass reads back (no remat: all of them and more)
        "saved": list(REMAT_TAGS) if policy is None else list(policy.save),
        "offloaded": [] if policy is None else list(policy.offload),
        "remat_serial": policy is not None and cfg.model.remat_serial,
        "attention": backend,
        "libtpu_flags": sorted(chip.libtpu_flags) if platform == "tpu" and chip is not None else [],
        "xla_flags": sorted(chip.xla_flags) if platform == "gpu" and chip is not None else [],
        # GPU: the nodes of the cluster (processes), one per distinct process_index, and how the mesh
        # falls on them (olmax.config.mesh.node_split)
        "nodes": nodes,
        "node_layout": describe_node_split(tuple(mesh.shape.values()), mesh.size // nodes) if nodes else None,
        "lower_s": lower_s,
        "compile_s": compile_s,
        # model.remat=auto: every candidate compiled to choose it (remat_search.Candidate), the seconds
        # that took, and the file the choice was read from instead when it was (None: not auto)
        "remat_search": None if not auto else [] if choice.record is None else choice.record["candidates"],
        "remat_search_s": None if choice.record is None or choice.source else choice.record["search_s"],
        "remat_search_from": choice.source,
        "params_gib": per_device_bytes(state.params) / GIB,
        "opt_state_gib": per_device_bytes(state.opt_state) / GIB,
        "per_device": per_device,
        "hbm_limit_gib": None if chip is None else chip.hbm_limit_gib,
        "hbm_headroom": None if chip is None else chip.hbm_headroom,
        # what stays on each device beside the step (the RL loop's continuous engine's cache)
        "resident_gib": resident_bytes / GIB,
        # the compiler accepted it (or compile_report raised DoesNotFit), with headroom to spare
        "fits": None if budget is None else per_device["peak_gib"] + resident_bytes / GIB <= budget,
        # the fused attention kernels in the step: Mosaic (splash) on TPU, cuDNN's on GPU
        "attention_kernel_calls": hlo.count(KERNEL_CALLS[platform]) if platform in KERNEL_CALLS else 0,
        # GPU: the cuDNN calls by kind (forward, backward); each is one call site of the compiled program,
        # so a loop body's calls count once (the layer scan) and an unrolled loop's twice
        "cudnn_calls": dict(collections.Counter(re.findall(r'custom_call_target="(__cudnn\$fmha\w*)"', hlo))),
        # TPU: the Mosaic calls by kernel (splash's forward, dq and dkv), call sites as above; a forward
        # the backward pass runs again is a second forward call site per layer
        "mosaic_calls": dict(collections.Counter(MOSAIC_KERNEL.findall(hlo))),
        "hlo_flops_per_device": _hlo_flops(compiled),
        "model_flops_per_device": model_flops,
        # the forward work the remat policy runs again in the backward pass (olmax.fit.flops.recompute_flops)
        "recompute_flops_per_device": recompute,
        "hardware_flops_per_device": model_flops + recompute,
    }


def _step_flops(cfg: ExperimentConfig, policy, platform: str, mesh) -> tuple[str, float, float]:
    """(the attention backend that runs, model FLOPs, the forward work the remat policy runs again) per
    device per step. Rows that only feed a statistic are a forward each, with nothing recomputed."""
    backend = resolve_backend(
        cfg.model.attention,
        platform,
        cfg.model.compute_dtype,
        doc_masking=cfg.data.doc_masking,
        context=mesh.shape.get("context", 1) > 1,
    )
    statistic, seq_len = cfg.statistic_rows_per_step, cfg.data.seq_len
    trained = cfg.rows_per_step - statistic
    model = exact_step_flops(cfg.model, seq_len, trained, forward_only=statistic).total / mesh.size
    saved = None if policy is None else policy.save
    return backend, model, recompute_flops(cfg.model, seq_len, trained, saved, backend=backend) / mesh.size


def check_fits(r: dict) -> None:
    """DoesNotFit, naming the figures, when the report's per-device peak exceeds the HBM budget."""
    if r["fits"] is False:
        where = r["topology"] or f"{r['devices']} {r['platform']} devices"
        resident = r.get("resident_gib") or 0.0
        beside = f" + {resident:.1f} GiB resident (the RL engine's cache: grpo.slots)" if resident else ""
        raise DoesNotFit(
            f"{r['recipe']} does not fit on {where}: per-device peak "
            f"{r['per_device']['peak_gib']:.1f} GiB{beside} > {r['hbm_headroom']:.0%} of the "
            f"{r['hbm_limit_gib']:.2f} GiB HBM limit per device of {r['chip']} (micro_batch={r['micro_batch']}, "
            f"remat={r['remat']}); try trainer.micro_batch_size or model.remat (auto: the least recompute that fits)"
        )


def held_words(d: dict) -> str:
    """What the chip holds for a program (memory_of's hbm_gib), in words; "" without the TPU heap."""
    if d.get("hbm_gib") is None:
        return ""
    heap, code, held = d["heap_gib"], d["code_gib"], d["hbm_gib"]
    return f"; the chip holds the TPU compiler's heap {heap:.2f} + code {code:.2f} = {held:.2f} GiB"


def format_report(r: dict) -> str:
    d = r["per_device"]
    where = r["platform"]
    if r["topology"]:
        named = f"{r['topology']} ({r['tpu_type']})" if r.get("tpu_type") else r["topology"]
        where = (
            f"{r['topology']}: {r['nodes']} node(s), {r['node_layout']}"
            if r["platform"] == "gpu"
            else f"{named} x {r['num_slices']} slice(s)"
        )
    lines = [
        f"{r['recipe']} on {r['devices']} {r['device_kind']} devices ({where}), mesh {r['mesh']}",
        f"per-device batch {r['per_device_batch']} = {r['accum_steps']} micro-batches of {r['micro_batch']}; "
        f"remat {r['remat']}{', serial' if r['remat_serial'] else ''} (keeps {', '.join(r['saved']) or 'nothing'}"
        f"{'; offloads ' + ', '.join(r['offloaded']) if r['offloaded'] else ''}); "
        f"attention {r['attention']} ({r['attention_kernel_calls']} "
        f"{'cuDNN' if r['platform'] == 'gpu' else 'Mosaic'} kernel calls"
        f"{': ' + ', '.join(f'{n} {k}' for k, n in sorted(r['mosaic_calls'].items())) if r['mosaic_calls'] else ''})",
        f"lowered in {r['lower_s']:.1f} s, compiled in {r['compile_s']:.1f} s",
        f"per device: parameters {r['params_gib']:.2f} GiB, optimizer state {r['opt_state_gib']:.2f} GiB; XLA: "
        f"arguments {d['arguments_gib']:.2f} + outputs {d['outputs_gib']:.2f} + temporaries {d['temporaries_gib']:.2f}"
        f" - aliased {d['aliased_gib']:.2f} = total {d['total_gib']:.2f} GiB; peak {d['peak_gib']:.2f} GiB"
        + held_words(d),
    ]
    search = r["remat_search"]
    if search is not None:  # model.remat=auto: its candidates were logged as they were compiled
        lines.append(
            "model.remat=auto: no HBM limit known for these devices, so the most kept set, nothing compiled"
            if not search
            else f"model.remat=auto: as recorded in {r['remat_search_from']}"
            if r["remat_search_from"]
            else f"model.remat=auto: chosen from {len(search)} compiles in {r['remat_search_s']:.0f} s"
        )
    if r["hbm_limit_gib"] is not None:
        resident = r.get("resident_gib") or 0.0
        lines.append(
            f"HBM limit {r['hbm_limit_gib']:.2f} GiB per device ({r['chip']}): peak "
            + (f"+ {resident:.2f} GiB resident (the RL engine's cache) " if resident else "")
            + f"{'fits' if r['fits'] else 'DOES NOT FIT'} (budget {r['hbm_headroom']:.0%})"
        )
    hlo = r["hlo_flops_per_device"]
    model, hardware = r["model_flops_per_device"], r["hardware_flops_per_device"]
    lines.append(
        f"TFLOP per device per step: model {model / 1e12:.1f}, "
        f"run with remat's recompute {hardware / 1e12:.1f} ({hardware / model:.3f}x), "
        f"XLA cost analysis {'n/a' if hlo is None else f'{hlo / 1e12:.1f}'}"
    )
    return "\n".join(lines)
