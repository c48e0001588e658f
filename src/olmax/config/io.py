"""Configs as text: YAML files, plain dicts, dotted `key=value` overrides, and the help text of
every field (`olmax config --explain`). The configs themselves, and their checks, are the other
modules of olmax.config.

OmegaConf does the YAML round trip and the overrides with type checking: an unknown key or a value of
the wrong type is an error that names the key, the type it takes and the value given.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import json
import textwrap
from pathlib import Path
from typing import NamedTuple, Optional, Sequence, TypeVar

from omegaconf import DictConfig, ListConfig, Node, OmegaConf
from omegaconf.errors import OmegaConfBaseException, ValidationError

from olmax.config.experiment import ExperimentConfig, as_experiment_type, experiment_type
from olmax.errors import ConfigError


@functools.cache
def field_help(cls: type) -> dict[str, str]:
    """{field name: help text} of a config dataclass: the attribute docstring under each field, read
    from the class's source. A field without one is absent from the result. A class made at run time
    (olmax.config.experiment.experiment_type) has no source: its bases' help, and for a field of its own
    the first line of its type's docstring."""
    try:
        source = inspect.getsource(cls)
    except (OSError, TypeError):
        helps = {k: v for base in cls.__bases__ if dataclasses.is_dataclass(base) for k, v in field_help(base).items()}
        for f in dataclasses.fields(cls):
            if f.name not in helps and isinstance(f.type, type) and f.type.__doc__:
                helps[f.name] = " ".join(f.type.__doc__.strip().split("\n\n")[0].split())
        return helps
    (node,) = ast.parse(textwrap.dedent(source)).body
    helps = {}
    for stmt, after in zip(node.body, node.body[1:]):
        if (
            isinstance(stmt, ast.AnnAssign)
            and isinstance(stmt.target, ast.Name)
            and isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            helps[stmt.target.id] = " ".join(after.value.value.split())
    return helps


class FieldInfo(NamedTuple):
    """One leaf field of a config, as `olmax config --explain` shows it."""

    name: str  # dotted, as in overrides: model.rope_type
    type: str  # the annotation as written: Optional[int]
    value: object
    help: str


def explain_fields(cfg, prefixes: Sequence[str] = ()) -> list[FieldInfo]:
    """Every leaf field of `cfg` in declaration order, or only those whose dotted name starts with one
    of `prefixes` (a prefix that matches nothing is an error naming it)."""
    fields: list[FieldInfo] = []

    def walk(obj, path: str) -> None:
        helps = field_help(type(obj))
        for f in dataclasses.fields(obj):
            value = getattr(obj, f.name)
            if dataclasses.is_dataclass(value):
                walk(value, f"{path}{f.name}.")
            else:
                fields.append(FieldInfo(f"{path}{f.name}", str(f.type), value, helps.get(f.name, "")))

    walk(cfg, "")
    for prefix in prefixes:
        if not any(fi.name.startswith(prefix) for fi in fields):
            raise ConfigError(f"no config field starts with {prefix!r}")
    return [fi for fi in fields if not prefixes or any(fi.name.startswith(p) for p in prefixes)]


def format_explain(fields: Sequence[FieldInfo], width: int = 100) -> str:
    """`name: type = value` (the value as YAML would take it in an override), then the help, indented."""
    lines = []
    for fi in fields:
        value = list(fi.value) if isinstance(fi.value, tuple) else fi.value
        lines.append(f"{fi.name}: {fi.type} = {json.dumps(value)}")
        lines.extend(
            textwrap.wrap(fi.help, width, initial_indent="    ", subsequent_indent="    ", break_on_hyphens=False)
        )
    return "\n".join(lines) + "\n"


C = TypeVar("C")


def _tags_as_text(conf):
    """model.remat given as a YAML list of tags ([q_proj, k_proj]) -> the comma-separated text the
    field holds ("q_proj,k_proj"); anything else as it is."""
    model = conf.get("model") if isinstance(conf, DictConfig) else None
    if isinstance(model, DictConfig) and isinstance(model.get("remat"), ListConfig):
        model.remat = ",".join(str(t) for t in model.remat)
    return conf


def _merge(base: C, *others) -> C:
    structured = OmegaConf.structured(base)
    OmegaConf.set_readonly(structured, False)
    try:
        merged = OmegaConf.merge(structured, *(_tags_as_text(o) for o in others))
        return OmegaConf.to_object(merged)
    except OmegaConfBaseException as e:
        raise ConfigError(_merge_error(e)) from None
    except TypeError as e:
        raise ConfigError(str(e)) from None


def _merge_error(e: OmegaConfBaseException) -> str:
    """One line naming the key. OmegaConf's own first line names only the value and the type it
    failed to become ("Value 'two' of type 'str' could not be converted to Integer"); an unknown key's
    names the key and the close matches; its multi-line footer is dropped."""
    first = str(e).split("\n")[0]
    # for a list element OmegaConf leaves its template unfilled: "Value '$VALUE' of type '$VALUE_TYPE' ..."
    first = first.replace("Value '$VALUE' of type '$VALUE_TYPE'", "a list element")
    if not isinstance(e, ValidationError) or e.full_key is None or not dataclasses.is_dataclass(e.object_type):
        return first
    expected = {f.name: f.type for f in dataclasses.fields(e.object_type)}[e.key]
    return f"{e.full_key} takes {expected}, got {_as_given(e.value)} ({first})"


def _as_given(value) -> str:
    """A value as the user wrote it: 'two', 3, [1, 2]."""
    if isinstance(value, Node):  # OmegaConf hands over some values still wrapped
        value = value._value()
    if isinstance(value, (DictConfig, ListConfig)):
        value = OmegaConf.to_container(value)
    return repr(value)


def apply_overrides(cfg: C, overrides: Sequence[str]) -> C:
    """Apply dotted `key=value` overrides (values parsed as YAML: `model.n_layers=4`, `data.paths=[a,b]`)."""
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} is not of the form key=value")
    if not overrides:
        return cfg
    named = [item.split("=", 1)[1] for item in overrides if item.split("=", 1)[0].strip() == "trainer.objective"]
    if named and isinstance(cfg, ExperimentConfig):  # a plug-in objective brings its section
        cfg = as_experiment_type(cfg, named[-1].strip())
    try:
        return _merge(cfg, OmegaConf.from_dotlist(list(overrides)))
    except ConfigError as e:
        culprit = _failing_override(cfg, overrides)
        if culprit is None or culprit.split("=", 1)[0].rsplit(".", 1)[-1] in str(e):  # it names the key
            raise
        raise ConfigError(f"{culprit}: {e}") from None


def _failing_override(cfg, overrides: Sequence[str]) -> Optional[str]:
    """The first override that OmegaConf refuses on its own (its type check), for errors that name no
    key, such as a list element of the wrong type; None when only their combination fails."""
    structured = OmegaConf.structured(cfg)
    OmegaConf.set_readonly(structured, False)
    for item in overrides:
        try:
            OmegaConf.merge(structured, OmegaConf.from_dotlist([item]))
        except OmegaConfBaseException:
            return item
    return None


def to_yaml(cfg) -> str:
    return OmegaConf.to_yaml(OmegaConf.structured(cfg))


def to_dict(cfg) -> dict:
    return OmegaConf.to_container(OmegaConf.structured(cfg))


def save_yaml(cfg, path: str | Path) -> None:
    Path(path).write_text(to_yaml(cfg))


def load_yaml(path: str | Path, schema: type[C] = ExperimentConfig) -> C:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist")
    return from_dict(OmegaConf.load(path), schema)


def from_dict(d, schema: type[C] = ExperimentConfig) -> C:
    """A config from a (nested) dict or DictConfig; for ExperimentConfig the class of its
    trainer.objective (experiment_type: a plug-in objective's section)."""
    conf = OmegaConf.create(d) if not isinstance(d, DictConfig) else d
    if schema is ExperimentConfig:
        objective = OmegaConf.select(conf, "trainer.objective")
        if isinstance(objective, str):
            schema = experiment_type(objective)
    return _merge(schema(), conf)
