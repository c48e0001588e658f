"""What the config knows of an objective, without jax: its config section and the data it trains on.

An objective (olmax.objectives: `lm`, `dpo`, `grpo`, or a plug-in) is one class there, which declares
everything the step, the trainer, the fit and the metrics ask of it. The part a config needs before any
device exists lives on its SECTION, a frozen dataclass subclassing `ObjectiveConfig` (olmax.config.dpo,
olmax.config.grpo, or a plug-in's own): `data`, the kind of data it trains on (olmax.config.data_kind:
the rows an item of trainer.global_batch holds and what every objective on that data refuses), and
`check`, the checks across sections that are its own. An objective without options (lm) has no
section: it trains on tokens and checks nothing more.

Plug-ins: a distribution declares `[project.entry-points."olmax.objectives"] simpo = "pkg.mod:SimPO"`;
`trainer.objective=simpo` then names it. Its section (the objective's `config` attribute) becomes a
section of the config named as the objective (`simpo.beta=...` overrides it): olmax.config.experiment's
`experiment_type`. Its data may be a plug-in kind too (an `olmax.data_kinds` entry point). Reading such
a config loads the plug-in's module (it may import jax); the built-in objectives never do.
docs/extending.md, "An objective".
"""

from __future__ import annotations

import functools
from typing import ClassVar, Optional

from olmax.config.data_kind import kind_named
from olmax.config.entry_points import installed
from olmax.errors import ConfigError

ENTRY_POINT_GROUP = "olmax.objectives"
DEFAULT = "lm"  # next-token cross-entropy: no section of its own


class ObjectiveConfig:
    """Base of an objective's config section (mixed into a frozen dataclass). `data`: the kind of data it
    trains on (a name olmax.config.data_kind knows); `statistic_rows`: how many of the rows of each item
    only feed a statistic (olmax.objectives.logps.statistic_logps: KTO's KL rows), which the FLOPs count
    as a forward without a backward (olmax.fit.flops); `check(cfg)`: its checks of the other sections,
    run by ExperimentConfig.__post_init__ after the ones every objective on `data` gets."""

    data: ClassVar[str] = "tokens"
    statistic_rows: ClassVar[int] = 0

    def check(self, cfg) -> None:
        """Checks across sections of this objective's own (ConfigError naming the field)."""


def _entry_points() -> dict:
    return installed(ENTRY_POINT_GROUP)


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


def statistic_rows(section) -> int:
    """The rows of each item that only feed a statistic, for an objective with this section (an instance
    or its class; None: no section, none)."""
    return ObjectiveConfig.statistic_rows if section is None else section.statistic_rows


def data_kind(section) -> str:
    """The name of the data an objective with this section (an instance or its class; None: no section)
    trains on, checked to be a known kind (olmax.config.data_kind)."""
    kind = ObjectiveConfig.data if section is None else section.data
    try:
        kind_named(kind)
    except ConfigError as e:
        name = section.__name__ if isinstance(section, type) else type(section).__name__
        raise ConfigError(f"{name}.data: {e}") from None
    return kind
