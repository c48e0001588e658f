"""The error every olmax check raises for input it cannot use (the CLI prints its message and exits 2),
and the small checks the config sections share."""

from typing import Iterable, Sequence


class ConfigError(ValueError):
    """A configuration that cannot be built: unknown key, wrong type, or inconsistent values."""


def refuse(rules: Iterable[tuple[bool, str, str]], message: str) -> None:
    """Raise ConfigError for the first rule (bad, knob, why) that holds; `message` places {knob} and
    {why}. One table per check keeps each refusal's reason beside its condition."""
    for bad, knob, why in rules:
        if bad:
            raise ConfigError(message.format(knob=knob, why=why))


def check_choice(name: str, value: str, choices: Sequence[str]) -> None:
    if value not in choices:
        raise ConfigError(f"{name}={value!r} is not one of {', '.join(choices)}")


def check_positive(section: str, cfg, *names: str) -> None:
    for name in names:
        if getattr(cfg, name) <= 0:
            raise ConfigError(f"{section}.{name} must be positive, got {getattr(cfg, name)}")


def check_non_negative(section: str, cfg, *names: str) -> None:
    for name in names:
        if getattr(cfg, name) < 0:
            raise ConfigError(f"{section}.{name} must be >= 0, got {getattr(cfg, name)}")


class LaunchError(ValueError):
    """A launch that cannot proceed as asked: a missing variable, a layout that does not divide, a run
    directory held by another launcher. The message names the thing to fix."""
