"""The import graph: no cycle anywhere, between modules or between packages at any depth, counting every
import (in functions and under TYPE_CHECKING too), and the layer contracts of pyproject.toml kept
(import-linter, as `make lint` runs it), and every package's docstring naming what it may import.
docs/architecture.md draws the layers."""

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

grimp = pytest.importorskip("grimp")  # the `dev` extra, with import-linter

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))
from layers import layers  # noqa: E402  the contract's layers, as scripts/layers.py reads them


def _graph():
    return grimp.build_graph("olmax", exclude_type_checking_imports=False)


def _cycles(nodes, edges) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan's algorithm, iterative)."""
    index, low, on_stack, stack, found, counter = {}, {}, set(), [], [], 0
    for root in nodes:
        if root in index:
            continue
        work = [(root, iter(sorted(edges.get(root, ()))))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_cycle_finder_finds_a_cycle():
    assert _cycles(["a", "b", "c"], {"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c"]]
    assert _cycles(["a", "b"], {"a": {"b"}}) == []


def test_no_import_cycle_between_modules_or_packages():
    graph = _graph()
    modules = sorted(graph.modules)
    edges = {m: graph.find_modules_directly_imported_by(m) for m in modules}
    assert len(modules) > 100 and sum(map(len, edges.values())) > 500  # the whole package was read
    assert _cycles(modules, edges) == [], "modules import each other"
    for depth in range(2, max(m.count(".") for m in modules) + 1):
        prefix = lambda m: ".".join(m.split(".")[:depth])  # noqa: E731, B023
        folded: dict[str, set] = {}
        for a, targets in edges.items():
            for b in targets:
                pa, pb = prefix(a), prefix(b)
                # a package's own modules importing each other, or a package and its contents: not a cycle
                # between packages (module cycles are checked above)
                if pa != pb and not pb.startswith(pa + ".") and not pa.startswith(pb + "."):
                    folded.setdefault(pa, set()).add(pb)
        assert _cycles(sorted({prefix(m) for m in modules}), folded) == [], (
            f"packages import each other (depth {depth})"
        )


def test_layer_contracts_hold():
    lint = Path(sys.executable).with_name("lint-imports")
    out = subprocess.run([str(lint), "--no-cache"], cwd=REPO, capture_output=True, text=True)
    assert out.returncode == 0 and " 0 broken" in out.stdout, out.stdout[-4000:] + out.stderr[-2000:]


def test_the_architecture_page_draws_the_current_layers():
    script = REPO / "scripts" / "layers.py"
    out = subprocess.run(
        [sys.executable, str(script), "--check", str(REPO / "docs" / "architecture.md")], capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr


def _declared(package: str) -> set[str]:
    """The packages (or modules) a package's docstring says it may import: its `May import:` sentence."""
    text = ast.get_docstring(ast.parse((REPO / "src" / "olmax" / package / "__init__.py").read_text()))
    sentence = re.search(r"May import: (.*?)\.(\s|$)", " ".join(text.split()))
    assert sentence, f"olmax.{package}'s docstring has no `May import:` sentence"
    return {m.removeprefix("olmax.") for m in re.findall(r"olmax\.[a-z_.]*[a-z_]", sentence[1])}


def test_each_package_docstring_says_what_it_imports():
    """Every package's `May import:` list holds what it imports (every import counted) and nothing the
    layers contract forbids it: a layer below its own."""
    layer_of = {p: i for i, layer in enumerate(layers()) for p in layer}
    graph = _graph()
    imported: dict[str, set[str]] = {}
    for module in graph.modules:
        if module.count(".") < 1:
            continue
        package = module.split(".")[1]
        for target in graph.find_modules_directly_imported_by(module):
            parts = target.split(".")
            if len(parts) > 1 and parts[1] != package:
                imported.setdefault(package, set()).add(".".join(parts[1:]))
    for package in sorted(p for p in layer_of if (REPO / "src" / "olmax" / p / "__init__.py").exists()):
        if package == "cli":  # the top: it may import every package
            continue
        declared = _declared(package)
        undeclared = {
            t for t in imported.get(package, ()) if not any(t == d or t.startswith(d + ".") for d in declared)
        }
        assert not undeclared, f"olmax.{package} imports {sorted(undeclared)}, which its docstring does not name"
        above = {d for d in declared if layer_of[d.split(".")[0]] <= layer_of[package]}
        assert not above, f"olmax.{package}'s docstring names {sorted(above)}, not below it in the layers contract"
