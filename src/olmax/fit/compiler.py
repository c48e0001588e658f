"""The real train step lowered and compiled for a target without its devices: a TPU topology (libtpu's
topology description), a GPU cluster (XLA's GPU compiler from its target description) or JAX's own
devices, with the chip's flag profile as compiler options; the compiler's memory figures, and its
out-of-memory refusals as DoesNotFit. olmax.fit.compile_check reports on it, olmax.fit.remat chooses
model.remat=auto with it, olmax.rollout.compile_decode compiles the rollout sampler with it."""

from __future__ import annotations

import collections
import contextlib
import os
import re
import tempfile
import time
from importlib import resources
from pathlib import Path
from typing import Any, NamedTuple, Optional

import jax

from olmax.config.experiment import ExperimentConfig
from olmax.errors import ConfigError
from olmax.extras import require
from olmax.fit.chips import (
    Chip,
    chip_of_device,
    chip_of_topology,
    compiler_options,
    gpu_cluster,
    libtpu_topology,
)
from olmax.model.attention import cudnn_target
from olmax.step.state import abstract_state
from olmax.step.train_step import abstract_batch, make_train_step

GIB = 2**30

# How a Mosaic (Pallas TPU) kernel appears in compiled TPU HLO; the step's only ones are attention's.
MOSAIC_CALL = 'custom_call_target="tpu_custom_call"'

# A Mosaic call's instruction is named after its kernel (splash_mha_fwd_residuals.3 = ... custom-call):
# the kernel's name, without the numbering XLA appends
MOSAIC_KERNEL = re.compile(r"^\s*(?:ROOT )?%([A-Za-z_]+)[.\w]* = [^\n]*" + re.escape(MOSAIC_CALL), re.MULTILINE)

# How cuDNN's fused attention appears in compiled GPU HLO: forward and backward calls
# (__cudnn$fmhaSoftmax, __cudnn$fmhaSoftmaxBackward, ...).
CUDNN_ATTENTION_CALL = 'custom_call_target="__cudnn$fmha'
KERNEL_CALLS = {"tpu": MOSAIC_CALL, "gpu": CUDNN_ATTENTION_CALL}


class DoesNotFit(ConfigError):
    """The step compiles (or would) but needs more device memory than the chip has."""


class CompilerRefused(DoesNotFit):
    """The compiler ran out of device memory: `memory` names which ("HBM", or a kernel's scoped VMEM,
    which no remat policy changes), `reason` says so in the compiler's words."""

    def __init__(self, message: str, memory: str, reason: str):
        super().__init__(message)
        self.memory, self.reason = memory, reason


def topology_devices(topology: str, num_slices: int = 1) -> list:
    """Abstract devices of `num_slices` slices of a libtpu topology ("v5p:4x4x4", "tpu7x:2x2x1"), or
    of a GPU cluster ("h100:64x8")."""
    topology = libtpu_topology(topology)  # Cloud TPU's accelerator types too (v5p-128)
    if chip_of_topology(topology).platform == "gpu":  # a clear error for a name outside the chip table
        if num_slices != 1:
            raise ConfigError(f"--num-slices is for TPU slices; a GPU topology names its nodes: {topology}")
        return gpu_devices(topology)
    if num_slices < 1:
        raise ConfigError(f"--num-slices must be at least 1, got {num_slices}")
    # libtpu takes a host-wide lock file on load, so a second process compiling for a topology
    # (parallel tests, a second check) would fail; on a host compiling for an absent TPU there is
    # no chip to share, and libtpu allows concurrent loads with this variable.
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    require("libtpu", f"compiling for the TPU topology {topology}")
    from jax.experimental import topologies

    # libtpu assumes hosts of 2x2x1 chips; a slice smaller than that (v5e:1x1, a v5litepod-1) is one host
    # of exactly its own chips, as TPU VMs of those types are
    shape = [int(d) for d in topology.partition(":")[2].split("x") if d.isdigit()]
    options = {"chips_per_host_bounds": (*shape, 1, 1)[:3]} if shape and min(shape[:2]) < 2 else {}
    chip = chip_of_topology(topology)
    if chip.libtpu_chip_config:  # the device model a run of the chip has (olmax.fit.chips, "Device model")
        options["chip_config_name"] = chip.libtpu_chip_config
    try:
        desc = topologies.get_topology_desc(platform="tpu", topology_name=topology, num_slices=num_slices, **options)
    except Exception as e:  # libtpu's own message says what is wrong with the name
        raise ConfigError(f"libtpu does not know the topology {topology!r}: {str(e).splitlines()[0]}") from None
    devices = list(desc.devices)
    check_device_model(chip, topology, devices)
    return devices


def check_device_model(chip: Chip, topology: str, devices: list) -> None:
    """ConfigError, naming both, where libtpu's devices of `topology` are not the chip table's: another
    device kind, or another number of devices a chip (those that share a chip's coordinates in a slice).
    A program compiled for them would not be the one a run of the chip compiles."""
    per_chip = collections.Counter((getattr(d, "slice_index", 0), tuple(d.coords)) for d in devices)
    kinds, counts = {d.device_kind for d in devices}, set(per_chip.values())
    if kinds != {chip.device_kind} or counts != {chip.devices_per_chip}:
        raise ConfigError(
            f"libtpu describes {topology} as {len(devices)} {'/'.join(sorted(kinds))} devices, "
            f"{'/'.join(map(str, sorted(counts)))} a chip, where olmax's chip table has {chip.devices_per_chip} "
            f"{chip.device_kind} device(s) a chip, as a run of {chip.name} has them: a program compiled for "
            f"libtpu's devices is not the one that runs (olmax.fit.chips.CHIPS[{chip.name!r}]: its device_kind, "
            "devices_per_chip or libtpu_chip_config; docs/extending.md, 'A chip')"
        )


def gpu_devices(topology: str) -> list:
    """Abstract devices of N nodes of G GPUs ("h100:64x8") for XLA's GPU compiler, from the chip's
    target description; device i is GPU i % G of node i // G (its process_index)."""
    chip, nodes, gpus = gpu_cluster(topology)
    from jax.experimental import topologies

    # cuDNN's attention also needs nvidia-cudnn-cu12 (Makefile: CUDNN), which compiling reports itself
    require("jax_cuda12_plugin", f"compiling for {topology} (XLA's GPU compiler)")
    target = resources.files("olmax.fit.gpu_targets").joinpath(chip.gpu_target).read_text()
    try:
        desc = topologies.get_topology_desc(
            platform="cuda", topology_name=chip.name, target_config=target, topology=f"1x{nodes}x{gpus}"
        )
    except Exception as e:  # noqa: BLE001 - the plugin's own message says what is missing
        raise ConfigError(
            f"XLA's GPU compiler cannot make devices for {topology}: {str(e).splitlines()[0]} "
            "(it needs JAX_PLATFORMS=cpu on a host without a GPU)"
        ) from None
    return list(desc.devices)


def _hlo_flops(compiled) -> Optional[float]:
    cost = compiled.cost_analysis()
    if isinstance(cost, (list, tuple)):  # older jax: one dict per program
        cost = cost[0] if cost else None
    return None if not cost or "flops" not in cost else float(cost["flops"])


def _out_of_memory(e: Exception) -> Optional[str]:
    """Which device memory the TPU compiler ran out of, in words; None for any other error."""
    text = str(e)
    if "out of memory" in text.lower() and "vmem" not in text:
        return "HBM"
    if "ScopedVmemOom" in text or "memory space vmem" in text:
        return (
            "scoped VMEM (a kernel's tiles are too large for the chip's limit: smaller "
            "model.splash_blocks, or the chip profile's --xla_tpu_scoped_vmem_limit_kib)"
        )
    if "RESOURCE_EXHAUSTED" in text or "memory space hbm" in text:
        return "HBM"
    return None


def budget_gib(chip: Optional[Chip]) -> Optional[float]:
    """The most a step's peak may be per device (chips.Chip.hbm_headroom of its HBM limit), or None
    for devices the chip table does not know (CPU)."""
    return None if chip is None else chip.hbm_headroom * chip.hbm_limit_gib


class CompileResult(NamedTuple):
    """A program compiled from abstract arrays: the compiled program, the seconds lowering and
    compiling took, and the TPU compiler's heap in bytes (tpu_heap_bytes; None off TPU)."""

    compiled: Any
    lower_s: float
    compile_s: float
    heap_bytes: Optional[int]


def compile_step(cfg: ExperimentConfig, mesh, options: dict, where: str) -> CompileResult:
    """Lower and compile cfg's train step on `mesh` from abstract arrays. CompilerRefused when the
    compiler runs out of device memory."""
    devices = list(mesh.devices.flat)
    platform = devices[0].platform
    # jax's cuDNN checks ask the host's backend for the GPU generation; here it is the target's
    capability = getattr(devices[0], "compute_capability", None) if platform == "gpu" else None
    target = cudnn_target(capability) if capability else contextlib.nullcontext()
    with jax.set_mesh(mesh), target:
        state = abstract_state(cfg, mesh)
        batch = abstract_batch(cfg, mesh)  # what this run's data carries: the objective's fields
        t0 = time.perf_counter()
        # No data is read here, so an epoch horizon (schedule.t_max_epochs) counts trainer.max_steps (or one)
        # batches per epoch: the horizon is a constant of the learning rate alone, no shape or buffer depends on it.
        lowered = make_train_step(cfg, mesh, epoch_batches=cfg.trainer.max_steps or 1).lower(state, batch)
        t1 = time.perf_counter()
        compiled, heap = compile_lowered(lowered, options, f"{cfg.name} does not fit on {where}", platform)
        t2 = time.perf_counter()
    return CompileResult(compiled, t1 - t0, t2 - t1, heap)


def compile_lowered(lowered, options: dict, what: str, platform: str) -> tuple[Any, Optional[int]]:
    """lowered.compile() with the chip's compiler options: (compiled, the TPU compiler's heap in bytes,
    None off TPU); CompilerRefused, its message starting with `what`, when the compiler runs out of
    device memory. On TPU the heap comes from the compiler's memory-usage report: in the folder
    XLA_FLAGS' --xla_dump_to names, if it names one (the user's dump, kept as it is), else in a
    temporary folder given as the per-compile option xla_dump_to (which would replace the
    environment's folder, hence not both) and removed afterwards."""
    asked = re.search(r"--xla_dump_to=(\S+)", os.environ.get("XLA_FLAGS", ""))
    with contextlib.ExitStack() as stack:
        if asked:
            dump = asked.group(1)
        else:
            dump = stack.enter_context(tempfile.TemporaryDirectory(prefix="olmax-xla-"))
            if platform == "tpu":
                options = {**options, "xla_dump_to": dump}
        started = time.time()
        try:
            compiled = lowered.compile(compiler_options=options or None)
        except Exception as e:
            memory = _out_of_memory(e)
            if memory:
                reason = f"out of {memory}: {str(e).splitlines()[0][:300]}"
                raise CompilerRefused(f"{what}: the {platform.upper()} compiler ran {reason}", memory, reason) from None
            raise
        return compiled, tpu_heap_bytes(Path(dump), since=started) if platform == "tpu" else None


def tpu_heap_bytes(dump: Path, since: float = 0.0) -> Optional[int]:
    """The heap of the TPU compiler's newest memory-usage report in `dump` written at or after `since`
    (a time.time(); a dump folder may hold earlier compiles' reports): the "Total bytes" of its first
    memory space, HBM, the span its buffer assignment lays the program's arguments, outputs and
    temporaries out in, which the runtime sets aside whole, packing gaps included. XLA's peak
    (memory_analysis().peak_memory_in_bytes) counts the most live at once instead: 1-5% under the
    heap on a v5e for steps of 2 to 13 GiB (docs/performance/memory-and-fit.md). None when the compiler wrote no
    report (off TPU, or a dump whose module filter left the program out)."""
    reports = [r for r in Path(dump).glob("*memory-usage-report.txt") if r.stat().st_mtime >= since]
    newest = max(reports, key=lambda r: r.stat().st_mtime, default=None)
    match = re.search(r"Total bytes: (\d+)", newest.read_text()) if newest else None
    return int(match.group(1)) if match else None


def target(topology: Optional[str] = None, num_slices: int = 1, devices=None) -> tuple[list, Optional[Chip], str]:
    """What to compile for: (devices, chip or None, where in words) of a TPU topology or GPU cluster
    (`topology`), else of `devices` (default: JAX's)."""
    if topology is not None:
        given, topology = topology, libtpu_topology(topology)
        devices = topology_devices(topology, num_slices)
        chip: Optional[Chip] = chip_of_topology(topology)
    else:
        devices = list(devices if devices is not None else jax.devices())
        chip = chip_of_device(devices[0])
    where = topology or f"{len(devices)} {devices[0].platform} devices"
    if topology is not None and given != topology:
        where = f"{topology} ({given})"
    if devices[0].platform == "gpu" and topology is not None:
        _, nodes, gpus = gpu_cluster(topology)
        where = f"{topology} ({nodes} nodes x {gpus} GPUs)"
    return devices, chip, where


def target_options(chip: Optional[Chip], platform: str) -> dict:
    """The chip's compiler options (its flag profile, as a run sets it), none for CPU devices."""
    return compiler_options(chip) if chip is not None and platform in ("tpu", "gpu") else {}


def memory_of(compiled, heap_bytes: Optional[int] = None, limit_gib: Optional[float] = None) -> dict:
    """XLA's per-device memory figures of a compiled program, in GiB; with the TPU compiler's heap
    (compile_lowered), what the chip holds for it. `limit_gib`: the chip's HBM limit, above which a
    heap is not the program's (the compiler rematerialises further and writes no second report)."""
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
    heap = None if heap_bytes is None else heap_bytes / GIB
    if heap is not None and limit_gib is not None and heap > limit_gib:
        heap = None
    per_device["heap_gib"] = heap
    # What the chip holds for the program: the heap, set aside whole, and the program's code, which
    # lives in HBM too. On a v5e this was within 1% of the HBM a step took (tests/test_tpu.py and
    # docs/performance/memory-and-fit.md), where the peak was 6-9% under it.
    per_device["hbm_gib"] = None if heap is None else heap + per_device["code_gib"]
    return per_device
