"""Which objective trainer.objective names: the built-ins (lm, dpo, grpo) and the plug-ins installed as
`olmax.objectives` entry points (olmax.config.objective loads them; docs/extending.md). Everything that
runs an objective asks `objective_of(cfg)`, never its name."""

from __future__ import annotations

from olmax.config.experiment import objective_names
from olmax.config.objective import plugin
from olmax.errors import ConfigError
from olmax.objectives.base import Objective
from olmax.objectives.dpo import DPO
from olmax.objectives.grpo import GRPO
from olmax.objectives.lm import LM

BUILTINS: dict[str, Objective] = {o.name: o for o in (LM(), DPO(), GRPO())}


def objective_named(name: str) -> Objective:
    """The objective called `name`; a ConfigError listing the known ones for any other name (never a
    silent fallback to the LM loss)."""
    if name in BUILTINS:
        return BUILTINS[name]
    found = plugin(name)
    if found is None:
        raise ConfigError(
            f"trainer.objective={name!r} is not one of {', '.join(objective_names())} "
            f"(a plug-in objective is an `olmax.objectives` entry point: docs/extending.md)"
        )
    objective = found() if isinstance(found, type) else found
    if not isinstance(objective, Objective):
        raise ConfigError(
            f"trainer.objective={name}: its entry point gives {found!r}, not an olmax.objectives.base.Objective"
        )
    if objective.name != name:
        raise ConfigError(f"the `olmax.objectives` entry point {name!r} gives the objective named {objective.name!r}")
    return objective


def objective_of(cfg) -> Objective:
    """The objective of a run's config (trainer.objective)."""
    return objective_named(cfg.trainer.objective)
