"""The import graph: no cycle anywhere, between modules or between packages at any depth, counting every
import (in functions and under TYPE_CHECKING too), and the layer contracts of pyproject.toml kept
(import-linter, as `make lint` runs it). docs/architecture.md draws the layers."""

import subprocess
import sys
from pathlib import Path

import pytest

grimp = pytest.importorskip("grimp")  # the `dev` extra, with import-linter

REPO = Path(__file__).resolve().parents[1]


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
