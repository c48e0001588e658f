"""The code verifier's tests as loaded: each read once, before anything runs, for what it needs.

A `code` test runs as written in a process of its own, against the program's process
(olmax.rewards.code_harness, code_program); nothing of it is split or rewritten. Loading a test (`plan`,
cached per text) only reads, with `ast` and `symtable`:

- its free names: the names it uses that it does not bind itself (its imports, definitions and
  assignments bind), which are the names the program may provide;
- the names it uses as modules (`modules`): a module alias (`np`, `pd`), or a name it uses only as
  `X.attr` that is a module of the standard library's or a package tests use (numpy, pytest, pandas, ...):
  that module, in the tests' process, whatever the program bound to it (a test's `np.allclose` is numpy's);
- the well-known names it uses without importing them (`known`: `Counter`, `pi`, `sqrt`, `approx`, the
  names of math, collections, itertools, functools, ...) where it uses them beside another name of the
  program's (`assert count(s) == Counter(...)`, `want = sqrt(2)` then `assert f(2) == want`) or as values
  (`pi`): the library's object, not the program's (unless it is the test's only name a program could
  define: then it is the task);
- whether all of its free names are Python's builtins: then the builtin's name the program defines is
  the task's (a task named `sum`), and of those, only the innermost called (`builtin_order`: in
  `abs(pow(2, 0.5) - 1.4)` the task is `pow`, `abs` Python's);
- the modules it imports, which the sandbox imports once before the tests (code_runner);
- the names of the classes it defines at its top: the program's process binds a stand-in of each before
  the program runs, as upstream harnesses define them before it (LeetCode's `TreeNode` in an annotation);
- the methods of its classes the program may have run for it (`accessors`): those that only store what
  they are given on the instance and read it back (`self.val = val`, `return self._list`,
  `self._list.append(x)`), with no constant but a plain one, no global name and no computation; any other
  (a reference solution, a test method, a getter of the class's data) never runs for the program
  (code_remote).

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
_ALIASES = {"np": "numpy", "pd": "pandas", "nx": "networkx"}  # module aliases, whatever way a test uses them
_PACKAGES = frozenset(("numpy", "pytest", "pandas", "scipy", "sympy", "networkx"))  # besides the standard library
# well-known names (the first module's, where several have one); verbs common as task names are left out
_KNOWN_MODULES = ("math", "collections", "itertools", "functools", "heapq", "bisect", "string", "fractions", "decimal",
                  "datetime", "typing", "copy")  # fmt: skip
_NOT_KNOWN = frozenset(("merge", "count", "chain", "compress", "repeat", "cycle", "product", "accumulate", "bisect",
                        "Error", "error", "time", "copy", "tee"))  # fmt: skip
_KNOWN_EXTRA = {"approx": "pytest", "raises": "pytest", "allclose": "numpy", "array_equal": "numpy",
                "array_equiv": "numpy", "assert_allclose": "numpy.testing", "assert_array_equal": "numpy.testing",
                "assert_array_almost_equal": "numpy.testing", "assert_almost_equal": "numpy.testing"}  # fmt: skip
# well-known names that are task names as often (a task `mean` checked with `approx`): the library's only beside a
# call of a name that is not well known (`avg(xs) == mean(xs)`); never `mode`, a task's more often than not
_KNOWN_WEAK = {"array": "numpy", "zeros": "numpy", "ones": "numpy", "arange": "numpy", "linspace": "numpy",
               "itemgetter": "operator", "attrgetter": "operator", "methodcaller": "operator", "findall": "re",
               "finditer": "re", "fullmatch": "re",
               **dict.fromkeys(("mean", "fmean", "median", "median_low", "median_high", "geometric_mean",
                                "harmonic_mean", "stdev", "pstdev", "variance", "pvariance", "multimode", "quantiles"),
                               "statistics")}  # fmt: skip
_CAPTURES = ("stdout", "StringIO")  # a test that may capture what the program prints (contextlib.redirect_stdout)
_COMPUTING = (ast.BinOp, ast.Compare, ast.UnaryOp, ast.BoolOp)  # where a call's result is checked, not passed
# what an accessor may use (code_remote): plain constants, these builtins, these container methods
_PLAIN = (None, 0, 1, -1, "")
_ACCESSOR_CALLS = frozenset(("isinstance", "len", "int", "float", "str", "bool", "list", "tuple", "dict", "set"))
_MUTATORS = frozenset(("append", "appendleft", "extend", "add", "insert", "pop", "popleft", "remove", "discard",
                       "update", "clear"))  # fmt: skip


def _known_names() -> dict:
    import importlib

    known: dict = {}
    for name in _KNOWN_MODULES:
        module = importlib.import_module(name)
        for attr in dir(module):
            value = getattr(module, attr)
            if not attr.startswith("_") and attr not in _NOT_KNOWN and type(value).__name__ != "module":
                known.setdefault(attr, name)
    extra = {**_KNOWN_EXTRA, **_KNOWN_WEAK}
    return {**known, **{k: v for k, v in extra.items() if k not in known}}


_KNOWN = _known_names()


class Plan:
    """One `code` test as loaded (module docstring): `form` (RUN or REFUSED, with `why`), its `source` as it
    runs, its `free` names, the names it uses as `modules` ({name: module}), the well-known names it takes
    from the library (`known`, {name: module}), whether its free names are all builtins (`builtin_task`)
    and which of them is the task first (`builtin_order`), the modules it imports (`imports`), the classes
    at its top (`classes`), and its methods a program may have run (`accessors`, [first line, name])."""

    __slots__ = ("form", "why", "source", "free", "modules", "known", "builtin_task", "builtin_order", "imports",
                 "classes", "accessors", "dunders", "prints")  # fmt: skip

    def __init__(self, form: str, why: str = "", source: str = "", free=(), modules=None, known=None,
                 builtin_task=False, builtin_order=(), imports=(), classes=(), accessors=(), dunders=(),
                 prints=False):  # fmt: skip
        self.form, self.why, self.source = form, why, source
        self.free, self.modules, self.known = tuple(free), dict(modules or {}), dict(known or {})
        self.builtin_task, self.builtin_order, self.imports = builtin_task, tuple(builtin_order), imports
        self.classes, self.accessors, self.dunders = tuple(classes), tuple(accessors), tuple(dunders)
        self.prints = prints

    def spec(self) -> dict:
        """What the tests' process reads of it (code_runner `read_spec`)."""
        return {"source": self.source, "free": list(self.free), "modules": self.modules, "known": self.known,
                "builtin_task": self.builtin_task, "builtin_order": list(self.builtin_order),
                "classes": list(self.classes), "accessors": [list(a) for a in self.accessors],
                "dunders": list(self.dunders), "prints": self.prints}  # fmt: skip


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


def _modules(tree: ast.AST, free: set) -> dict:
    """The free names the test uses as modules (module docstring), with the module each names."""
    found = {name: _ALIASES[name] for name in free if name in _ALIASES}
    for name in _attribute_bases(tree, free):
        if name in sys.stdlib_module_names or name in _PACKAGES:
            found.setdefault(name, name)
    return found


def _within(node: ast.AST) -> set:
    return {id(n) for n in ast.walk(node)}


def _known(tree: ast.AST, free: set, modules: dict) -> dict:
    """The well-known names the test takes from the library (module docstring), with their modules."""
    others = free - _BUILTINS - set(modules)
    candidates = {name for name in others if name in _KNOWN}
    if not candidates or len(others) < 2:
        return {}
    nodes = list(ast.walk(tree))
    parents = {id(child): node for node in nodes for child in ast.iter_child_nodes(node)}
    defined = {node.name for node in nodes if isinstance(node, (ast.FunctionDef, ast.ClassDef))}
    # the program's names: its free ones, parameters the test calls (HumanEval's `candidate`), and names the test
    # assigns from them (`s = Solution()`)
    called = {n.func.id for n in nodes if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
    params = {a.arg for n in nodes if isinstance(n, ast.FunctionDef) for a in n.args.args}
    strong = candidates - set(_KNOWN_WEAK)
    found = {}
    for name in sorted(candidates):
        # a weak name's calls count as the program's for the others (`mean(xs) == approx(2.0)`: `approx` is pytest's)
        program = (others - (candidates if name in _KNOWN_WEAK else strong)) | (params & called)
        program |= _assigned_from(nodes, program)
        # the program's uses: its calls, and its names as values (`got = [f(n) ...]` then `got == want`)
        calls = [n for n in nodes if isinstance(n, ast.Call) and _base(n.func) in program]
        calls += [n for n in nodes if isinstance(n, ast.Name) and n.id in program and isinstance(n.ctx, ast.Load)]
        derived = _derived(nodes, name)
        uses = [n for n in nodes if isinstance(n, ast.Name) and n.id in derived and isinstance(n.ctx, ast.Load)]
        bare = any(n.id == name and _bare(n, parents.get(id(n)), defined) for n in uses)
        if bare or any(_beside(use, calls, parents) for use in uses):
            found[name] = _KNOWN[name]
    return found


def _derived(nodes: list, name: str) -> set:
    """`name` and what carries its value: names the test assigns from it (`want = Counter(...)`), and its own
    functions and classes that use it (`def expected(n): return factorial(n)`), and so on."""
    found, size = {name}, 0
    while len(found) > size:
        size = len(found)
        found |= _assigned_from(nodes, found)
        defined = [node for node in nodes if isinstance(node, (ast.FunctionDef, ast.ClassDef))]
        found |= {
            node.name
            for node in defined
            if any(isinstance(n, ast.Name) and n.id in found and isinstance(n.ctx, ast.Load) for n in ast.walk(node))
        }
    return found


def _base(node):
    while isinstance(node, (ast.Attribute, ast.Call, ast.Subscript)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else None


def _assigned_from(nodes: list, names: set) -> set:
    """The names the test assigns from expressions that use `names` (and so on)."""
    found, changed = set(names), True
    while changed:
        changed = False
        for node in nodes:
            if isinstance(node, ast.Assign) and any(
                isinstance(n, ast.Name) and n.id in found for n in ast.walk(node.value)
            ):
                for target in (n for t in node.targets for n in ast.walk(t) if isinstance(n, ast.Name)):
                    changed |= target.id not in found
                    found.add(target.id)
    return found - set(names)


def _bare(use: ast.Name, parent, defined: set) -> bool:
    """Whether a use of a name is as a value: not called, not `X.attr`, not passed to a function of the
    test's (HumanEval's `check(entry_point)`)."""
    if isinstance(parent, ast.Attribute) or isinstance(parent, ast.Call) and parent.func is use:
        return False
    return not (isinstance(parent, ast.Call) and isinstance(parent.func, ast.Name) and parent.func.id in defined)


def _beside(use: ast.Name, calls: list, parents: dict) -> bool:
    """Whether `use` checks a call of the program's: shares a comparison, a statement or the call of a
    checking function (`np.allclose`, `self.assertEqual`) with one that it is not nested in and that is not
    nested in it, or is called on one (`isclose(area(1), 3.14)`)."""
    call = parents.get(id(use))
    if isinstance(call, ast.Call) and call.func is use and any(c is not call and id(c) in _within(call) for c in calls):
        return True
    node, own = use, use
    while id(node) in parents and not isinstance(node, (ast.Compare, ast.stmt)):
        node = parents[id(node)]
        if isinstance(node, ast.Call) and any(node is call for call in calls):
            return False  # its value goes into the program, not beside it
        if isinstance(node, ast.Call) and node.func is own or isinstance(node, ast.Attribute) and node.value is own:
            own = node  # (`Ref.of(5)`, `Counter(s).most_common(1)`: its own value still)
        elif isinstance(node, ast.Call) and not isinstance(node.func, ast.Name):
            break
    unit, mine = _within(node), _within(own)
    return any(id(call) in unit and id(call) not in mine and id(own) not in _within(call) for call in calls)


def _builtin_order(tree: ast.AST, free: set) -> list:
    """The free builtin names the test calls that may be the task, innermost first (then in order of
    appearance): not one that checks another's result by arithmetic or comparison (`abs` in `abs(pow(2,
    0.5) - 1.41) < 1e-6`, `all` in `all([round(x) == y for ...])`): that one stays Python's even where the
    program defines it and not the other."""
    names = free & _BUILTINS
    depth: dict = {}
    checks: set = set()

    def walk(node, level, at, outer, computed):
        for child in ast.iter_child_nodes(node):
            inner, within, computes = level, outer, computed or isinstance(child, _COMPUTING)
            if isinstance(child, ast.Call) and isinstance(child.func, ast.Name) and child.func.id in names:
                entry = depth.setdefault(child.func.id, [level, at[0]])
                entry[0] = max(entry[0], level)
                at[0] += 1
                if outer is not None and computed:
                    checks.add(outer)
                inner, within, computes = level + 1, child.func.id, False
            walk(child, inner, at, within, computes)

    walk(tree, 0, [0], None, False)
    return sorted(set(depth) - checks, key=lambda name: (-depth[name][0], depth[name][1]))


def _accessors(tree: ast.AST) -> list:
    """[first line, name, recipe] of each method of the test's classes a program may have run for it (module
    docstring: reads of attributes that a method stores, or that a class sets to a plain constant), with the
    recipe of a constructor that only stores its arguments (`_recipe`)."""
    classes = [node for node in ast.walk(tree) if isinstance(node, ast.ClassDef)]
    readable = {
        n.attr for c in classes for n in ast.walk(c) if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store)
    }
    for c in classes:
        for statement in c.body:
            targets = statement.targets if isinstance(statement, ast.Assign) else [statement.target] if isinstance(
                statement, ast.AnnAssign) and statement.value is not None else []  # fmt: skip
            if targets and _plain_constant(statement.value):
                readable |= {t.id for t in targets if isinstance(t, ast.Name)}
    return [[f.lineno, f.name, _recipe(f) if f.name == "__init__" else None] for c in classes for f in c.body
            if isinstance(f, ast.FunctionDef) and not f.decorator_list and _Accessor(f, readable).ok]  # fmt: skip


def _recipe(function: ast.FunctionDef):
    """A constructor that only stores its arguments (`self.val = val`, `self.left = self.right = None`,
    `self.kids = kids if kids is not None else []`), as data the program's process applies itself
    (code_program `construct`): {"params": [[name, has default, default, keyword only], ...], "set": [[attr,
    value], ...]}, a value (and a default) ["p", param], ["c", constant], ["e", "list" | "dict" | "set"] or
    ["if", param, whether `is None`, value, value]. None for any other constructor (it runs in the tests'
    process)."""
    arguments = function.args
    if arguments.posonlyargs or arguments.vararg or arguments.kwarg or not arguments.args:
        return None
    positional = arguments.args[1:]
    defaults = [None] * (len(positional) - len(arguments.defaults)) + list(arguments.defaults)
    params = [[a.arg, d is not None, ["c", d.value] if isinstance(d, ast.Constant) else None, False]
              for a, d in zip(positional, defaults)]  # fmt: skip
    params += [[a.arg, d is not None, ["c", d.value] if isinstance(d, ast.Constant) else None, True]
               for a, d in zip(arguments.kwonlyargs, arguments.kw_defaults)]  # fmt: skip
    if any(p[1] and p[2] is None for p in params):
        return None
    me, names = arguments.args[0].arg, {p[0] for p in params}

    def value(node):
        if isinstance(node, ast.Name) and node.id in names:
            return ["p", node.id]
        if _plain_constant(node):
            return ["c", ast.literal_eval(node)]
        if isinstance(node, (ast.List, ast.Dict, ast.Set)) and not (
            node.keys if isinstance(node, ast.Dict) else node.elts
        ):
            return ["e", type(node).__name__.lower()]
        test = node.test if isinstance(node, ast.IfExp) else None
        if (isinstance(test, ast.Compare) and isinstance(test.left, ast.Name) and test.left.id in names
                and len(test.ops) == 1 and isinstance(test.ops[0], (ast.Is, ast.IsNot))
                and isinstance(test.comparators[0], ast.Constant) and test.comparators[0].value is None):  # fmt: skip
            then, other = value(node.body), value(node.orelse)
            return None if then is None or other is None else ["if", test.left.id, isinstance(test.ops[0], ast.Is),
                                                                 then, other]  # fmt: skip
        return None

    steps = []
    for statement in function.body:
        if isinstance(statement, ast.Pass) or (
            isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant)
        ):
            continue
        pairs = []
        if isinstance(statement, ast.Assign):
            for target in statement.targets:
                if isinstance(target, ast.Tuple) and isinstance(statement.value, ast.Tuple) and len(target.elts) == len(
                        statement.value.elts):  # fmt: skip
                    pairs += list(zip(target.elts, statement.value.elts))
                else:
                    pairs.append((target, statement.value))
        elif isinstance(statement, ast.AnnAssign) and statement.value is not None:
            pairs.append((statement.target, statement.value))
        else:
            return None
        for target, node in pairs:
            made = value(node)
            if made is None or not (isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name)
                                    and target.value.id == me):  # fmt: skip
                return None
            steps.append([target.attr, made])
    return {"params": params, "set": steps}


def _plain_constant(node) -> bool:
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        node = node.operand
    return isinstance(node, ast.Constant) and type(node.value) in (type(None), bool, int, float, str) and any(
        node.value == p and type(node.value) is not str or node.value == "" for p in _PLAIN)  # fmt: skip


class _Accessor:
    """Whether a method only stores what it is given and reads it back (`_accessors`)."""

    def __init__(self, function: ast.FunctionDef, readable: set):
        arguments = function.args
        self.params = {a.arg for a in (*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs,
                                       arguments.vararg, arguments.kwarg) if a is not None}  # fmt: skip
        self.readable = readable
        self.ok = all(map(self.statement, function.body))

    def statement(self, node) -> bool:  # noqa: C901 (one case per statement)
        if isinstance(node, ast.Pass):
            return True
        if isinstance(node, ast.Expr):
            value = node.value
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                return True  # a docstring
            return (isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and value.func.attr in
                    _MUTATORS and self.expr(value.func.value) and self.arguments(value))  # fmt: skip
        if isinstance(node, ast.Return):
            return node.value is None or self.expr(node.value)
        if isinstance(node, ast.Assign):
            return all(map(self.target, node.targets)) and self.expr(node.value)
        if isinstance(node, ast.AnnAssign):
            return self.target(node.target) and (node.value is None or self.expr(node.value))
        if isinstance(node, ast.If):
            return self.expr(node.test) and all(map(self.statement, node.body + node.orelse))
        return False

    def target(self, node) -> bool:
        if isinstance(node, (ast.Tuple, ast.List)):
            return all(map(self.target, node.elts))
        if isinstance(node, ast.Attribute):
            return isinstance(node.value, ast.Name) and node.value.id in self.params
        return isinstance(node, ast.Subscript) and self.expr(node.value) and self.expr(node.slice)

    def arguments(self, call) -> bool:
        return not call.keywords and all(self.expr(a) for a in call.args)

    def expr(self, node) -> bool:  # noqa: C901 (one case per expression)
        if isinstance(node, (ast.Constant, ast.UnaryOp)) and _plain_constant(node):
            return True
        if isinstance(node, ast.Name):
            return node.id in self.params
        if isinstance(node, ast.Attribute):
            return node.attr in self.readable and self.expr(node.value)
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            return all(map(self.expr, node.elts))
        if isinstance(node, ast.Dict):
            return all(k is not None and self.expr(k) for k in node.keys) and all(map(self.expr, node.values))
        if isinstance(node, ast.IfExp):
            return self.expr(node.test) and self.expr(node.body) and self.expr(node.orelse)
        if isinstance(node, ast.BoolOp):
            return all(map(self.expr, node.values))
        if isinstance(node, ast.UnaryOp):
            return isinstance(node.op, ast.Not) and self.expr(node.operand)
        if isinstance(node, ast.Compare):
            return all(isinstance(op, (ast.Is, ast.IsNot)) for op in node.ops) and all(
                map(self.expr, [node.left, *node.comparators]))  # fmt: skip
        if isinstance(node, ast.Call):
            return isinstance(node.func, ast.Name) and node.func.id in _ACCESSOR_CALLS and self.arguments(node)
        if isinstance(node, ast.Subscript):
            return self.expr(node.value) and self.expr(node.slice)
        return False


def _dunders(tree: ast.AST) -> list:
    """The special names the test asks for itself, as an attribute (`p.__dict__`, `Point.__slots__`) or as a string
    (`hasattr(p, '__dict__')`): of a program object, those are the program's answer (code_remote `Remote`); any
    other is a library's probe (numpy's `__array__`), which a program object does not answer."""
    names = {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
    names |= {node.value for node in ast.walk(tree) if isinstance(node, ast.Constant) and type(node.value) is str}
    if any(isinstance(node, ast.Name) and node.id == "vars" for node in ast.walk(tree)):
        names.add("__dict__")  # what vars() reads
    return sorted(name for name in names if len(name) > 4 and name.startswith("__") and name.endswith("__")
                  and name[2:-2].isidentifier())  # fmt: skip


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
    modules = _modules(tree, free)
    classes = [node.name for node in tree.body if isinstance(node, ast.ClassDef)]
    builtin_task = free <= _BUILTINS
    return Plan(RUN, "", source, sorted(free), modules, _known(tree, free, modules), builtin_task,
                _builtin_order(tree, free) if builtin_task else (), tuple(sorted(imported(tree))), classes,
                _accessors(tree), _dunders(tree), any(word in source for word in _CAPTURES))  # fmt: skip


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
