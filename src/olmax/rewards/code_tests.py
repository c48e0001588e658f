"""The code verifier's tests as loaded: each read once, before anything runs, for what it needs.

A `code` test runs as written in a process of its own, against the program's process
(olmax.rewards.code_harness, code_program); nothing of it is split or rewritten. Loading a test (`plan`,
cached per text) only reads, with `ast` and `symtable`:

- its free names: the names it uses that it does not bind itself (its imports, definitions and
  assignments bind), which are the names the program may provide;
- of those, the ones it uses only as `X.attr`: a standard-library module's name used so is that module,
  in the tests' process, whatever the program bound to it (a test's `math.isclose` is math's);
- whether all of its free names are Python's builtins: then a builtin's name the program defines is the
  task's (a task named `sum`), and only then does the program's definition take its place;
- the modules it imports, which the sandbox imports once before the tests (code_runner);
- the names of the classes it defines at its top: the program's process binds a stand-in of each before
  the program runs, as upstream harnesses define them before it (LeetCode's `TreeNode` in an annotation).

Forms (`survey` counts them; the RL loop prints the counts of its code rows when it loads them):

- RUN: the test runs (everything upstream's harness runs: asserts, loops, helpers, try/except,
  `pytest.raises`, HumanEval's `def check(candidate)`);
- REFUSED: it cannot run against a program: it does not parse, or it names nothing a program could
  define (`assert True`): it fails without running, and is logged once per text.

HumanEval's own form, {"test": "<its check(candidate)>", "entry_point": "<name>"}, is read as the test
followed by `check(<entry point>)`, as its harness runs it (openai/human-eval `execution.py`); the entry
point may be an expression (LeetCode's `Solution().twoSum`).
"""

from __future__ import annotations

import ast
import builtins
import functools
import logging
import symtable
import sys

logger = logging.getLogger(__name__)

RUN, REFUSED = "run", "refused"
_BUILTINS = frozenset(dir(builtins))


class Plan:
    """One `code` test as loaded: `form` (RUN or REFUSED, with `why`), its `source` as it runs, its `free`
    names, the free names it uses only as `X.attr` (`modules`), whether its free names are all builtins
    (`builtin_task`), and the modules it imports (`imports`)."""

    __slots__ = ("form", "why", "source", "free", "modules", "builtin_task", "imports", "classes")

    def __init__(self, form: str, why: str = "", source: str = "", free=(), modules=(), builtin_task=False,
                 imports=(), classes=()):  # fmt: skip
        self.form, self.why, self.source = form, why, source
        self.free, self.modules, self.builtin_task, self.imports = tuple(free), tuple(modules), builtin_task, imports
        self.classes = tuple(classes)

    def spec(self) -> dict:
        """What the tests' process reads of it (code_runner `read_spec`)."""
        return {"source": self.source, "free": list(self.free), "modules": list(self.modules),
                "builtin_task": self.builtin_task, "classes": list(self.classes)}  # fmt: skip


def source_of(test) -> str:
    """The text a `code` test runs: a string as it is; HumanEval's {"test", "entry_point"} as its check and
    the call of it."""
    if isinstance(test, dict):
        return f"{test['test']}\n\ncheck({test['entry_point']})\n"
    return test


def _free_names(source: str) -> set:
    table = symtable.symtable(source, "<test>", "exec")
    bound = {s.get_name() for s in table.get_symbols() if s.is_local()}
    free = {s.get_name() for s in table.get_symbols() if s.is_referenced() and not s.is_local()}
    pending = list(table.get_children())
    while pending:
        scope = pending.pop()
        free |= {s.get_name() for s in scope.get_symbols() if s.is_global() and s.is_referenced()} - bound
        pending += scope.get_children()
    return free


def _attribute_bases(tree: ast.AST, free: set) -> set:
    """The free names used only as the base of an attribute (`X.attr`)."""
    bases, other = set(), set()
    for node in ast.walk(tree):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Name) and child.id in free:
                (bases if isinstance(node, ast.Attribute) and node.value is child else other).add(child.id)
    return bases - other


def imported(tree: ast.AST) -> set:
    """The top-level modules `tree` imports."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.split(".")[0])
    return names


@functools.lru_cache(maxsize=8192)
def _plan(source: str) -> Plan:
    try:
        tree = ast.parse(source)
        free = _free_names(source)
    except (SyntaxError, ValueError, RecursionError) as e:
        why = f"it does not parse ({type(e).__name__}: {e})"
        logger.warning("code test refused (fails without running): %s: %.200r", why, source)
        return Plan(REFUSED, why, source)
    if not free:
        why = "it names nothing a program could define"
        logger.warning("code test refused (fails without running): %s: %.200r", why, source)
        return Plan(REFUSED, why, source)
    modules = {name for name in _attribute_bases(tree, free) if name in sys.stdlib_module_names}
    classes = [node.name for node in tree.body if isinstance(node, ast.ClassDef)]
    return Plan(RUN, "", source, sorted(free), sorted(modules), free <= _BUILTINS, tuple(sorted(imported(tree))),
                classes)  # fmt: skip


def plan(test) -> Plan:
    """The plan of one `code` test (module docstring); a REFUSED one is logged, once per text."""
    return _plan(source_of(test))


def check(tests: list, stdio: bool) -> None:
    """Raise ValueError naming the first test that is not one: `code` tests are strings of Python (or
    HumanEval's {"test", "entry_point"} objects), `code_stdio` tests {"input": ..., "output": ...} objects."""
    for index, test in enumerate(tests):
        if stdio:
            if not (isinstance(test, dict) and "input" in test and "output" in test):
                raise ValueError(f"code_stdio test {index} is not an object with input and output: {str(test)[:80]}")
        elif isinstance(test, dict):
            if not (isinstance(test.get("test"), str) and isinstance(test.get("entry_point"), str)):
                raise ValueError(f"code test {index} is a dict, not a string of Python or a HumanEval "
                                 f"{{'test', 'entry_point'}} object: {str(test)[:80]}")  # fmt: skip
            try:
                ast.parse(test["entry_point"], mode="eval")
            except SyntaxError:
                raise ValueError(
                    f"code test {index}'s entry_point is no expression: {test['entry_point'][:80]!r}"
                ) from None
        elif not isinstance(test, str):
            raise ValueError(f"code test {index} is a {type(test).__name__}, not a string of Python: {str(test)[:80]}")


def survey(tests: list) -> dict[str, int]:
    """How many of `tests` (`code` tests) are of each form: {RUN: n, REFUSED: n}. For a data set's report at
    load: the REFUSED ones always fail."""
    counts = dict.fromkeys((RUN, REFUSED), 0)
    for test in tests:
        counts[plan(test).form] += 1
    return counts
