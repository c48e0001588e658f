"""The `olmax` command line: parses arguments and dispatches to the library, nothing else.

Every subcommand that reports figures takes `--json FILE` and writes them there too. The commands
live by area in this package's modules; importing them registers them on `app`. worker.py is what
each host of a multi-host run executes (`python -m olmax.cli.worker ARGS`).

May import: every package. Nothing imports cli.
"""

from __future__ import annotations

import sys

import typer

# Importing the command modules registers their commands on `app`, in this order in --help.
from olmax.cli import (  # noqa: F401
    checkpoints,
    data,
    evaluation,
    generation,
    launch,
    status,
    training,  # noqa: F401,I001
)
from olmax.cli.common import app
from olmax.errors import ConfigError
from olmax.extras import MissingExtra
from olmax.rundir.exits import ExitStatus

__all__ = ["app", "main"]


def main() -> None:
    """The `olmax` program. Exit statuses follow olmax.rundir.exits (0 done, 2 a user error, ...)."""
    try:
        app()
    except MissingExtra as e:
        typer.echo(f"missing extra: {e}", err=True)
        sys.exit(ExitStatus.USER_ERROR)
    except ConfigError as e:
        typer.echo(f"config error: {e}", err=True)
        sys.exit(ExitStatus.USER_ERROR)
