"""docs/extending.md stays true: every file it names exists, every name it gives is there, and the plug-in
objectives it shows are the modules tests/objectives/test_plugin_objective.py (SimPO) and
tests/objectives/test_kto_plugin.py (KTO, with its own kind of data) install and train with."""

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "extending.md"


def plugin_module(name: str) -> str:
    """The page's plug-in module `name` (the python block that starts `# NAME`)."""
    (block,) = re.findall(rf"```python\n(# {re.escape(name)}.*?)```", PAGE.read_text(), re.DOTALL)
    return block


def plugin_example() -> str:
    """The page's SimPO module."""
    return plugin_module("olmax_simpo.py")


def test_every_file_the_page_names_exists():
    named = set(re.findall(r"`((?:src|tests|docs|scripts|benchmarks)/[\w/.<>-]+)`", PAGE.read_text()))
    named |= set(re.findall(r"\b(tests/[\w/]+\.py)\b", PAGE.read_text()))
    concrete = {p for p in named if "<" not in p}
    assert len(concrete) > 20
    missing = sorted(p for p in concrete if not (REPO / p).exists())
    assert not missing, f"docs/extending.md names files that do not exist: {missing}"
    for template in named - concrete:  # src/olmax/objectives/<name>.py: its folder exists
        assert (REPO / template.split("<")[0]).is_dir(), template


def test_the_named_attributes_exist():
    from olmax.config import data_kind, objective
    from olmax.data import item_fields, pairs
    from olmax.fit import chips
    from olmax.objectives import base, logps, registry
    from olmax.rewards import verifiers

    assert {"BUILTINS"} <= set(vars(registry)) and "BUILTINS" in vars(verifiers)
    assert {"ObjectiveConfig"} <= set(vars(objective)) and {"DataKind", "BUILTINS"} <= set(vars(data_kind))
    assert {"ItemSource", "PairSource", "PairLoader", "ChatDocuments"} <= set(vars(pairs))
    assert "FIELDS_FILE" in vars(item_fields) and "statistic_logps" in vars(logps)
    assert {"CHIPS", "chip_of_device"} <= set(vars(chips)) and "item_fields" in vars(base)
    fields = set(chips.Chip.__dataclass_fields__)
    assert {"tpu_type", "type_unit_devices", "torus_dims", "aliases", "device_kind"} <= fields
    for method in ("fields", "check_batch", "prepare", "micro_loss", "micro_metrics", "finish", "hold"):
        assert callable(getattr(base.Objective, method))
    for attribute in ("data_fields", "unlogged_metrics", "reference_pass", "metric_names"):
        assert hasattr(base.Objective, attribute)
    assert callable(data_kind.DataKind.source) and callable(data_kind.DataKind.check)
    assert {"rows", "name"} <= set(data_kind.DataKind.__annotations__) | set(vars(data_kind.DataKind))
