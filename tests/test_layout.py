"""House rules that a reviewer would otherwise have to remember:
- test modules import the reference implementations (torch, transformers, ai2-olmo-core, lm-eval) only
  inside the tests that need them, or at top level after `pytest.importorskip` of that package, so that
  collecting the suite works without the `parity` extra;
- the package is packages by concern: at most three modules directly under src/olmax, every package
  says in its docstring what it holds and what it may import, no file of src/ or benchmarks/ is over 600
  lines, no function of src/olmax over 100, and the tests mirror the packages (at most 15 files directly
  in tests/)."""

import ast
from pathlib import Path

REFERENCE_MODULES = {"torch", "transformers", "olmo_core", "lm_eval"}


def test_no_test_module_imports_a_reference_at_top_level():
    offenders = []
    for path in sorted(Path(__file__).parent.rglob("*.py")):
        skipped = set()  # packages the module importorskip-s before importing from them
        for node in ast.parse(path.read_text()).body:
            call = getattr(node, "value", None)
            if isinstance(call, ast.Call) and getattr(call.func, "attr", "") == "importorskip":
                skipped.add(call.args[0].value)
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            offenders += [
                f"{path.relative_to(Path(__file__).parent)}:{node.lineno} {n}"
                for n in names
                if n.split(".")[0] in REFERENCE_MODULES - skipped
            ]
    assert not offenders, offenders


ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "olmax"


def test_packages_by_concern():
    top = sorted(p.name for p in PACKAGE.glob("*.py") if p.name != "__init__.py")
    assert len(top) <= 3, top
    undocumented = [
        str(init.relative_to(PACKAGE))
        for init in PACKAGE.rglob("__init__.py")
        if init.parent != PACKAGE
        and "May import" not in (ast.get_docstring(ast.parse(init.read_text())) or "")
        and init.parent.name != "gpu_targets"  # package data, not code
    ]
    assert not undocumented, f"packages whose docstring does not say what they may import: {undocumented}"


def test_no_file_over_600_lines():
    long = {
        str(p.relative_to(ROOT)): n
        for folder in ("src", "benchmarks")
        for p in (ROOT / folder).rglob("*.py")
        if (n := len(p.read_text().splitlines())) > 600
    }
    assert not long, long


def test_tests_mirror_the_packages():
    top = sorted(p.name for p in Path(__file__).parent.glob("*.py"))
    assert len(top) <= 15, top
    folders = {p.name for p in Path(__file__).parent.iterdir() if p.is_dir() and list(p.glob("test_*.py"))}
    packages = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()} | {"benchmarks"}
    assert folders <= packages, folders - packages


def test_no_function_over_100_lines():
    """A function a reader holds at once: none in src/olmax longer than 100 lines (docstring included)."""
    long = {
        f"{p.relative_to(ROOT)}:{node.lineno} {node.name}": node.end_lineno - node.lineno + 1
        for p in PACKAGE.rglob("*.py")
        for node in ast.walk(ast.parse(p.read_text()))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno + 1 > 100
    }
    assert not long, long
