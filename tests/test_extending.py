"""docs/extending.md stays true: every file it names exists, and the plug-in objective it shows is the
module tests/objectives/test_plugin_objective.py installs and trains with."""

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "extending.md"


def plugin_example() -> str:
    """The page's plug-in objective module (the python block that starts `# olmax_simpo.py`)."""
    (block,) = re.findall(r"```python\n(# olmax_simpo\.py.*?)```", PAGE.read_text(), re.DOTALL)
    return block


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
    from olmax.config import experiment, objective
    from olmax.fit import chips
    from olmax.objectives import base, registry
    from olmax.rewards import verifiers

    assert {"BUILTINS"} <= set(vars(registry)) and "BUILTINS" in vars(verifiers)
    assert {"ROWS_PER_ITEM", "ObjectiveConfig"} <= set(vars(objective)) and "DATA_CHECKS" in vars(experiment)
    assert {"CHIPS", "chip_of_device"} <= set(vars(chips)) and "pair_fields" in vars(base)
    fields = set(chips.Chip.__dataclass_fields__)
    assert {"tpu_type", "type_unit_devices", "torus_dims", "aliases", "device_kind"} <= fields
    for method in ("fields", "check_batch", "prepare", "micro_loss", "micro_metrics", "finish", "hold"):
        assert callable(getattr(base.Objective, method))
