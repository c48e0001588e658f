"""House rules that a reviewer would otherwise have to remember: test modules import the reference
implementations (torch, transformers, ai2-olmo-core, lm-eval) only inside the tests that need them,
or at top level after `pytest.importorskip` of that package, so that collecting the suite works
without the `parity` extra."""

import ast
from pathlib import Path

REFERENCE_MODULES = {"torch", "transformers", "olmo_core", "lm_eval"}


def test_no_test_module_imports_a_reference_at_top_level():
    offenders = []
    for path in sorted(Path(__file__).parent.glob("*.py")):
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
                f"{path.name}:{node.lineno} {n}" for n in names if n.split(".")[0] in REFERENCE_MODULES - skipped
            ]
    assert not offenders, offenders
