"""The error every olmax check raises for input it cannot use (the CLI prints its message and exits 2)."""


class ConfigError(ValueError):
    """A configuration that cannot be built: unknown key, wrong type, or inconsistent values."""
