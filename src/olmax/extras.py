"""The optional installs (pyproject.toml's extras) and the one error a command gives when it needs one
that is not installed: `MissingExtra`, a ConfigError, so the CLI ends it with one line and exit 2
naming the extra and the command that installs it, never a traceback.

The core install (`pip install -e .`, what `make demo` sets up) trains, evaluates, converts and
generates; only the commands and options below need more."""

from __future__ import annotations

import importlib

from olmax.errors import ConfigError

# top-level module -> the extra that installs it
EXTRAS = {
    "torch": "parity",
    "transformers": "parity",
    "olmo_core": "parity",
    "lm_eval": "eval",
    "wandb": "wandb",
    "libtpu": "tpu",
    "jax_cuda12_plugin": "gpu-compile",
    "gcsfs": "remote",
    "aiohttp": "remote",
    "pyarrow": "parquet",
}

# fsspec protocol -> the module its filesystem needs (fsspec's registry names these packages)
PROTOCOL_MODULES = {"gs": "gcsfs", "gcs": "gcsfs", "http": "aiohttp", "https": "aiohttp"}


class MissingExtra(ConfigError):
    """A command or option needs a package of an extra that is not installed."""


def install_hint(extra: str) -> str:
    return f"the `{extra}` extra: pip install -e '.[{extra}]'"


def require(module: str, needed_by: str):
    """Import `module` (a package of an extra, EXTRAS) for `needed_by` (what the user asked for), or
    raise MissingExtra naming the extra. An import that fails inside an installed package is named too."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        extra = EXTRAS[module.partition(".")[0]]
        raise MissingExtra(f"{needed_by} needs {install_hint(extra)} ({e})") from None


def url_to_fs(url: str):
    """fsspec's (filesystem, path) of a URL; a protocol whose package is missing (gcsfs for gs://,
    aiohttp for http://) is a MissingExtra naming the `remote` extra."""
    from fsspec.core import url_to_fs as fsspec_url_to_fs

    try:
        return fsspec_url_to_fs(url)
    except ImportError as e:
        protocol = url.split("://", 1)[0]
        module = PROTOCOL_MODULES.get(protocol)
        if module is None:
            raise MissingExtra(f"{url}: fsspec cannot open {protocol}:// here ({e})") from None
        raise MissingExtra(f"reading {url} needs {install_hint(EXTRAS[module])} ({e})") from None
