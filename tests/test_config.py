"""Config: presets, dotted overrides with type checking, YAML round trip, the CLI's dry-run view."""

import dataclasses
import subprocess
import sys

import pytest

from olmax.config import ConfigError, ExperimentConfig, apply_overrides, load_yaml, save_yaml
from olmax.recipes import RECIPES, get_recipe, resolve


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_every_recipe_round_trips_through_yaml(name, tmp_path):
    cfg = get_recipe(name)
    save_yaml(cfg, tmp_path / "c.yaml")
    assert load_yaml(tmp_path / "c.yaml") == cfg


def test_overrides_are_typed_and_nested():
    cfg = apply_overrides(get_recipe("tiny"), ["model.n_layers=6", "optimizer.lr=1e-3", "data.paths=[a,b]"])
    assert cfg.model.n_layers == 6 and isinstance(cfg.model.n_layers, int)
    assert cfg.optimizer.lr == 1e-3
    assert cfg.data.paths == ("a", "b")
    assert get_recipe("tiny").model.n_layers == 4  # presets are not mutated
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.model.n_layers = 3


@pytest.mark.parametrize(
    "override, message",
    [
        ("model.n_layerz=6", "n_layerz"),
        ("model.n_layers=six", "could not be converted to Integer"),
        ("model.attention=flash", "model.attention='flash' is not one of"),
        ("model.n_kv_heads=3", "not a multiple of model.n_kv_heads=3"),
        ("model.n_layers", "not of the form key=value"),
    ],
)
def test_bad_overrides_name_the_problem(override, message):
    with pytest.raises(ConfigError, match=message):
        apply_overrides(get_recipe("tiny"), [override])


def test_resolve_needs_exactly_one_source(tmp_path):
    with pytest.raises(ConfigError, match="exactly one"):
        resolve(None, None)
    with pytest.raises(ConfigError, match="unknown recipe 'tinyy'"):
        resolve("tinyy", None)
    with pytest.raises(ConfigError, match="does not exist"):
        resolve(None, str(tmp_path / "missing.yaml"))
    save_yaml(get_recipe("bench-small"), tmp_path / "b.yaml")
    assert resolve(None, str(tmp_path / "b.yaml"), ["trainer.max_steps=3"]).trainer.max_steps == 3


def test_padded_vocab_and_window_pattern():
    m = get_recipe("olmo3_7b").model
    assert m.padded_vocab_size == 100352
    assert [i for i in range(32) if m.layer_window(i) is None] == list(range(3, 32, 4))
    six = dataclasses.replace(get_recipe("tiny").model, n_layers=6)
    assert [six.layer_window(i) for i in range(6)] == [64, 64, 64, None, 64, None]  # last layer forced global
    assert ExperimentConfig().model == m


def test_cli_prints_resolved_config_and_rejects_typos(tmp_path):
    olmax = [sys.executable, "-m", "olmax.cli"]
    out = subprocess.run(olmax + ["config", "--recipe", "tiny", "model.n_layers=6", "--save", str(tmp_path / "c.yaml")],
                         capture_output=True, text=True, check=True).stdout
    assert "n_layers: 6" in out and "name: tiny" in out
    assert load_yaml(tmp_path / "c.yaml").model.n_layers == 6
    bad = subprocess.run(olmax + ["config", "--recipe", "tiny", "model.n_layerz=6"], capture_output=True, text=True)
    assert bad.returncode == 2 and "n_layerz" in bad.stderr
