"""The code verifier's tests taken apart: what runs in the program's process, and what only the verifier sees.

Upstream runs each `code` test (Python statements, mostly asserts) after the program in the program's own
process and counts it passed when it raises nothing (`open_instruct/code_utils/code_utils.py` at 42aa63c
and 9ade62d). A process that runs the program is the program's, though: there it can end the test with
exit status 0, replace `exec`, the comparison or the runner, read the expected answers out of the test's
code, or return an object whose `__eq__` says yes. So here the verdict is never the program's process's
to give. Each test is parsed (`ast`) when it is loaded and split (`plan`):

- the calls into the program run in the program's process (`Plan.steps`, "eval" steps), which returns
  their values, written strictly (code_values: exact builtin types, bounded); a call's arguments go with it,
  as the program's inputs. A call into the program is a call of a name the test does not bind (the
  program's), of a method of a program value, or of a builtin outside code_values.NAMES with a program value
  among its arguments; with a subscript or attribute of such a value, or arithmetic or a data builtin
  (`len`, `sorted`, `list`, ...) over program values alone (no literal of the test's in it), it makes one
  value (`Solution().two_sum([2, 7], 9)`, `sorted(f(x))[0]`, `f(x) + g(y)`);
- everything else in an assert runs in the verifier's own process (code_values.evaluate): the comparisons,
  `and`/`or`/`not`, literals, arithmetic with the test's own numbers, `abs`, `round`, `math.isclose`, ...,
  over those values. So the expected side of `assert f(x) == v`, `abs(f(x) - v) < eps`, `math.isclose(f(x),
  v)`, `f(x) in (a, b)`, `sorted(f(x)) == sorted(v)`, `f(x) == g(y)` never enters the program's process,
  and the program's exit status means nothing (`replay` decides from the values alone).

A test's statements: `assert E` (E split as above; the message is not evaluated), an expression
statement (a call into the program runs there and must return; anything else is evaluated by the
verifier), an assignment of a name (to a program value: in the program's process; to a value of the test's
own or one the verifier computes: in the verifier's process, and copied into the program's too only when a
later call passes the name as an input), an import (both), `pass`. Any other statement (a loop, a `with`,
a function of the test's) runs in the program's process as it is, provided it holds no comparison, assert or
raise: it can check nothing, only complete or not. Every call in an assert is made, in order, even where
Python's `and`/`or` would skip one; a call that raised fails the test only if the verdict needs its value.

The forms (`survey` counts them; `plan` logs each test it does not run as asserts, once per text):

- ASSERTS: at least one assert, every statement as above;
- STATEMENTS: no assert (`f()`, a loop): it passes when the program's process says its statements
  completed, which the program can always say: it checks nothing the program could not fake;
- REFUSED: a form that cannot be split so, or that does not parse: the test fails without running (upstream
  would run it): a comparison, assert or raise inside a loop, `if`, `try` or comprehension (`for x in xs:
  assert f(x) == y`, `if f(x) != y: raise ...`, `all(f(i) == i for i in r)`), a lambda, f-string or
  comprehension of the test's own values outside a call into the program, an attribute or builtin the
  verifier does not evaluate over test values (`"abc".replace(...)`, `list(map(int, "12"))`), `*`/`**`
  unpacking outside a call into the program, a value the verifier computed passed back into the program.
"""

from __future__ import annotations

import ast
import builtins
import copy
import functools
import json
import logging

from olmax.rewards import code_values as cv

logger = logging.getLogger(__name__)

ASSERTS, STATEMENTS, REFUSED = "asserts", "statements", "refused"
PURE, PROGRAM, OUTSIDE, BUILTIN = "pure", "program", "outside", "builtin"  # what an expression is made of
_BUILTIN_NAMES = frozenset(dir(builtins)) - set(cv.NAMES)
# a statement run as it is in the program's process holds none of these: it could hide a check there
_CHECKS = (ast.Assert, ast.Raise, ast.Compare)


class _Refused(Exception):
    """The test's form cannot be split (the message says where)."""


class Plan:
    """One `code` test: `steps` ("exec" | "eval", source) for the program's process, in order; `ops` for
    the verifier's replay: ("step", i) (step i must have completed), ("assert", expr), ("expr", expr),
    ("bind", target, expr); `form` ASSERTS, STATEMENTS or REFUSED (`why`)."""

    __slots__ = ("form", "steps", "ops", "why")

    def __init__(self, form: str, steps: tuple = (), ops: tuple = (), why: str = ""):
        self.form, self.steps, self.ops, self.why = form, steps, ops, why


def _join(kinds) -> str:
    if BUILTIN in kinds:
        raise _Refused("a builtin the verifier does not evaluate, over the test's own values")
    return PURE if all(kind == PURE for kind in kinds) else OUTSIDE


def _stored(node: ast.AST) -> set:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, (ast.Store, ast.Del))}


def _locals(node: ast.AST) -> set:
    """Names a comprehension or lambda in `node` binds for itself."""
    names = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.comprehension):
            names |= _stored(sub.target)
        elif isinstance(sub, ast.Lambda):
            names |= {a.arg for a in ast.walk(sub.args) if isinstance(a, ast.arg)}
    return names


def _rebuild(node: ast.AST, fn):
    """A shallow copy of `node` with `fn` applied to each child expression (keywords' values included)."""
    new = copy.copy(node)
    for field, value in ast.iter_fields(node):
        if isinstance(value, ast.expr):
            setattr(new, field, fn(value))
        elif isinstance(value, list):
            setattr(new, field, [fn(v) if isinstance(v, ast.expr) else _rebuild(v, fn) if isinstance(v, ast.keyword)
                                 else v for v in value])  # fmt: skip
    return new


class _Split:
    """One pass over a test's statements. `copied` names the test's own values the program's process
    must also hold (a first pass finds them: `needs`)."""

    def __init__(self, copied: frozenset):
        self.copied, self.needs = copied, set()
        self.env: dict[str, str] = {}  # names the test binds -> PURE | PROGRAM | OUTSIDE
        self.steps: list = []
        self.ops: list = []
        self.kinds: dict[int, str] = {}

    def kind(self, node: ast.expr) -> str:
        if id(node) not in self.kinds:
            self.kinds[id(node)] = self._kind(node)
        return self.kinds[id(node)]

    def _kind(self, node: ast.expr) -> str:  # noqa: C901 (one case per node type)
        if isinstance(node, ast.Constant):
            return PURE
        if isinstance(node, ast.Name):
            if node.id in self.env:
                return self.env[node.id]
            return PURE if node.id in cv.NAMES else BUILTIN if node.id in _BUILTIN_NAMES else PROGRAM
        if isinstance(node, ast.Attribute):
            base = self.kind(node.value)
            if base == PROGRAM:
                return PROGRAM
            if base != BUILTIN and node.attr in cv.KNOWN_ATTRIBUTES:
                return base
            raise _Refused(f"the attribute .{node.attr} of a value of the test's")
        if isinstance(node, ast.Call):
            return self._call(node)
        if isinstance(node, ast.Subscript):
            if self.kind(node.value) == PROGRAM:
                self.inputs(node.slice)
                return PROGRAM
            return _join([self.kind(node.value), self.kind(node.slice)])
        if isinstance(node, ast.Slice):
            return _join([self.kind(part) for part in (node.lower, node.upper, node.step) if part is not None])
        if isinstance(node, (ast.BinOp, ast.UnaryOp)) and not isinstance(node.op, ast.Not):
            parts = [self.kind(node.left), self.kind(node.right)] if isinstance(node, ast.BinOp) else [
                self.kind(node.operand)]  # fmt: skip
            return PROGRAM if set(parts) == {PROGRAM} else _join(parts)
        if isinstance(node, (ast.BoolOp, ast.Compare, ast.UnaryOp, ast.IfExp, ast.List, ast.Tuple, ast.Set)):
            return _join([self.kind(child) for child in ast.iter_child_nodes(node) if isinstance(child, ast.expr)])
        if isinstance(node, ast.Dict):
            if None in node.keys:
                raise _Refused("** unpacking outside a call into the program")
            return _join([self.kind(child) for child in (*node.keys, *node.values)])
        if isinstance(node, (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)):
            return self._comprehension(node)
        raise _Refused(f"{type(node).__name__} outside a call into the program")

    def _call(self, node: ast.Call) -> str:
        func = self.kind(node.func)
        arguments = [*node.args, *(keyword.value for keyword in node.keywords)]
        if any(isinstance(arg, ast.Starred) for arg in node.args) or any(k.arg is None for k in node.keywords):
            if func != PROGRAM:
                raise _Refused("* or ** unpacking outside a call into the program")
        if func == PROGRAM:
            self.inputs(*arguments)
            return PROGRAM
        parts = [self.kind(arg) for arg in arguments]
        if func == BUILTIN:  # print(f(x)), next(f(x)), map(str, f(x)): program values in, the program's out
            if PROGRAM not in parts:
                raise _Refused(f"{ast.unparse(node.func)}() over the test's own values")
            self.inputs(*arguments)
            return PROGRAM
        data = isinstance(node.func, ast.Name) and node.func.id in cv.DATA_FUNCTIONS
        positional = parts[: len(node.args)]
        options = all(k.arg in ("key", "reverse") and self.kind(k.value) == PURE for k in node.keywords)
        if data and positional and set(positional) == {PROGRAM} and options:
            return PROGRAM  # len(f(x)), sorted(f(x), reverse=True): program data in, its data out
        return _join([func, *parts])

    def _comprehension(self, node: ast.expr) -> str:
        # one over program values (and the test's inputs) is one program value; with a comparison inside
        # it would hide a check in the program's process
        if any(isinstance(sub, (*_CHECKS, ast.BoolOp, ast.IfExp)) for sub in ast.walk(node)):
            raise _Refused("a comparison inside a comprehension")
        names = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)} - _locals(node)
        if not any(self.env.get(name, PROGRAM if name not in cv.NAMES and name not in _BUILTIN_NAMES else PURE)
                   == PROGRAM for name in names):  # fmt: skip
            raise _Refused("a comprehension of the test's own values")
        self.inputs(node)
        return PROGRAM

    def inputs(self, *nodes: ast.AST) -> None:
        """`nodes` go into the program's process as they are (a call's arguments): a value the verifier
        computed cannot; the test's own values they name are copied there."""
        for node in nodes:
            for name in (n.id for n in ast.walk(node) if isinstance(n, ast.Name)):
                if self.env.get(name) == OUTSIDE:
                    raise _Refused(f"{name}, computed by the verifier from program values, passed to the program")
                if self.env.get(name) == PURE:
                    self.needs.add(name)

    def skeleton(self, node: ast.expr) -> ast.expr:
        """`node` for the verifier: each maximal program part replaced by the name of its value."""
        kind = self.kind(node)
        if kind == BUILTIN:  # a builtin named alone (`assert print`): not the verifier's, nor the program's
            raise _Refused(f"the builtin {ast.unparse(node)} outside a call")
        if kind == PURE:
            return node
        if kind == PROGRAM:
            self.steps.append(("eval", ast.unparse(node)))
            return ast.Name(id=f"leaf#{len(self.steps) - 1}", ctx=ast.Load())
        return _rebuild(node, self.skeleton)

    def run_inside(self, stmt: ast.stmt) -> None:
        self.steps.append(("exec", ast.unparse(stmt)))
        self.ops.append(("step", len(self.steps) - 1))

    def statement(self, stmt: ast.stmt) -> None:  # noqa: C901 (one case per statement type)
        if isinstance(stmt, ast.Assert):
            self.ops.append(("assert", self.skeleton(stmt.test)))
        elif isinstance(stmt, ast.Expr):
            if self.kind(stmt.value) == PROGRAM:
                self.run_inside(stmt)
            else:
                self.ops.append(("expr", self.skeleton(stmt.value)))
        elif isinstance(stmt, (ast.Assign, ast.AnnAssign)) and stmt.value is not None:
            self._assign(stmt, stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target])
        elif isinstance(stmt, (ast.Import, ast.ImportFrom)):
            self._import(stmt)
        elif isinstance(stmt, ast.Pass):
            pass
        else:  # run as it is; it may only complete or not
            if any(isinstance(sub, _CHECKS) for sub in ast.walk(stmt)):
                raise _Refused(f"a comparison, assert or raise inside a {type(stmt).__name__}")
            self.inputs(stmt)
            self.run_inside(stmt)
            self.env.update(dict.fromkeys(_stored(stmt) | _defined(stmt), PROGRAM))

    def _assign(self, stmt: ast.stmt, targets: list) -> None:
        names = [n for target in targets for n in ast.walk(target) if isinstance(n, ast.Name)]
        shapes = (ast.Name, ast.Tuple, ast.List, ast.expr_context)
        plain = all(isinstance(n, shapes) for target in targets for n in ast.walk(target))
        kind = self.kind(stmt.value)
        if not plain:  # obj.x = ..., d[k] = ...: into a program value
            roots = [t.value for t in targets if isinstance(t, (ast.Attribute, ast.Subscript))]
            if len(roots) != len(targets) or any(self.kind(root) != PROGRAM for root in roots):
                raise _Refused("an assignment into something other than a program value")
            self.inputs(stmt.value, *targets)
            self.run_inside(stmt)
            return
        if kind == PROGRAM:
            self.run_inside(stmt)
        else:
            self.ops.append(("bind", targets, self.skeleton(stmt.value)))
            if kind == PURE and {n.id for n in names} & self.copied:
                self.inputs(stmt.value)
                self.run_inside(stmt)
        self.env.update((n.id, kind) for n in names)

    def _import(self, stmt: ast.stmt) -> None:
        if any(alias.name == "*" for alias in stmt.names):
            raise _Refused("import *")
        self.run_inside(stmt)
        for alias in stmt.names:
            bound = alias.asname or alias.name.split(".")[0]
            module = stmt.module if isinstance(stmt, ast.ImportFrom) else alias.name
            if module in cv.MODULES and (isinstance(stmt, ast.Import) or alias.name in cv.MODULES[module]):
                # the verifier's own math, Fraction, Decimal (whatever the program bound to the name)
                value = ast.Name(id=module, ctx=ast.Load())
                if isinstance(stmt, ast.ImportFrom):
                    value = ast.Attribute(value=value, attr=alias.name, ctx=ast.Load())
                self.ops.append(("bind", [ast.Name(id=bound, ctx=ast.Store())], value))
                self.env[bound] = PURE
            else:
                self.env[bound] = PROGRAM


def _defined(stmt: ast.stmt) -> set:
    return {n.name for n in ast.walk(stmt) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}


@functools.lru_cache(maxsize=8192)
def plan(test: str) -> Plan:
    """The plan of one `code` test (module docstring); a REFUSED one is logged, once per text (plans are
    cached: the RL loop verifies each prompt's tests once per sample)."""
    try:
        body = ast.parse(test).body
        copied: frozenset = frozenset()
        for _ in range(len(body) + 1):  # until the test's values the program needs stop growing
            split = _Split(copied)
            for stmt in body:
                split.statement(stmt)
            if split.needs <= copied:
                break
            copied = frozenset(split.needs | copied)
    except (SyntaxError, ValueError, _Refused, RecursionError) as e:
        why = f"{type(e).__name__}: {e}" if not isinstance(e, _Refused) else str(e)
        logger.warning("code test refused (fails without running): %s: %.200r", why, test)
        return Plan(REFUSED, why=why)
    form = ASSERTS if any(op[0] == "assert" for op in split.ops) else STATEMENTS
    if form == STATEMENTS:
        logger.info("code test without an assert (passes when it completes): %.200r", test)
    return Plan(form, tuple(split.steps), tuple(split.ops))


def check(tests: list, stdio: bool) -> None:
    """Raise ValueError naming the first test that is not one: `code` tests are strings, `code_stdio` tests
    {"input": ..., "output": ...} objects."""
    for index, test in enumerate(tests):
        if stdio and not (isinstance(test, dict) and "input" in test and "output" in test):
            raise ValueError(f"code_stdio test {index} is not an object with input and output: {str(test)[:80]}")
        if not stdio and not isinstance(test, str):
            raise ValueError(f"code test {index} is a {type(test).__name__}, not a string of Python: {str(test)[:80]}")


def survey(tests: list) -> dict[str, int]:
    """How many of `tests` (`code` tests) are of each form: {ASSERTS: n, STATEMENTS: n, REFUSED: n}. For a
    data set's report at load: the REFUSED ones always fail, the STATEMENTS ones check nothing."""
    counts = dict.fromkeys((ASSERTS, STATEMENTS, REFUSED), 0)
    for test in tests:
        counts[plan(test).form] += 1
    return counts


def _scope_of(plan_: Plan, results: list) -> dict:
    scope = {}
    for index, (mode, _) in enumerate(plan_.steps):
        if mode != "eval":
            continue
        if index >= len(results):
            scope[f"leaf#{index}"] = cv.Missing()
        elif results[index] == ["e"]:
            scope[f"leaf#{index}"] = cv.LeafFailed()
        else:
            try:
                scope[f"leaf#{index}"] = cv.decode(results[index])
            except (ValueError, RecursionError):
                scope[f"leaf#{index}"] = cv.LeafFailed()
    return scope


def _bind(targets: list, value, scope: dict) -> None:
    for target in targets:
        if isinstance(target, ast.Name):
            scope[target.id] = value
        else:  # a tuple or list of names: unpacked as Python does
            items = list(value)
            if len(items) != len(target.elts):
                raise ValueError(f"cannot unpack {len(items)} values into {len(target.elts)} names")
            for element, item in zip(target.elts, items):
                _bind([element], item, scope)


def replay(plan_: Plan, results: list, complete: bool) -> str:
    """The outcome of a test ("pass", "fail", "timeout") from the results its steps returned, in order
    (an "exec" step: 0 when it completed, ["x"] when it raised; an "eval" step: its value as the runner
    wrote it, ["e"] when it raised), all of them when `complete`, else those before the program's process
    ran out of time. Decided here, by the test's own statements in order, never by the program's process."""
    scope = _scope_of(plan_, results)
    for op in plan_.ops:
        try:
            if op[0] == "step":
                if op[1] >= len(results):
                    raise cv.Missing()
                if results[op[1]] != 0:
                    return "fail"
            elif op[0] == "assert":
                if not cv.truth(cv.evaluate(op[1], scope)):
                    return "fail"
            elif op[0] == "expr":
                cv.evaluate(op[1], scope)
            else:
                _bind(op[1], cv.evaluate(op[2], scope), scope)
        except cv.Missing:
            return "fail" if complete else "timeout"
        except Exception:  # the statement raised, as it would have in Python (upstream: the test fails)
            return "fail"
    return "pass"


def judge(plan_: Plan, kind: str, payload: bytes) -> str:
    """The outcome of a `code` test from the record the runner wrote for it: kind "v" (its steps' results,
    JSON), "t" (out of time: the results so far, or nothing), "x" (the program itself failed)."""
    if kind == "x" or plan_.form == REFUSED:
        return "fail"
    try:
        results = json.loads(payload) if payload else []
    except (ValueError, RecursionError):
        return "fail"
    if not isinstance(results, list):
        return "fail"
    return replay(plan_, results, complete=kind == "v")


def judge_output(test: dict, kind: str, payload: bytes) -> str:
    """The outcome of a `code_stdio` test from its record: kind "o" (the program's output, UTF-8), "t" (out
    of time), "x" (the program raised, or wrote past the bound)."""
    if kind == "t":
        return "timeout"
    if kind != "o":
        return "fail"
    return "pass" if cv.same_output(payload.decode("utf-8", "surrogatepass"), test["output"]) else "fail"
