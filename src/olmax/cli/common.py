"""Shared pieces of the `olmax` command line: the root app, the common options, JSON output, and
the decorator that ends a command on a user error with a one-line message and exit status 2."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any, Callable, Optional

import typer

from olmax.config import ConfigError
from olmax.exits import ExitStatus

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="OLMo 3 pre-training in JAX, with parity against OLMo-core built in.",
)


RecipeOpt = typer.Option(None, "--recipe", help="named preset (olmax.recipes)")


ConfigOpt = typer.Option(None, "--config", help="experiment YAML instead of a recipe")


OverridesArg = typer.Argument(None, help="dotted overrides, e.g. model.n_layers=4")


JsonOpt = typer.Option(None, "--json", help="also write the figures to this JSON file")


def resolve_experiment(
    recipe: Optional[str],
    config: Optional[str],
    overrides: Optional[list[str]],
    shorthands: Optional[dict[str, Any]] = None,
    *,
    need_base: bool = True,
):
    """The experiment config of a command: the one resolution path of every command that reads data or
    builds a model (olmax.recipes.resolve: --recipe or --config, then dotted overrides).

    `shorthands` maps dotted keys to the values of a command's shorthand flags (None = flag not given);
    each given one becomes the override `key=value` before the explicit overrides, so `--seq-len 2048`
    and `data.seq_len=2048` resolve alike, and giving one key both ways is an error. Commands whose
    base may be left out (need_base=False) start from the config defaults (olmax.config) without
    --recipe/--config. An unknown key or a value of the wrong type raises ConfigError naming it."""
    from olmax.config import ConfigError, ExperimentConfig, apply_overrides
    from olmax.recipes import resolve

    overrides = list(overrides or [])
    given = {k: str(v) if isinstance(v, Path) else v for k, v in (shorthands or {}).items() if v is not None}
    both = sorted(set(given) & {o.split("=", 1)[0].strip() for o in overrides})
    if both:
        raise ConfigError(f"{both[0]} is given both by its flag and as an override; give it once")
    # JSON values are YAML too, and quoting keeps paths such as gs://b/x or demo:heldout strings.
    flags = [f"{k}={json.dumps(list(v) if isinstance(v, (list, tuple)) else v)}" for k, v in given.items()]
    if recipe is None and config is None and not need_base:
        return apply_overrides(ExperimentConfig(), flags + overrides)
    return resolve(recipe, config, flags + overrides)


@app.callback()
def _root() -> None:
    """OLMo 3 pre-training in JAX, with parity against OLMo-core built in."""


# The shorthand for data.seq_len, shared by the data and eval commands (docs/config.md, "Resolution").
SeqLenOpt = typer.Option(None, "--seq-len", help="data.seq_len")


def exits_on(label: str, errors: Callable[[], tuple[type[Exception], ...]]):
    """Decorator: the user errors `errors()` lists end the command with `label: message` (the message
    names the file or field) and exit status 2 (USER_ERROR, olmax.exits), not a traceback. `errors`
    imports them only when one is raised, so commands stay quick to start."""

    def decorate(fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            try:
                return fn(*args, **kwargs)
            except errors() as e:
                typer.echo(f"{label}: {e}", err=True)
                raise typer.Exit(ExitStatus.USER_ERROR) from None

        return wrapper

    return decorate


def write_json(path: Optional[Path], payload: Any) -> None:
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(payload, indent=2, sort_keys=True) + "\n")


def checkpoint_errors():
    from olmax.checkpoint import CheckpointError
    from olmax.convert import ConversionError

    return (ConversionError, CheckpointError, ConfigError)


def data_errors():
    from olmax.data.order import OrderError
    from olmax.data.sources import DataSourceError
    from olmax.data.tokenize import TokenizeError
    from olmax.data.tokenizer import TokenizerError

    return (DataSourceError, TokenizeError, TokenizerError, OrderError)


def eval_errors():
    # CheckpointError and the data errors are ValueErrors
    return (ValueError, FileNotFoundError)
