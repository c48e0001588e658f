"""What the docs state that code can check, checked, so that it cannot drift: the chip tables of
docs/flops.md and docs/launcher.md are the chip table's (olmax.fit.chips renders them), each config
error docs/config.md quotes with its override is the message olmax gives for it, and the on-chip test
count docs/testing.md gives is the number of tests in tests/test_tpu.py."""

import ast
import math
import re
from pathlib import Path

import pytest

from olmax.config.io import apply_overrides
from olmax.config.recipes import get_recipe
from olmax.errors import ConfigError
from olmax.fit import chips

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"


@pytest.mark.parametrize(("page", "table"), [("flops.md", chips.peak_table), ("launcher.md", chips.tpu_type_table)])
def test_chip_tables_are_the_chip_tables(page, table):
    assert table() in (DOCS / page).read_text(), f"docs/{page}'s table is not olmax.fit.chips':\n{table()}"


def quoted_errors(text: str) -> list[tuple[str, str]]:
    """(override, message) of every "`key=value` -> "message"" in a page, the message's whitespace as
    one space; "..." in a message stands for text left out."""
    pairs = re.findall(r"`([\w.]+=[^`]+)`(?: on the tiny recipe)? -> \"(.+?)\"(?=[):,.]|\s)", text, re.DOTALL)
    return [(override, " ".join(message.split())) for override, message in pairs]


def test_config_errors_quoted_in_the_docs_are_olmaxs():
    quoted = quoted_errors((DOCS / "config.md").read_text())
    assert len(quoted) >= 4, quoted  # the unknown key, the wrong type, a value out of range, a context axis
    for override, message in quoted:
        with pytest.raises(ConfigError) as e:
            apply_overrides(get_recipe("tiny"), [override])
        given, at = str(e.value), 0
        for piece in (p for p in re.split(r"\(\.\.\.\)|\.\.\.", message) if p):
            at = given.find(piece, at)
            assert at >= 0, f"docs/config.md quotes {override} -> {message!r}; olmax says {given!r}"
            at += len(piece)


def count_tests(tree: ast.Module) -> int:
    """The tests a module's `test_*` functions make: each parametrize multiplies by its cases (a literal
    list, or the name of a module-level one)."""
    lists = {
        t.id: len(node.value.elts)
        for node in tree.body
        if isinstance(node, ast.Assign) and isinstance(node.value, (ast.List, ast.Tuple))
        for t in node.targets
        if isinstance(t, ast.Name)
    }
    total = 0
    for node in tree.body:
        if not (isinstance(node, ast.FunctionDef) and node.name.startswith("test_")):
            continue
        cases = []
        for d in node.decorator_list:
            if isinstance(d, ast.Call) and ast.unparse(d.func).endswith("parametrize"):
                values = d.args[1]
                cases.append(len(values.elts) if isinstance(values, (ast.List, ast.Tuple)) else lists[values.id])
        total += math.prod(cases)
    return total


def test_the_on_chip_test_count_is_the_files():
    count = count_tests(ast.parse((ROOT / "tests" / "test_tpu.py").read_text()))
    testing = (DOCS / "testing.md").read_text()
    row = re.search(r"^\| `pytest -m tpu tests/test_tpu.py` on a TPU v5e.*?\| (\d+) passed \|", testing, re.M)
    assert row is not None and int(row.group(1)) == count, (row and row.group(0), count)
