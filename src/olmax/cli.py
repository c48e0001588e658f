"""The `olmax` command line: parses arguments and dispatches to the library, nothing else.

Every subcommand that reports figures takes `--json FILE` and writes them there too.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Optional

import typer

from olmax.config import ConfigError, save_yaml, to_yaml

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="OLMo 3 pre-training in JAX, with parity against OLMo-core built in.")

RecipeOpt = typer.Option(None, "--recipe", help="named preset (olmax.recipes)")
ConfigOpt = typer.Option(None, "--config", help="experiment YAML instead of a recipe")
OverridesArg = typer.Argument(None, help="dotted overrides, e.g. model.n_layers=4")
JsonOpt = typer.Option(None, "--json", help="also write the figures to this JSON file")


@app.callback()
def _root() -> None:
    """OLMo 3 pre-training in JAX, with parity against OLMo-core built in."""


def write_json(path: Optional[Path], payload: Any) -> None:
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(payload, indent=2, sort_keys=True) + "\n")


@app.command("config")
def config_cmd(
    recipe: Optional[str] = RecipeOpt,
    config: Optional[str] = ConfigOpt,
    overrides: Optional[list[str]] = OverridesArg,
    save: Optional[Path] = typer.Option(None, "--save", help="write the resolved config as YAML"),
):
    """Print the resolved experiment config (a recipe or YAML file plus overrides)."""
    from olmax.recipes import resolve

    cfg = resolve(recipe, config, overrides or [])
    typer.echo(to_yaml(cfg), nl=False)
    if save is not None:
        save_yaml(cfg, save)


# -- subcommands are registered below this line --


def main() -> None:
    try:
        app()
    except ConfigError as e:
        typer.echo(f"config error: {e}", err=True)
        sys.exit(2)


if __name__ == "__main__":
    main()
