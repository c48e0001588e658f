"""What every backend launches: `olmax train` with the recipe, run directory, --stop-at and overrides,
and the batch layout those will get on `--total-devices` devices.

The global batch is the recipe's and never changes with the device count; the per-device batch and
the number of accumulated micro-batches follow from it and the mesh. They are computed here with the
trainer's own functions (olmax.sharding.mesh_shape, olmax.train_step.batch_layout, on an abstract mesh)
so that a layout that does not divide is refused before anything is submitted, with the trainer's
message, and the launcher can never disagree with what the trainer will do.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from typing import Optional, Sequence

from olmax.config import ConfigError
from olmax.launch import LaunchError


@dataclass(frozen=True)
class Command:
    """One process the launcher starts: argv, plus environment variables set on top of its own."""

    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    may_fail: bool = False  # a clean-up step whose failure does not fail the attempt

    def shell(self) -> str:
        """`VAR=value ... argv`, quoted for a POSIX shell: what --dry-run prints."""
        return " ".join([*(f"{k}={shlex.quote(v)}" for k, v in self.env.items()), shlex.join(self.argv)])


@dataclass(frozen=True)
class Layout:
    total_devices: int
    mesh: dict[str, int]  # {"data", "fsdp", "tensor"} as the trainer will build it
    global_batch: int
    per_device: int  # instances per batch shard (data x fsdp device) per step
    micro_batch: int
    accum_steps: int

    def describe(self) -> str:
        mesh = " x ".join(f"{k}={v}" for k, v in self.mesh.items())
        return (f"{self.total_devices} devices (mesh {mesh}): global batch {self.global_batch} = "
                f"{self.per_device} per device x {self.global_batch // self.per_device} batch shards; "
                f"micro-batch {self.micro_batch}, {self.accum_steps} accumulation step(s)")


@dataclass(frozen=True)
class LaunchPlan:
    recipe: str
    overrides: tuple[str, ...]
    run_dir: str
    stop_at: Optional[int]
    final_step: int  # the run is done when a complete checkpoint of this step exists
    layout: Layout

    @property
    def name(self) -> str:
        """A job name: 'olmax-' + the run directory's last component, lower case, [a-z0-9-] only."""
        base = re.sub(r"[^a-z0-9-]+", "-", self.run_dir.rstrip("/").split("/")[-1].lower()).strip("-")
        return f"olmax-{base or 'run'}"

    def train_args(self) -> list[str]:
        """Arguments of `olmax train` (after the program name)."""
        args = ["train", "--recipe", self.recipe, "--run-dir", self.run_dir]
        if self.stop_at is not None:
            args += ["--stop-at", str(self.stop_at)]
        return args + list(self.overrides)


def make_plan(recipe: str, overrides: Sequence[str], run_dir: str, total_devices: int,
              stop_at: Optional[int] = None) -> LaunchPlan:
    """Resolve the recipe with the overrides (errors name the key) and lay out its global batch over
    `total_devices` devices (errors name the knob that does not divide)."""
    from olmax.recipes import resolve

    if total_devices < 1:
        raise LaunchError(f"--total-devices must be positive, got {total_devices}")
    if stop_at is not None and stop_at < 1:
        raise LaunchError(f"--stop-at must be positive, got {stop_at}")
    cfg = resolve(recipe, None, list(overrides))
    layout = batch_layout_for(cfg, total_devices)
    final = cfg.trainer.max_steps if stop_at is None else min(stop_at, cfg.trainer.max_steps)
    return LaunchPlan(recipe, tuple(overrides), str(run_dir), stop_at, final, layout)


def batch_layout_for(cfg, total_devices: int) -> Layout:
    from jax.sharding import AbstractMesh

    from olmax.sharding import MESH_AXES, mesh_shape
    from olmax.train_step import batch_layout

    try:
        shape = mesh_shape(cfg.mesh, total_devices)
        layout = batch_layout(cfg, AbstractMesh(shape, MESH_AXES))
    except ConfigError as e:
        raise LaunchError(f"--total-devices {total_devices} does not fit the recipe's batch: {e}") from None
    return Layout(total_devices, dict(zip(MESH_AXES, shape)), cfg.trainer.global_batch, layout.per_device,
                  layout.micro_batch, layout.accum_steps)
