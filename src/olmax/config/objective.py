"""What the config knows of an objective, without jax: its config section and the data it trains on.

An objective (olmax.objectives: `lm`, `dpo`, `grpo`, or a plug-in) is one class there, which declares
everything the step, the trainer, the fit and the metrics ask of it. The part a config needs before any
device exists lives on its SECTION, a frozen dataclass subclassing `ObjectiveConfig` (olmax.config.dpo,
olmax.config.grpo, or a plug-in's own): `data`, which kind of batches it trains on, hence the rows an
item of trainer.global_batch holds and the LM options it refuses (olmax.config.experiment), and
`check`, the checks across sections that are its own. An objective without options (lm) has no
section: it trains on tokens and checks nothing more.

Plug-ins: a distribution declares `[project.entry-points."olmax.objectives"] simpo = "pkg.mod:SimPO"`;
`trainer.objective=simpo` then names it. Its section (the objective's `config` attribute) becomes a
section of the config named as the objective (`simpo.beta=...` overrides it): olmax.config.experiment's
`experiment_type`. Reading such a config loads the plug-in's module (it may import jax); the built-in
objectives never do. docs/extending.md, "An objective".
"""

from __future__ import annotations

import functools
import importlib.metadata
from typing import ClassVar, Optional

from olmax.errors import ConfigError

ENTRY_POINT_GROUP = "olmax.objectives"
DEFAULT = "lm"  # next-token cross-entropy: no section of its own
# The batches an objective may train on, and the rows (sequences of data.seq_len) one item of
# trainer.global_batch holds: a token instance, a preference pair (chosen and rejected), a packed
# rollout row. The trainer makes each kind (olmax.trainer.batches).
ROWS_PER_ITEM = {"tokens": 1, "pairs": 2, "rollouts": 1}


class ObjectiveConfig:
    """Base of an objective's config section (mixed into a frozen dataclass). `data`: which batches it
    trains on (ROWS_PER_ITEM's keys); `check(cfg)`: its checks of the other sections, run by
    ExperimentConfig.__post_init__ after the ones every objective on `data` gets."""

    data: ClassVar[str] = "tokens"

    def check(self, cfg) -> None:
        """Checks across sections of this objective's own (ConfigError naming the field)."""


def _entry_points() -> dict:
    return {ep.name: ep for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)}


def plugin_names() -> list[str]:
    """The objectives installed as `olmax.objectives` entry points (their names only: nothing loads)."""
    return sorted(_entry_points())


@functools.cache
def plugin(name: str):
    """The objective an `olmax.objectives` entry point names, loaded once per process; None when no
    entry point has that name."""
    ep = _entry_points().get(name)
    if ep is None:
        return None
    try:
        return ep.load()
    except Exception as e:  # a plug-in that fails to import: name it, not a bare traceback
        raise ConfigError(f"trainer.objective={name}: the entry point {ep.value!r} does not load: {e}") from e


def plugin_section(name: str) -> Optional[type]:
    """A plug-in objective's section class (its `config`), or None (none, or no such plug-in)."""
    found = plugin(name)
    section = getattr(found, "config", None)
    if section is not None and not (isinstance(section, type) and issubclass(section, ObjectiveConfig)):
        raise ConfigError(
            f"trainer.objective={name}: its config {section!r} is not a dataclass subclassing "
            "olmax.config.objective.ObjectiveConfig"
        )
    return section


def data_kind(section) -> str:
    """The batches an objective with this section (an instance or its class; None: no section) trains on."""
    kind = ObjectiveConfig.data if section is None else section.data
    if kind not in ROWS_PER_ITEM:
        name = section.__name__ if isinstance(section, type) else type(section).__name__
        raise ConfigError(f"{name}.data={kind!r} is not one of {', '.join(ROWS_PER_ITEM)} (olmax.config.objective)")
    return kind
