"""The error every olmax check raises for input it cannot use (the CLI prints its message and exits 2)."""

from typing import Iterable


class ConfigError(ValueError):
    """A configuration that cannot be built: unknown key, wrong type, or inconsistent values."""


def refuse(rules: Iterable[tuple[bool, str, str]], message: str) -> None:
    """Raise ConfigError for the first rule (bad, knob, why) that holds; `message` places {knob} and
    {why}. One table per check keeps each refusal's reason beside its condition."""
    for bad, knob, why in rules:
        if bad:
            raise ConfigError(message.format(knob=knob, why=why))
