"""Lower and compile the real train step for a recipe, with abstract arrays only, and report what
the compiler says about it: per-device memory, whether that fits the chip's HBM, whether the fast
attention kernel is in the step, and its FLOPs. Nothing of the model's size is allocated.

Two targets:
- a TPU topology (`topology="v5p:4x4x4"`, optionally several slices): libtpu's topology description
  gives abstract devices of that pod slice and the TPU compiler compiles for them on a host without
  a TPU, Pallas/Mosaic kernels included, with the chip's flag profile (olmax.chips) as compiler
  options: the same flags the launcher sets for a run;
- the devices JAX has (`olmax compile-check --devices N` makes N fake CPU devices).

`attention=auto` resolves to the target's kernel (splash for a TPU topology), as it will when the
step runs there.
"""

from __future__ import annotations

import math
import os
import time
from typing import Optional

import jax

from olmax.chips import HBM_HEADROOM, Chip, chip_of_device_kind, chip_of_topology, compiler_options
from olmax.config import REMAT_TAGS, ConfigError, ExperimentConfig, remat_policy_of
from olmax.flops import exact_step_flops
from olmax.model.attention import resolve_backend
from olmax.sharding import make_mesh
from olmax.state import abstract_state, state_shardings
from olmax.train_step import batch_layout, batch_sharding, make_train_step

GIB = 2**30
# How a Mosaic (Pallas TPU) kernel appears in compiled TPU HLO; the step's only ones are attention's.
MOSAIC_CALL = 'custom_call_target="tpu_custom_call"'


class DoesNotFit(ConfigError):
    """The step compiles (or would) but needs more device memory than the chip has."""


def topology_devices(topology: str, num_slices: int = 1) -> list:
    """Abstract devices of `num_slices` slices of a libtpu topology ("v5p:4x4x4", "tpu7x:2x2x1")."""
    chip_of_topology(topology)  # a clear error for a name outside the chip table
    if num_slices < 1:
        raise ConfigError(f"--num-slices must be at least 1, got {num_slices}")
    # libtpu takes a host-wide lock file on load, so a second process compiling for a topology
    # (parallel tests, a second check) would fail; on a host compiling for an absent TPU there is
    # no chip to share, and libtpu allows concurrent loads with this variable.
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    from jax.experimental import topologies

    try:
        desc = topologies.get_topology_desc(platform="tpu", topology_name=topology, num_slices=num_slices)
    except Exception as e:  # libtpu's own message says what is wrong with the name
        raise ConfigError(f"libtpu does not know the topology {topology!r}: {str(e).splitlines()[0]}") from None
    return list(desc.devices)


def _per_device_bytes(tree, shardings) -> int:
    """Bytes one device holds of a pytree of abstract arrays laid out by `shardings`."""
    return sum(
        math.prod(s.shard_shape(a.shape)) * a.dtype.itemsize
        for a, s in zip(jax.tree.leaves(tree), jax.tree.leaves(shardings))
    )


def _hlo_flops(compiled) -> Optional[float]:
    cost = compiled.cost_analysis()
    if isinstance(cost, (list, tuple)):  # older jax: one dict per program
        cost = cost[0] if cost else None
    return None if not cost or "flops" not in cost else float(cost["flops"])


def _out_of_memory(e: Exception) -> Optional[str]:
    """Which device memory the TPU compiler ran out of, in words; None for any other error."""
    text = str(e)
    if "ScopedVmemOom" in text or "memory space vmem" in text:
        return (
            "scoped VMEM (a kernel's tiles are too large for the chip's limit: smaller "
            "model.splash_blocks, or the chip profile's --xla_tpu_scoped_vmem_limit_kib)"
        )
    if "RESOURCE_EXHAUSTED" in text or "memory space hbm" in text:
        return "HBM"
    return None


def compile_report(cfg: ExperimentConfig, devices=None, topology: Optional[str] = None, num_slices: int = 1) -> dict:
    if topology is not None:
        devices = topology_devices(topology, num_slices)
        chip: Optional[Chip] = chip_of_topology(topology)
    else:
        devices = list(devices if devices is not None else jax.devices())
        chip = chip_of_device_kind(devices[0].device_kind)
    platform = devices[0].platform
    mesh = make_mesh(cfg.mesh, devices)
    layout = batch_layout(cfg, mesh)
    shardings = state_shardings(cfg, mesh)
    options = compiler_options(chip) if chip is not None and platform == "tpu" else {}
    where = topology or f"{mesh.size} {platform} devices"
    with jax.set_mesh(mesh):
        state = abstract_state(cfg, mesh)
        rows = jax.ShapeDtypeStruct(
            (cfg.trainer.global_batch, cfg.data.seq_len), "int32", sharding=batch_sharding(cfg, mesh)
        )
        # the loader's batch: with doc masking its doc_lens ride along, shaped and placed as the tokens
        batch = {"input_ids": rows, **({"doc_lens": rows} if cfg.data.doc_masking else {})}
        t0 = time.perf_counter()
        # No data is read here, so an epoch horizon (schedule.t_max_epochs) counts trainer.max_steps batches
        # per epoch: the horizon is a constant of the learning rate alone, no shape or buffer depends on it.
        lowered = make_train_step(cfg, mesh, epoch_batches=cfg.trainer.max_steps).lower(state, batch)
        t1 = time.perf_counter()
        try:
            compiled = lowered.compile(compiler_options=options or None)
        except Exception as e:
            memory = _out_of_memory(e)
            if memory:
                raise DoesNotFit(
                    f"{cfg.name} does not fit on {where}: the TPU compiler ran out of {memory} "
                    f"({str(e).splitlines()[0][:300]})"
                ) from None
            raise
        t2 = time.perf_counter()
    mem = compiled.memory_analysis()
    per_device = {
        "arguments_gib": mem.argument_size_in_bytes / GIB,
        "outputs_gib": mem.output_size_in_bytes / GIB,
        "temporaries_gib": mem.temp_size_in_bytes / GIB,
        "aliased_gib": mem.alias_size_in_bytes / GIB,  # outputs written over donated arguments
        "code_gib": mem.generated_code_size_in_bytes / GIB,
    }
    per_device["total_gib"] = (
        per_device["arguments_gib"]
        + per_device["outputs_gib"]
        + per_device["temporaries_gib"]
        + per_device["code_gib"]
        - per_device["aliased_gib"]
    )
    # The compiler's own figure: the most its buffer assignment holds at once, arguments and outputs
    # included, which the TPU compiler checks against the chip's limit. XLA packs temporaries into
    # one block reused across lifetimes, so this is below total_gib.
    per_device["peak_gib"] = mem.peak_memory_in_bytes / GIB
    limit = chip.hbm_limit_gib if chip is not None else None
    policy = remat_policy_of(cfg.model.remat)
    seq_len = cfg.data.seq_len
    model_flops = exact_step_flops(cfg.model, seq_len, cfg.trainer.global_batch).total / mesh.size
    return {
        "recipe": cfg.name,
        "platform": platform,
        "topology": topology,
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
        "attention": resolve_backend(cfg.model.attention, platform, cfg.model.compute_dtype),
        "libtpu_flags": sorted(f"--{k}={v}" for k, v in options.items()),
        "lower_s": t1 - t0,
        "compile_s": t2 - t1,
        "params_gib": _per_device_bytes(state.params, shardings.params) / GIB,
        "opt_state_gib": _per_device_bytes(state.opt_state, shardings.opt_state) / GIB,
        "per_device": per_device,
        "hbm_limit_gib": limit,
        "hbm_headroom": HBM_HEADROOM,
        # the compiler accepted it (or compile_report raised DoesNotFit), with headroom to spare
        "fits": None if limit is None else per_device["peak_gib"] <= HBM_HEADROOM * limit,
        "attention_kernel_calls": compiled.as_text().count(MOSAIC_CALL) if platform == "tpu" else 0,
        "hlo_flops_per_device": _hlo_flops(compiled),
        "model_flops_per_device": model_flops,
    }


def check_fits(r: dict) -> None:
    """DoesNotFit, naming the figures, when the report's per-device peak exceeds the HBM budget."""
    if r["fits"] is False:
        where = r["topology"] or f"{r['devices']} {r['platform']} devices"
        raise DoesNotFit(
            f"{r['recipe']} does not fit on {where}: per-device peak "
            f"{r['per_device']['peak_gib']:.1f} GiB > {r['hbm_headroom']:.0%} of the "
            f"{r['hbm_limit_gib']:.2f} GiB HBM limit per device of {r['chip']} (micro_batch={r['micro_batch']}, "
            f"remat={r['remat']}); try trainer.micro_batch_size or model.remat"
        )


def format_report(r: dict) -> str:
    d = r["per_device"]
    where = f"{r['topology']} x {r['num_slices']} slice(s)" if r["topology"] else r["platform"]
    lines = [
        f"{r['recipe']} on {r['devices']} {r['device_kind']} devices ({where}), mesh {r['mesh']}",
        f"per-device batch {r['per_device_batch']} = {r['accum_steps']} micro-batches of {r['micro_batch']}; "
        f"remat {r['remat']} (keeps {', '.join(r['saved']) or 'nothing'}"
        f"{'; offloads ' + ', '.join(r['offloaded']) if r['offloaded'] else ''}); "
        f"attention {r['attention']} ({r['attention_kernel_calls']} Mosaic kernel calls)",
        f"lowered in {r['lower_s']:.1f} s, compiled in {r['compile_s']:.1f} s",
        f"per device: parameters {r['params_gib']:.2f} GiB, optimizer state {r['opt_state_gib']:.2f} GiB; XLA: "
        f"arguments {d['arguments_gib']:.2f} + outputs {d['outputs_gib']:.2f} + temporaries {d['temporaries_gib']:.2f}"
        f" - aliased {d['aliased_gib']:.2f} = total {d['total_gib']:.2f} GiB; peak {d['peak_gib']:.2f} GiB",
    ]
    if r["hbm_limit_gib"] is not None:
        lines.append(
            f"HBM limit {r['hbm_limit_gib']:.2f} GiB per device ({r['chip']}): peak "
            f"{'fits' if r['fits'] else 'DOES NOT FIT'} (budget {r['hbm_headroom']:.0%})"
        )
    hlo = r["hlo_flops_per_device"]
    lines.append(
        f"TFLOP per device per step: model {r['model_flops_per_device'] / 1e12:.1f}, "
        f"XLA cost analysis {'n/a' if hlo is None else f'{hlo / 1e12:.1f}'}"
    )
    return "\n".join(lines)
