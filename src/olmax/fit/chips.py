"""What olmax knows about each accelerator chip, in ONE table: peak FLOP/s and HBM per JAX device,
JAX devices per chip, the name of its topologies, the XLA/libtpu flag profile its runs use and, for a
GPU, XLA's target description of it (olmax/fit/gpu_targets). Plain Python (no jax import): the launcher
reads it on a host without accelerators.

Per JAX device throughout: a chip whose TensorCores show up as separate JAX devices (Ironwood, 2
per chip) gets half the chip's peak and half its HBM per device.

Device model. The table's devices are the ones a run of the chip has (jax.devices() on its VM), and
`olmax compile-check --topology` compiles for the same: libtpu's topology description must give them.
It does for v5e, v5p, v6e and Ironwood by default; for v4 libtpu 0.0.42.1 describes one device per
TensorCore ("v4:2x2x1": 8 devices of one core each), where a v4 VM runs one megacore device per chip
(4 devices of two cores: JAX's ChipVersion table, "v4: megacore support"; a v4-32 VM lists one device
per chip coordinate), so v4's entry asks libtpu for its "megacore" chip config (libtpu_chip_config).
olmax.fit.compiler.topology_devices refuses a description whose devices differ from the entry's (kind,
devices per chip), naming both, and tests/fit/test_chips.py compares them for every chip. On a v5e VM
the runtime's device was libtpu's for v5e:1x1 ("TPU v5 lite", coordinates (0, 0, 0), core 0 of one).

Flag profiles. The launcher passes a TPU chip's profile to every worker as LIBTPU_INIT_ARGS
(olmax.launch.xpk) and `olmax compile-check --topology` compiles with the same flags (as compiler
options), so what is checked is what runs. Sources:
  --xla_tpu_scoped_vmem_limit_kib: the scoped VMEM a kernel may use (default 16 MiB on v5p). 64 MiB
      is the value MaxText's TPU recipes set (benchmarks/maxtext_trillium_model_configs.py and
      xla_flags_library.py); it lets splash attention's 2048-token blocks compile (docs/attention.md).
  v4 has no profile: its VMEM holds 16 MiB in all, which no scoped limit raises (splash's default
      tiles at 8192 tokens: "Used 27.00M of 16.00M vmem" with a 32 or 64 MiB limit as without one, on
      libtpu 0.0.42.1), so on v4 splash needs smaller model.splash_blocks.
  SparseCore collective offload (Ironwood): MaxText benchmarks/xla_flags_library.py,
      ENABLE_SPARSECORE_OFFLOADING_FOR_RS_AG_AR plus its ENABLE_SPARSECORE_OFFLOADING_BASE_FLAGS: the
      FSDP all-gathers, reduce-scatters and all-reduces run on the SparseCores instead of the
      TensorCores (the flag set of the MaxText OLMo 3 run's 41% -> 44.5% MFU on Ironwood). One base
      flag, --xla_sc_disjoint_spmem, is left out: libtpu 0.0.42.1 refuses it ("No such compile option").
HBM per device of a TPU chip is the most a program may use, as libtpu 0.0.42.1's compiler enforces
it: the largest program it accepts for one device of each topology ("Ran out of memory in memory
space hbm. Used 94.75G of 94.75G hbm" one step above, on tpu7x). These are above the datasheets'
GB / 2^30 (89.4, 88.5, 29.8 GiB) for v5p, Ironwood and v6e, and below the GiB of v4's (32) and v5e's
(16). tests/fit/test_compile_check.py compiles a program just under and just over each limit. On a
real v5e the runtime reports the same figure (memory_stats() bytes_limit 16,909,336,064 = 15.75 GiB).

A host's own TPU. `olmax train`, `demo`, `generate` and the other commands that run the model apply
the profile of the TPU they find themselves (olmax.cli.common.runs_on -> tpu_profile_env), not only
under the launcher: the chip is named by TPU_ACCELERATOR_TYPE, which a TPU VM sets ("v5litepod-4"),
else by the PCI device id of its Google devices (vendor 0x1ae0), the ids jax 0.10.2 itself reads
(jax/_src/hardware_utils.py, _TPU_PCI_DEVICE_IDS). Without the profile, splash attention's default
tiles do not compile on v5e ("CompileTimeScopedVmemOom ... splash_mha_fwd_residuals").

HBM bandwidth per JAX device (hbm_gbps, GB/s), for decode's bandwidth bound: Cloud TPU docs (v4 1200,
v5e 819, v5p 2765, v6e 1640, Ironwood 7380 per chip, halved per TensorCore device), NVIDIA datasheets (H100 SXM
3350, H200 4800, B200 8000).

Every flag here is accepted by libtpu 0.0.42.1's compiler (tests/fit/test_compile_check.py compiles with
the tpu7x and v5p profiles; v6e's is v5p's).

GPU profile (GPU_XLA_FLAGS, GPU_ENV): the Slurm launcher exports it to every trainer (XLA_FLAGS and
the variables; olmax.launch.slurm) and `olmax compile-check --topology h100:NxG` compiles with the same
XLA flags as compiler options. Sources:
  --xla_gpu_enable_latency_hiding_scheduler: JAX's GPU performance tips (docs/gpu_performance_tips.md,
      "XLA performance flags") and NVIDIA JAX-Toolbox's images, which set it by default: the scheduler
      moves the FSDP all-gathers and reduce-scatters to overlap the layers' compute.
  the rest, with their values: MaxText's H100 (A3) recipe, src/MaxText/configs/a3/llama_2_7b/4vm.sh
      (Llama 2 7B, FSDP over 8 GPUs per node): collectives combined up to 512 MiB (all-reduce),
      128 MiB (all-gather) and 64 MiB (reduce-scatter), and not split by dimension; all-gather,
      reduce-scatter and all-reduce pipelined across the layer loop with double buffering; the
      cuBLAS GEMMs rather than Triton's; XLA's own rematerialization pass off (the remat policy is
      the model's: model.remat); the collectives on the highest-priority stream. Command buffers
      (CUDA graphs) off: MaxText's --xla_gpu_graph_level=0, spelled as jaxlib 0.10.2 takes it
      (--xla_gpu_enable_command_buffer= with no command types).
  XLA_PYTHON_CLIENT_MEM_FRACTION=0.90: JAX preallocates 75% of a GPU's memory by default (JAX's "GPU
      memory allocation" page); NVIDIA JAX-Toolbox's "Tips for High-Performance LLMs with JAX and XLA"
      sets 0.9 (the rest for CUDA, cuDNN, cuBLAS and NCCL), as MaxText's GPU scripts do. It is also the
      HBM budget of a GPU compile-check (GPU_MEM_FRACTION).
  NCCL_LL128_BUFFSIZE=-2, NCCL_LL_BUFFSIZE=-2, NCCL_PROTO=SIMPLE,LL,LL128: JAX's GPU performance tips
      ("NCCL flags", which it recommends for collectives within one node; they apply to the NVLink
      collectives of every node).
Every XLA flag here is accepted by jaxlib 0.10.2's GPU compiler (tests/fit/test_compile_check_gpu.py).
"""

from __future__ import annotations

import glob
import math
import os
import re
from dataclasses import dataclass
from typing import Mapping, Optional

from olmax.errors import ConfigError

SCOPED_VMEM_64MIB = ("--xla_tpu_scoped_vmem_limit_kib=65536",)

SPARSECORE_COLLECTIVE_OFFLOAD = (
    "--xla_tpu_enable_async_collective_fusion_fuse_all_gather=false",
    "--xla_tpu_enable_async_collective_fusion_fuse_all_reduce=false",
    "--xla_tpu_enable_async_collective_fusion_fuse_reduce_scatter=false",
    "--xla_tpu_enable_sparse_core_collective_offload_all_gather=true",
    "--xla_tpu_enable_sparse_core_collective_offload_reduce_scatter=true",
    "--xla_tpu_enable_sparse_core_collective_offload_all_reduce=true",
    "--xla_tpu_use_tc_device_shape_on_sc=true",
    "--xla_sc_enable_instruction_fusion=false",
    "--xla_sc_disable_megacore_partitioning=true",
)


# The GPU profile (sources above). One for every GPU chip: the H100's and H200's are one design.
GPU_XLA_FLAGS = (
    "--xla_gpu_enable_latency_hiding_scheduler=true",
    "--xla_gpu_enable_triton_gemm=false",
    "--xla_gpu_enable_command_buffer=",
    "--xla_gpu_enable_highest_priority_async_stream=true",
    "--xla_gpu_all_reduce_combine_threshold_bytes=536870912",
    "--xla_gpu_all_gather_combine_threshold_bytes=134217728",
    "--xla_gpu_reduce_scatter_combine_threshold_bytes=67108864",
    "--xla_gpu_enable_pipelined_all_gather=true",
    "--xla_gpu_enable_pipelined_reduce_scatter=true",
    "--xla_gpu_enable_pipelined_all_reduce=true",
    "--xla_gpu_enable_while_loop_double_buffering=true",
    "--xla_gpu_enable_all_gather_combine_by_dim=false",
    "--xla_gpu_enable_reduce_scatter_combine_by_dim=false",
    "--xla_disable_hlo_passes=rematerialization",
)
GPU_MEM_FRACTION = 0.90
GPU_ENV = (
    ("XLA_PYTHON_CLIENT_MEM_FRACTION", f"{GPU_MEM_FRACTION:.2f}"),
    ("NCCL_LL128_BUFFSIZE", "-2"),
    ("NCCL_LL_BUFFSIZE", "-2"),
    ("NCCL_PROTO", "SIMPLE,LL,LL128"),
)


@dataclass(frozen=True, kw_only=True)
class Chip:
    """One accelerator chip, everything olmax knows of it (a new chip is one entry of CHIPS:
    docs/extending.md, "A chip")."""

    name: str
    platform: str  # the JAX platform: "tpu" or "gpu"
    peak_tflops: float  # dense (not 2:4-sparse) bf16, per JAX device
    hbm_limit_gib: float  # per JAX device: what a program may use (TPU: the limit its compiler enforces)
    devices_per_chip: int = 1
    topology: Optional[str] = None  # the prefix of its topology names ("v5p" in "v5p:4x4x4", "h100" in "h100:2x8")
    device_kind: Optional[str] = None  # jax.Device.device_kind of its devices
    libtpu_flags: tuple[str, ...] = ()  # TPU: the flag profile (LIBTPU_INIT_ARGS)
    xla_flags: tuple[str, ...] = ()  # GPU: the flag profile (XLA_FLAGS)
    gpu_target: Optional[str] = None  # GPU: XLA's target description, a file of olmax/fit/gpu_targets
    hbm_gbps: Optional[float] = None  # HBM bandwidth per JAX device, GB/s
    tpu_type: Optional[str] = None  # TPU: the family of its TPU type names, "v5litepod" in "v5litepod-16"
    # TPU: JAX devices per unit of the number in its TPU type names (v4, v5p count TensorCores, 2 per chip
    # and one JAX device per chip; v5e and v6e count chips; tpu7x counts TensorCores, each its own device)
    type_unit_devices: Optional[float] = None
    torus_dims: int = (
        2  # TPU: its slices' torus, 2D (v5e, v6e) or 3D (v4, v5p, Ironwood): each version's Cloud TPU topologies
    )
    pci_device_id: Optional[str] = None  # TPU: the PCI device id of its chips (vendor 0x1ae0)
    # TPU: the chip config libtpu's topology description is asked for (its `chip_config_name`), where its
    # default is not the device model a run of the chip has (see "Device model" in the module doc)
    libtpu_chip_config: Optional[str] = None
    aliases: tuple[str, ...] = ()  # other names --chip takes
    source: str = ""  # where its peak and devices per chip come from (docs/flops.md's table)

    @property
    def hbm_headroom(self) -> float:
        """The fraction of hbm_limit_gib a step's peak may use (HBM_HEADROOM, GPU_MEM_FRACTION)."""
        return GPU_MEM_FRACTION if self.platform == "gpu" else HBM_HEADROOM

    @property
    def type_family(self) -> Optional[str]:
        """TPU: the family of its TPU type names (v5litepod for v5e, else the topology's prefix)."""
        return (self.tpu_type or self.topology) if self.platform == "tpu" else None


def _gpu(name: str, peak_tflops: float, memory_bytes: int, device_kind: str, hbm_gbps: float, source: str) -> Chip:
    """An NVIDIA GPU: one JAX device, topologies "NAME:NxG", the GPU profile, XLA's target description
    olmax/fit/gpu_targets/NAME.txtpb; its HBM is the memory the device reports (the target's device_memory_size)."""
    return Chip(
        name=name,
        platform="gpu",
        peak_tflops=peak_tflops,
        hbm_limit_gib=memory_bytes / 2**30,
        topology=name,
        device_kind=device_kind,
        xla_flags=GPU_XLA_FLAGS,
        gpu_target=f"{name}.txtpb",
        hbm_gbps=hbm_gbps,
        source=source,
    )


CHIPS: dict[str, Chip] = {
    c.name: c
    for c in (
        _gpu(
            "h100",
            989.0,
            84942979072,
            "NVIDIA H100 80GB HBM3",
            3350.0,
            "NVIDIA H100 SXM datasheet: 989 TFLOPS bf16 dense (1979 is the 2:4-sparse figure), 80 GB HBM3",
        ),
        _gpu(
            "h200",
            989.0,
            151397597184,
            "NVIDIA H200 141GB HBM3e",
            4800.0,
            "NVIDIA H200 SXM datasheet: the H100's tensor cores, 989 dense; 141 GB HBM3e",
        ),
        _gpu(
            "b200",
            2250.0,
            191514411008,
            "NVIDIA B200",
            8000.0,
            "NVIDIA HGX B200 datasheet: 2.25 PFLOPS bf16 dense per GPU (4.5 with 2:4 sparsity), 180 GB HBM3e",
        ),
        Chip(
            name="v4",
            platform="tpu",
            peak_tflops=275.0,
            hbm_limit_gib=30.74,
            topology="v4",
            device_kind="TPU v4",
            hbm_gbps=1200.0,
            type_unit_devices=0.5,
            torus_dims=3,
            pci_device_id="0x005e",
            libtpu_chip_config="megacore",
            source="Cloud TPU v4 docs: 275 TFLOPs bf16 per chip, 32 GiB HBM2 at 1200 GB/s; two TensorCores, "
            "one JAX device per chip (megacore)",
        ),
        Chip(
            name="v5p",
            platform="tpu",
            peak_tflops=459.0,
            hbm_limit_gib=95.74,
            topology="v5p",
            device_kind="TPU v5",
            libtpu_flags=SCOPED_VMEM_64MIB,
            hbm_gbps=2765.0,
            type_unit_devices=0.5,
            torus_dims=3,
            pci_device_id="0x0062",
            source="Cloud TPU v5p docs: 459 TFLOPs bf16 per chip; two TensorCores, one JAX device per chip (megacore)",
        ),
        Chip(
            name="v5e",
            platform="tpu",
            peak_tflops=197.0,
            hbm_limit_gib=15.75,
            topology="v5e",
            device_kind="TPU v5 lite",
            libtpu_flags=SCOPED_VMEM_64MIB,
            hbm_gbps=819.0,
            tpu_type="v5litepod",
            type_unit_devices=1,
            pci_device_id="0x0063",
            aliases=("v5litepod",),
            source="Cloud TPU v5e docs: 197 TFLOPs bf16 per chip, one TensorCore, 16 GB HBM at 819 GB/s; its TPU "
            "types are named v5litepod-N",
        ),
        Chip(
            name="v6e",
            platform="tpu",
            peak_tflops=918.0,
            hbm_limit_gib=31.24,
            topology="v6e",
            device_kind="TPU v6 lite",
            libtpu_flags=SCOPED_VMEM_64MIB,
            hbm_gbps=1640.0,
            type_unit_devices=1,
            pci_device_id="0x006f",
            source="Cloud TPU v6e (Trillium) docs: 918 TFLOPs bf16 per chip, one TensorCore",
        ),
        Chip(
            name="tpu7x",
            platform="tpu",
            peak_tflops=2307.0 / 2,
            hbm_limit_gib=94.74,
            devices_per_chip=2,
            topology="tpu7x",
            device_kind="TPU7x",
            libtpu_flags=SCOPED_VMEM_64MIB + SPARSECORE_COLLECTIVE_OFFLOAD,
            hbm_gbps=7380.0 / 2,
            type_unit_devices=1,
            torus_dims=3,
            pci_device_id="0x0076",
            aliases=("ironwood",),
            source="Cloud TPU7x (Ironwood) docs: 2307 TFLOPs bf16 per chip (4614 FP8); two TensorCores, each its "
            "own JAX device",
        ),
    )
}


def chip_names() -> list[str]:
    """Every name --chip takes: the table's, then their aliases."""
    return [*CHIPS, *(a for c in CHIPS.values() for a in c.aliases)]


# A step fits a TPU chip when the TPU compiler accepts it and its peak (compile_check: per_device.peak_gib) is at
# most this fraction of hbm_limit_gib. The rest covers what that peak leaves out of what the chip holds
# (compile_check: per_device.hbm_gib, the compiler's heap, packing gaps included, and the program's
# code). Measured on a v5e, the chip held 9% more than the peak for a 2 GiB step and 3% more for 11 and
# 13 GiB ones, heap + code within 1% of it (docs/performance/memory-and-fit.md); the rest covers what no program
# counts (the next batch being transferred, the runtime's own buffers).
HBM_HEADROOM = 0.95


def get_chip(name: str) -> Chip:
    key = name.lower()
    chip = CHIPS.get(key) or next((c for c in CHIPS.values() if key in c.aliases), None)
    if chip is None:
        raise ConfigError(f"unknown chip {name!r}; known: {', '.join(chip_names())}")
    return chip


def chip_of_topology(topology: str) -> Chip:
    """The chip of a topology name: libtpu's for a TPU ("v5p:4x4x4" -> v5p) or Cloud TPU's accelerator
    type ("v5p-128", libtpu_topology), NODESxGPUS for a GPU cluster ("h100:64x8" -> h100)."""
    prefix, sep, shape = libtpu_topology(topology).partition(":")
    for chip in CHIPS.values():
        if chip.topology == prefix and sep and shape:
            return chip
    tpus = ", ".join(f"{c.topology}:AxB[xC]" for c in CHIPS.values() if c.topology and c.platform == "tpu")
    gpus = ", ".join(f"{c.topology}:NxG" for c in CHIPS.values() if c.topology and c.platform == "gpu")
    types = ", ".join(f"{c.type_family}-N" for c in CHIPS.values() if c.platform == "tpu")
    raise ConfigError(
        f"unknown TPU topology {topology!r}, nor a GPU cluster; known forms: TPU {tpus} (e.g. v5p:4x4x4, tpu7x:2x2x1) "
        f"or Cloud TPU's accelerator types {types} (e.g. v5litepod-16, v5p-128); GPU {gpus} (N nodes of G GPUs, "
        "e.g. h100:64x8)"
    )


def gpu_cluster(topology: str) -> tuple[Chip, int, int]:
    """A GPU topology "h100:NxG" -> (chip, N nodes, G GPUs per node)."""
    chip = chip_of_topology(topology)
    shape = topology.partition(":")[2].split("x")
    if chip.platform != "gpu" or len(shape) != 2 or not all(s.isdigit() and int(s) > 0 for s in shape):
        raise ConfigError(f"GPU topology {topology!r} is not {chip.topology}:NxG (N nodes of G GPUs, e.g. h100:64x8)")
    return chip, int(shape[0]), int(shape[1])


# Cloud TPU's accelerator types: FAMILY-N, as gcloud, xpk and a TPU VM's TPU_ACCELERATOR_TYPE name a slice.
_TPU_TYPE = re.compile(r"^([a-z][a-z0-9]*)-([0-9]+)$")


def slice_shape(chips: float, three_d: bool) -> Optional[tuple[int, ...]]:
    """The chips of a slice as Cloud TPU lays them out, or None for a count no slice has. 2D (v5e, v6e):
    1x1, 2x2, 2x4, 4x4, 4x8, 8x8, 8x16, 16x16. 3D (v5p, Ironwood): 2x2x1 for 4 chips, then each
    doubling doubles the last axis once, then the axes from the last to the first in turn (2x2x2,
    2x2x4, 2x4x4, 4x4x4, 4x4x8, 4x8x8, 8x8x8, ...)."""
    n = int(chips)
    if n != chips or n < 1 or n & (n - 1):
        return None
    k = n.bit_length() - 1
    if not three_d:
        return (1, 1) if n == 1 else None if n == 2 or k > 8 else (2 ** (k // 2), 2 ** (k - k // 2))
    if n < 4:
        return None
    shape = [2, 2, 1]
    for i in range(k - 2):
        axis = 2 if i == 0 else 2 - (i - 1) % 3
        shape[axis] *= 2
    return tuple(shape)


def libtpu_topology(name: str) -> str:
    """`name` as libtpu names a topology: Cloud TPU's accelerator type becomes its slice's shape
    (v5litepod-16 -> v5e:4x4, v5p-128 -> v5p:4x4x4, v6e-256 -> v6e:16x16, tpu7x-128 -> tpu7x:4x4x4); any
    other name (a libtpu topology, a GPU cluster, a name no chip has) comes back as given."""
    match = _TPU_TYPE.match(name.lower())
    chip = chip_of_tpu_type(name.lower()) if match else None
    if chip is None:
        return name
    family, count = match.group(1), int(match.group(2))
    shape = slice_shape(count * chip.type_unit_devices / chip.devices_per_chip, chip.torus_dims == 3)
    if shape is None:
        sizes = [
            n
            for n in (2**i for i in range(15))
            if slice_shape(n * chip.type_unit_devices / chip.devices_per_chip, chip.torus_dims == 3)
        ]
        raise ConfigError(f"{name}: no {family} slice has {count}; {family}-N takes N in {', '.join(map(str, sizes))}")
    return f"{chip.topology}:{'x'.join(map(str, shape))}"


def tpu_type(topology: str) -> Optional[str]:
    """The TPU type of one slice of a libtpu topology, as a TPU VM's TPU_ACCELERATOR_TYPE names it
    (v5p:4x4x4 -> v5p-128, tpu7x:2x2x1 -> tpu7x-8); None for a name that is not a TPU's AxB[xC]."""
    topology = libtpu_topology(topology)
    chip = chip_of_topology(topology)
    shape = topology.partition(":")[2].split("x")
    if chip.platform != "tpu" or not all(s.isdigit() for s in shape):
        return None
    devices = math.prod(int(s) for s in shape) * chip.devices_per_chip
    return f"{chip.type_family}-{round(devices / chip.type_unit_devices)}"


def chip_of_tpu_type(name: str) -> Optional[Chip]:
    """The chip of a TPU type name as a TPU VM's TPU_ACCELERATOR_TYPE gives it ("v5litepod-4", "v5p-128")."""
    family = name.rpartition("-")[0]
    return next((c for c in CHIPS.values() if c.type_family == family), None)


def chip_of_host(environ: Mapping[str, str], sysfs: str = "/sys") -> Optional[Chip]:
    """The TPU chip this host has, found without starting the TPU runtime (see the module docstring):
    TPU_ACCELERATOR_TYPE, else the PCI device ids of its Google devices. None: no TPU in the table."""
    if environ.get("TPU_ACCELERATOR_TYPE"):
        return chip_of_tpu_type(environ["TPU_ACCELERATOR_TYPE"])
    ids = set()
    for vendor in glob.glob(os.path.join(sysfs, "bus/pci/devices/*/vendor")):
        with open(vendor) as f:
            if f.read().strip() != "0x1ae0":
                continue
        with open(os.path.join(os.path.dirname(vendor), "device")) as f:
            ids.add(f.read().strip())
    return next((c for c in CHIPS.values() if c.pci_device_id in ids), None)


def with_libtpu_flags(given: str, chip: Chip) -> str:
    """LIBTPU_INIT_ARGS `given` plus the chip's profile: a flag the user already set keeps the user's value."""
    named = {arg.removeprefix("--").partition("=")[0] for arg in given.split()}
    extra = [f for f in chip.libtpu_flags if f.removeprefix("--").partition("=")[0] not in named]
    return " ".join([*given.split(), *extra])


def chip_of_device_kind(kind: str) -> Optional[Chip]:
    """The chip whose devices report this device_kind, if the table has it."""
    return next((c for c in CHIPS.values() if c.device_kind == kind), None)


def chip_of_device(device) -> Optional[Chip]:
    """The chip of a JAX device (a CPU has none: None). A TPU or GPU the table does not know is an error
    naming its device_kind: its HBM bound and flag profile are unknown, so nothing that fits it can be
    planned (add it: docs/extending.md, "A chip")."""
    chip = chip_of_device_kind(device.device_kind)
    if chip is None and device.platform in ("tpu", "gpu"):
        raise ConfigError(
            f"the {device.platform} device kind {device.device_kind!r} is not in olmax's chip table "
            f"(olmax.fit.chips.CHIPS: {', '.join(CHIPS)}); add its entry (docs/extending.md, 'A chip')"
        )
    return chip


def compiler_options(chip: Chip) -> dict[str, object]:
    """The chip's flag profile (libtpu's or XLA's) as `jax.stages.Lowered.compile(compiler_options=...)`
    takes it. libtpu parses every value from its text; XLA's GPU compiler (jaxlib 0.10.2) refuses the
    text "true" for a boolean option ("'true' is not a valid bool value") and takes a Python bool."""
    options: dict[str, object] = {}
    for flag in chip.libtpu_flags:
        key, _, value = flag.removeprefix("--").partition("=")
        options[key] = value
    for flag in chip.xla_flags:
        key, _, value = flag.removeprefix("--").partition("=")
        options[key] = {"true": True, "false": False}.get(value, value)
    return options


def libtpu_init_args(chip: Chip) -> str:
    """The chip's flag profile as the LIBTPU_INIT_ARGS environment variable takes it."""
    return " ".join(chip.libtpu_flags)


def gpu_env(chip: Optional[Chip] = None) -> list[tuple[str, str]]:
    """A GPU chip's profile (without one: GPU_XLA_FLAGS, every GPU chip's) as the environment of its
    trainer processes: XLA_FLAGS and GPU_ENV."""
    return [("XLA_FLAGS", " ".join(chip.xla_flags if chip is not None else GPU_XLA_FLAGS)), *GPU_ENV]


def chip_peak(name: str) -> float:
    """Peak dense bf16 TFLOP/s per JAX device of a named chip (olmax.fit.chips)."""
    return get_chip(name).peak_tflops


def resolve_peak(peak: Optional[float], chip: Optional[str]) -> Optional[float]:
    """The per-device peak from --peak or --chip (at most one of them)."""
    if peak is not None and chip is not None:
        raise ConfigError("give at most one of --peak and --chip")
    if peak is not None and peak <= 0:
        raise ConfigError(f"--peak must be positive, got {peak}")
    return chip_peak(chip) if chip is not None else peak


# -- the table as the docs show it (tests/test_docs.py holds docs/flops.md and docs/launcher.md to these) --

# The flag sets of the TPU profiles, by what they do
PROFILE_NAMES = {
    SCOPED_VMEM_64MIB: "scoped VMEM 64 MiB",
    SPARSECORE_COLLECTIVE_OFFLOAD: "SparseCore collective offload",
}


def profile_words(chip: Chip) -> str:
    """A TPU chip's flag profile by the names of its flag sets ("none" for libtpu's defaults)."""
    names = [name for flags, name in PROFILE_NAMES.items() if set(flags) <= set(chip.libtpu_flags)]
    return ", ".join(names) or "none"


def peak_table() -> str:
    """The peak per JAX device of every chip, as docs/flops.md's Markdown table."""
    rows = ["| chip | per device | devices per chip | source |", "|---|---|---|---|"]
    for c in CHIPS.values():
        named = " ".join([f"`{c.name}`", *(f"(`{a}`)" for a in c.aliases)])
        rows.append(f"| {named} | {c.peak_tflops:g} | {c.devices_per_chip} | {c.source} |")
    return "\n".join(rows)


def tpu_type_table() -> str:
    """Cloud TPU's types of every TPU chip (what `--total-devices` is checked against and the profile the
    launcher passes), as docs/launcher.md's Markdown table."""
    rows = [
        "| TPU type | chip | chips | JAX devices | flag profile (LIBTPU_INIT_ARGS) |",
        "|---|---|---|---|---|",
    ]
    for c in CHIPS.values():
        if c.platform != "tpu":
            continue
        per_n = c.type_unit_devices / c.devices_per_chip
        chips = "N" if per_n == 1 else f"N/{round(1 / per_n)}"
        devices = "N" if c.type_unit_devices == 1 else f"N/{round(1 / c.type_unit_devices)}"
        each = f" ({c.devices_per_chip} a chip)" if c.devices_per_chip > 1 else ""
        rows.append(f"| {c.type_family}-N | {c.name} | {chips} | {devices}{each} | {profile_words(c)} |")
    return "\n".join(rows)
