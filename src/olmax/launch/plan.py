"""What every backend launches: `olmax train` with the recipe or config file, run directory, --stop-at,
--chip, --allow-*-change and overrides, the extra environment (--env), and the batch layout those will
get on `--total-devices` devices.

The global batch is the recipe's and never changes with the device count; the per-device batch and
the number of accumulated micro-batches follow from it and the mesh. They are computed here with the
trainer's own functions (olmax.config.mesh.mesh_shape and olmax.config.layout.split_batch, plain Python
that the train step calls too) so that a layout that does not divide is refused before anything is
submitted, with the trainer's message, and the launcher can never disagree with what the trainer will do.
"""

from __future__ import annotations

import dataclasses
import re
import shlex
from dataclasses import dataclass, field
from typing import Optional, Sequence

from olmax.config.layout import split_batch
from olmax.config.mesh import MESH_AXES, mesh_shape
from olmax.config.recipes import resolve
from olmax.errors import ConfigError, LaunchError
from olmax.fit.chips import resolve_peak
from olmax.rundir.progress import run_end_step


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
        return (
            f"{self.total_devices} devices (mesh {mesh}): global batch {self.global_batch} = "
            f"{self.per_device} per device x {self.global_batch // self.per_device} batch shards; "
            f"micro-batch {self.micro_batch}, {self.accum_steps} accumulation step(s)"
        )


@dataclass(frozen=True)
class TrainOptions:
    """What `olmax launch` passes on to `olmax train` besides the recipe, overrides and run directory."""

    config: Optional[str] = None  # experiment YAML (a path the trainer's hosts can read)
    chip: Optional[str] = None
    allow_data_change: bool = False
    allow_config_change: bool = False
    env: tuple[tuple[str, str], ...] = ()  # extra environment of the trainer processes, in order

    def args(self) -> list[str]:
        args = [] if self.config is None else ["--config", self.config]
        if self.chip is not None:
            args += ["--chip", self.chip]
        if self.allow_data_change:
            args.append("--allow-data-change")
        if self.allow_config_change:
            args.append("--allow-config-change")
        return args


ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def parse_env(pairs: Sequence[str]) -> tuple[tuple[str, str], ...]:
    """`KEY=VALUE` strings (--env) as pairs; the value may hold anything, '=' and spaces included."""
    parsed = []
    for pair in pairs:
        key, eq, value = pair.partition("=")
        if not eq or not ENV_NAME.match(key):
            raise LaunchError(
                f"--env {pair!r} is not KEY=VALUE with KEY a variable name "
                "(letters, digits, '_', not starting with a digit)"
            )
        parsed.append((key, value))
    return tuple(parsed)


@dataclass(frozen=True)
class LaunchPlan:
    recipe: Optional[str]
    overrides: tuple[str, ...]
    run_dir: str
    stop_at: Optional[int]
    layout: Layout
    options: TrainOptions = TrainOptions()

    @property
    def env(self) -> dict[str, str]:
        """The extra environment of the trainer processes (--env)."""
        return dict(self.options.env)

    def final(self) -> Optional[int]:
        """The step the run is done at, once a complete checkpoint of it exists: trainer.max_steps or
        --stop-at; with trainer.max_steps=null, the end of the data's epochs, which the trainer writes into
        RUN_DIR/config.yaml when it opens the data (None until then, without --stop-at)."""
        return run_end_step(self.run_dir, self.resolve(), self.stop_at)

    def resolve(self):
        """The experiment config the trainer will run."""
        return resolve(self.recipe, self.options.config, list(self.overrides))

    @property
    def name(self) -> str:
        """A job name: 'olmax-' + the run directory's last component, lower case, [a-z0-9-] only."""
        base = re.sub(r"[^a-z0-9-]+", "-", self.run_dir.rstrip("/").split("/")[-1].lower()).strip("-")
        return f"olmax-{base or 'run'}"

    def train_args(self) -> list[str]:
        """Arguments of `olmax train` (after the program name)."""
        args = ["train"] + ([] if self.recipe is None else ["--recipe", self.recipe])
        args += [*self.options.args(), "--run-dir", self.run_dir]
        if self.stop_at is not None:
            args += ["--stop-at", str(self.stop_at)]
        return args + list(self.overrides)


def make_plan(
    recipe: Optional[str],
    overrides: Sequence[str],
    run_dir: str,
    total_devices: int,
    stop_at: Optional[int] = None,
    options: TrainOptions = TrainOptions(),
) -> LaunchPlan:
    """Resolve the recipe (or options.config) with the overrides (errors name the key) and lay out its
    global batch over `total_devices` devices (errors name the knob that does not divide)."""
    if total_devices < 1:
        raise LaunchError(f"--total-devices must be positive, got {total_devices}")
    if stop_at is not None and stop_at < 1:
        raise LaunchError(f"--stop-at must be positive, got {stop_at}")
    if options.chip is not None:
        resolve_peak(None, options.chip)  # an unknown chip is refused here, not on the cluster
    plan = LaunchPlan(recipe, tuple(overrides), str(run_dir), stop_at, None, options)  # type: ignore[arg-type]
    cfg = plan.resolve()
    return dataclasses.replace(plan, layout=batch_layout_for(cfg, total_devices))


def batch_layout_for(cfg, total_devices: int) -> Layout:
    try:
        shape = mesh_shape(cfg.mesh, total_devices)
        layout = split_batch(cfg, dict(zip(MESH_AXES, shape)))
    except ConfigError as e:
        raise LaunchError(f"--total-devices {total_devices} does not fit the recipe's batch: {e}") from None
    return Layout(
        total_devices,
        dict(zip(MESH_AXES, shape)),
        cfg.trainer.global_batch,
        layout.per_device,
        layout.micro_batch,
        layout.accum_steps,
    )
