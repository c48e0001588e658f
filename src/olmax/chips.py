"""What olmax knows about each accelerator chip, in ONE table: peak FLOP/s and HBM per JAX device,
JAX devices per chip, the libtpu name of its topologies, and the XLA/libtpu flag profile its runs
use. Plain Python (no jax import): the launcher reads it on a host without accelerators.

Per JAX device throughout: a chip whose TensorCores show up as separate JAX devices (Ironwood, 2
per chip) gets half the chip's peak and half its HBM per device.

Flag profiles. The launcher passes a TPU chip's profile to every worker as LIBTPU_INIT_ARGS
(olmax.launch.xpk) and `olmax compile-check --topology` compiles with the same flags (as compiler
options), so what is checked is what runs. Sources:
  --xla_tpu_scoped_vmem_limit_kib: the scoped VMEM a kernel may use (default 16 MiB on v5p). 64 MiB
      is the value MaxText's TPU recipes set (benchmarks/maxtext_trillium_model_configs.py and
      xla_flags_library.py); it lets splash attention's 2048-token blocks compile (docs/attention.md).
  SparseCore collective offload (Ironwood): MaxText benchmarks/xla_flags_library.py,
      ENABLE_SPARSECORE_OFFLOADING_FOR_RS_AG_AR plus its ENABLE_SPARSECORE_OFFLOADING_BASE_FLAGS: the
      FSDP all-gathers, reduce-scatters and all-reduces run on the SparseCores instead of the
      TensorCores (the flag set of the MaxText OLMo 3 run's 41% -> 44.5% MFU on Ironwood). One base
      flag, --xla_sc_disjoint_spmem, is left out: libtpu 0.0.42.1 refuses it ("No such compile option").
HBM per device of a TPU chip is the most a program may use, as libtpu 0.0.42.1's compiler enforces
it: the largest program it accepts for one device of each topology ("Ran out of memory in memory
space hbm. Used 94.75G of 94.75G hbm" one step above, on tpu7x). These are above the datasheets'
GB / 2^30 (89.4, 88.5, 29.8 GiB). tests/test_compile_check.py compiles a program just under and
just over each limit.

Every flag here is accepted by libtpu 0.0.42.1's compiler (tests/test_compile_check.py compiles with
the tpu7x and v5p profiles; v6e's is v5p's).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from olmax.config import ConfigError

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


@dataclass(frozen=True)
class Chip:
    name: str
    platform: str  # the JAX platform: "tpu" or "gpu"
    peak_tflops: float  # dense (not 2:4-sparse) bf16, per JAX device
    hbm_limit_gib: float  # per JAX device: what a program may use (TPU: the limit its compiler enforces)
    devices_per_chip: int
    topology: Optional[str] = None  # libtpu's prefix of its topology names ("v5p" in "v5p:4x4x4")
    device_kind: Optional[str] = None  # jax.Device.device_kind of its devices
    libtpu_flags: tuple[str, ...] = ()


CHIPS: dict[str, Chip] = {
    c.name: c
    for c in (
        # NVIDIA H100 SXM datasheet: 989 dense bf16 TFLOP/s (1979 with sparsity), 80 GB HBM3
        Chip("h100", "gpu", 989.0, 80e9 / 2**30, 1),
        # NVIDIA H200 SXM datasheet: the H100's tensor cores, 141 GB HBM3e
        Chip("h200", "gpu", 989.0, 141e9 / 2**30, 1),
        # Cloud TPU v5p docs: 459 TFLOP/s per chip; one JAX device per chip (megacore). HBM: below.
        Chip("v5p", "tpu", 459.0, 95.74, 1, "v5p", "TPU v5", SCOPED_VMEM_64MIB),
        # Cloud TPU v6e (Trillium) docs: 918 TFLOP/s per chip, one TensorCore per chip
        Chip("v6e", "tpu", 918.0, 31.24, 1, "v6e", "TPU v6 lite", SCOPED_VMEM_64MIB),
        # Cloud TPU7x (Ironwood) docs: 2307 TFLOP/s per chip, two TensorCores = two JAX devices per chip
        Chip(
            "tpu7x",
            "tpu",
            2307.0 / 2,
            94.74,
            2,
            "tpu7x",
            "TPU7x",
            SCOPED_VMEM_64MIB + SPARSECORE_COLLECTIVE_OFFLOAD,
        ),
    )
}
ALIASES = {"ironwood": "tpu7x"}

# A step fits when the TPU compiler accepts it and its peak (compile_check: per_device.peak_gib) is at
# most this fraction of hbm_limit_gib. The rest covers what that peak leaves out of the compiler's own
# heap (the SparseCore program's reservation and the kernels' overlays, about 20 MiB; the memory-usage
# report's total was 3% above the peak on a 1 GiB step) and what no program counts (the next batch
# being transferred, the runtime's own buffers).
HBM_HEADROOM = 0.95


def get_chip(name: str) -> Chip:
    key = ALIASES.get(name.lower(), name.lower())
    if key not in CHIPS:
        raise ConfigError(f"unknown chip {name!r}; known: {', '.join([*CHIPS, *ALIASES])}")
    return CHIPS[key]


def chip_of_topology(topology: str) -> Chip:
    """The chip of a libtpu topology name ("v5p:4x4x4" -> v5p)."""
    prefix, sep, shape = topology.partition(":")
    for chip in CHIPS.values():
        if chip.topology == prefix and sep and shape:
            return chip
    known = ", ".join(f"{c.topology}:AxB[xC]" for c in CHIPS.values() if c.topology)
    raise ConfigError(f"unknown TPU topology {topology!r}; known forms: {known} (e.g. v5p:4x4x4, tpu7x:2x2x1)")


def chip_of_device_kind(kind: str) -> Optional[Chip]:
    """The chip whose devices report this device_kind, if the table has it."""
    return next((c for c in CHIPS.values() if c.device_kind == kind), None)


def compiler_options(chip: Chip) -> dict[str, str]:
    """The chip's flag profile as `jax.stages.Lowered.compile(compiler_options=...)` takes it."""
    options = {}
    for flag in chip.libtpu_flags:
        key, _, value = flag.removeprefix("--").partition("=")
        options[key] = value
    return options


def libtpu_init_args(chip: Chip) -> str:
    """The chip's flag profile as the LIBTPU_INIT_ARGS environment variable takes it."""
    return " ".join(chip.libtpu_flags)
