"""`ExperimentConfig`: everything a run needs, composed of the sections (olmax.config.model, data,
optimizer, schedule, trainer, mesh, checkpoint, eval, wandb, and the objectives' own: dpo, grpo), and the
checks that span sections: what a context axis needs of the sequence, and what the objective's kind of
data refuses of the other options (olmax.config.objective says what a config knows of an objective,
olmax.config.data_kind of its data; `experiment_type` adds a plug-in objective's section).

Every check that needs neither devices nor data runs in the dataclasses' `__post_init__`, so a config
that `olmax config` and `olmax train --dry-run` accept is one the trainer accepts too, up to the device
count (the batch split over devices, olmax.config.layout) and the data. Every field carries its help
text as an attribute docstring, the string literal right under it, which `olmax config --explain`
prints (olmax.config.io.field_help; tests/config/test_config.py fails for a field without one).
"""

from __future__ import annotations

import dataclasses
import functools
import typing
from dataclasses import dataclass, field
from typing import Optional

from olmax.config.checkpoint import CheckpointConfig, EvalConfig, WandbConfig
from olmax.config.data import DataConfig
from olmax.config.data_kind import kind_named
from olmax.config.dpo import DPOConfig
from olmax.config.grpo import GRPOConfig, RewardsConfig
from olmax.config.mesh import MeshConfig
from olmax.config.model import CONTEXT_BACKENDS, MASKING_BACKENDS, ModelConfig
from olmax.config.objective import (
    DEFAULT,
    ObjectiveConfig,
    data_kind,
    plugin_names,
    plugin_section,
    statistic_rows,
)
from olmax.config.optimizer import OptimizerConfig
from olmax.config.schedule import ScheduleConfig
from olmax.config.trainer import TrainerConfig
from olmax.errors import ConfigError


def check_context(cfg: "ExperimentConfig", context: int) -> None:
    """What a context axis of `context` devices needs of the rest of the config: the sequence splits
    into `context` equal chunks, the output layer's chunks (trainer.loss_chunk) fit one of them, a
    named backend has a context-parallel form, and a named splash backend's tiles fit its queries.
    `auto` resolves to splash only when the platform is known: the trainer checks it then
    (olmax.step.train_step.batch_layout)."""
    seq_len, chunk = cfg.data.seq_len, cfg.trainer.loss_chunk
    if cfg.model.attention not in ("auto", *CONTEXT_BACKENDS):
        raise ConfigError(
            f"model.attention={cfg.model.attention} has no context-parallel form (jax's cuDNN call cannot offset "
            f"its causal mask to a chunk of the sequence): with mesh.context={context} use model.attention=auto "
            f"(it runs xla instead of cudnn on GPUs) or one of {', '.join(CONTEXT_BACKENDS)}"
        )
    if seq_len % context:
        raise ConfigError(
            f"data.seq_len={seq_len} is not divisible by mesh.context={context}: the context axis splits every "
            "sequence into that many equal chunks"
        )
    if chunk and (seq_len // context) % chunk:
        raise ConfigError(
            f"trainer.loss_chunk={chunk} does not divide one context chunk of the sequence "
            f"(data.seq_len / mesh.context = {seq_len // context})"
        )
    if cfg.model.attention == "splash":
        cfg.model.splash_blocks.tiles(seq_len, context)


@dataclass(frozen=True)
class ExperimentConfig:
    """Everything a run needs; what `olmax train` resolves from a recipe or YAML file plus overrides."""

    name: str = "olmo3_7b"
    """Name of the experiment (a recipe sets its own name); saved with the config in every checkpoint."""
    model: ModelConfig = field(default_factory=ModelConfig)
    """The architecture and its numerics."""
    data: DataConfig = field(default_factory=DataConfig)
    """Training data, tokenizer ids and the data order."""
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    """AdamW, skip-step, clipping, z-loss."""
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    """The learning-rate schedule."""
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    """Batch size, micro-batching, steps, logging, init seed."""
    mesh: MeshConfig = field(default_factory=MeshConfig)
    """How devices are arranged for data, FSDP and tensor parallelism."""
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    """Where and how often checkpoints are saved, and what the run starts from."""
    eval: EvalConfig = field(default_factory=EvalConfig)
    """In-loop held-out evaluation."""
    wandb: WandbConfig = field(default_factory=WandbConfig)
    """The optional W&B writer."""
    dpo: DPOConfig = field(default_factory=DPOConfig)
    """The DPO loss (trainer.objective=dpo)."""
    grpo: GRPOConfig = field(default_factory=GRPOConfig)
    """GRPO, the RL objective (trainer.objective=grpo): its loss and the RL loop's settings."""
    rewards: RewardsConfig = field(default_factory=RewardsConfig)
    """The verifiers the RL loop scores responses with."""

    def __post_init__(self):
        chunk, seq_len = self.trainer.loss_chunk, self.data.seq_len
        if chunk and seq_len % chunk:
            raise ConfigError(f"trainer.loss_chunk={chunk} does not divide data.seq_len={seq_len}")
        if self.mesh.context > 1:  # -1 (the rest of the devices) is checked when the mesh is built
            check_context(self, self.mesh.context)
        if self.trainer.max_steps is None and self.schedule.t_max_epochs is None:
            raise ConfigError(
                "trainer.max_steps=null ends the run at the schedule's epoch horizon, which needs "
                "schedule.t_max_epochs: set that, or trainer.max_steps to a number of steps"
            )
        model, data = self.model, self.data
        if data.doc_masking and model.attention not in ("auto", *MASKING_BACKENDS):
            raise ConfigError(
                f"data.doc_masking=true needs attention masked within documents, which model.attention="
                f"{model.attention} cannot do (jax's cuDNN call takes no segment ids); use model.attention=auto "
                f"(it runs xla instead of cudnn on GPUs) or one of {', '.join(MASKING_BACKENDS)}"
            )
        if model.rope_positions == "document" and not data.doc_masking:
            raise ConfigError(
                "model.rope_positions=document restarts positions at each document, which needs the documents: "
                "set data.doc_masking=true (or model.rope_positions=absolute)"
            )
        self._check_objective()

    def _check_objective(self) -> None:
        """trainer.objective names a built-in objective or a plug-in whose section this config holds;
        then what its kind of data refuses (olmax.config.data_kind) and its section's own checks."""
        name = self.trainer.objective
        known = objective_names()
        if name not in known:
            raise ConfigError(
                f"trainer.objective={name!r} is not one of {', '.join(known)} "
                f"(a plug-in objective is an `olmax.objectives` entry point: docs/extending.md)"
            )
        section = self.objective_config
        if section is None and (name in builtin_sections() or plugin_section(name) is not None):
            raise ConfigError(
                f"trainer.objective={name} needs its `{name}` section, which this {type(self).__name__} has not: "
                f"build the config with olmax.config.experiment.experiment_type({name!r})"
            )
        kind = kind_named(data_kind(section))
        kind.check(self)
        statistic = statistic_rows(section)
        if not (isinstance(statistic, int) and 0 <= statistic < kind.rows):
            raise ConfigError(
                f"trainer.objective={name} declares statistic_rows={statistic!r} of the {kind.rows} rows an item "
                f"of {kind.name!r} holds: 0 or more, and at least one row trained"
            )
        if section is not None:
            section.check(self)

    @property
    def objective_config(self) -> Optional[ObjectiveConfig]:
        """The section of trainer.objective (cfg.dpo for dpo, ...), or None for an objective without one (lm)."""
        section = getattr(self, self.trainer.objective, None)
        return section if isinstance(section, ObjectiveConfig) else None

    @property
    def rows_per_step(self) -> int:
        """Sequences of data.seq_len in one optimizer step: trainer.global_batch items of the objective's
        data, each of its kind's `rows` (olmax.config.data_kind: a preference pair is a chosen and a
        rejected row, a token instance and a packed rollout row one)."""
        return self.trainer.global_batch * kind_named(data_kind(self.objective_config)).rows

    @property
    def statistic_rows_per_step(self) -> int:
        """Of rows_per_step, the rows that only feed a statistic (the section's `statistic_rows` an item,
        olmax.config.objective): a forward each and no backward, as olmax.fit.flops counts them."""
        return self.trainer.global_batch * statistic_rows(self.objective_config)

    def __reduce__(self):
        # pickled as its objective and fields, so a config with a plug-in's section (a class made at run
        # time, experiment_type) unpickles in a process that has not made that class yet
        return _rebuild, (self.trainer.objective, {f.name: getattr(self, f.name) for f in dataclasses.fields(self)})


def _rebuild(objective: str, fields: dict) -> "ExperimentConfig":
    return experiment_type(objective)(**fields)


@functools.cache
def builtin_sections() -> dict[str, type]:
    """{objective: its section class} for the objectives whose section ExperimentConfig declares (a field
    named as the objective, of an ObjectiveConfig type)."""
    hints = typing.get_type_hints(ExperimentConfig)
    return {
        f.name: hints[f.name]
        for f in dataclasses.fields(ExperimentConfig)
        if isinstance(hints[f.name], type) and issubclass(hints[f.name], ObjectiveConfig)
    }


def objective_names() -> list[str]:
    """What trainer.objective may name: lm, the built-in sections' objectives, the installed plug-ins."""
    return [DEFAULT, *builtin_sections(), *(p for p in plugin_names() if p not in builtin_sections())]


@functools.cache
def experiment_type(objective: str) -> type[ExperimentConfig]:
    """The config class of a run of `objective`: ExperimentConfig, plus a section named as the objective
    when a plug-in declares one (its `config` class; olmax.config.objective)."""
    if objective == DEFAULT or objective in builtin_sections():
        return ExperimentConfig
    section = plugin_section(objective)
    if section is None:
        return ExperimentConfig
    if objective in {f.name for f in dataclasses.fields(ExperimentConfig)}:
        raise ConfigError(f"the plug-in objective {objective!r} is named as a config section olmax already has")
    cls = dataclasses.make_dataclass(
        f"ExperimentConfig_{objective}",
        [(objective, section, field(default_factory=section))],
        bases=(ExperimentConfig,),
        frozen=True,
    )
    cls.__doc__ = f"ExperimentConfig with the `{objective}` section of the plug-in objective {objective!r}."
    return cls


def as_experiment_type(cfg: ExperimentConfig, objective: str) -> ExperimentConfig:
    """`cfg` as a config of `objective`'s class (experiment_type): its sections kept, a plug-in's section
    added at its defaults. Checks are left to the caller's next replace or merge (the objective is not
    set here)."""
    cls = experiment_type(objective)
    if type(cfg) is cls or not issubclass(cls, type(cfg)):
        return cfg
    kept = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)}
    extra = {f.name: f.default_factory() for f in dataclasses.fields(cls) if f.name not in kept}
    obj = object.__new__(cls)  # no __post_init__: cfg was checked, the new section is at its defaults
    for name, value in {**kept, **extra}.items():
        object.__setattr__(obj, name, value)
    return obj
