"""What comes back from the program's process, and the verifier's own evaluation of a test over it.

The program's process returns data only (olmax.rewards.code_tests says which parts of a test run there): the
values of the calls into the program, each written as JSON by the sandbox's runner (`code_sandbox.encode`),
and a stdio program's output. This module reads those values back into Python's own types and evaluates
the rest of each test over them in the verifier's process, so that no code of the program's (a method, a
dunder, a patched builtin) takes part in a comparison:

- `decode`: a value as the runner wrote it, into exact builtin types only (None, bool, int, float,
  complex, str, bytes, bytearray, range, list, tuple, dict, set, frozenset) and the standard library's
  Fraction and Decimal, nested at most DEPTH deep; a value of any other type comes back as an `Opaque`
  placeholder, equal to nothing but itself, without
  truth value or order. A subclass of a builtin type was written as its base type's content (an IntEnum
  as its int, a Counter or OrderedDict as a dict, a namedtuple as a tuple): its own methods, `__eq__`
  included, are not used.
- `evaluate`: a small evaluator of Python expressions over those values and the test's own literals:
  literals and displays, arithmetic, comparisons, `and`/`or`/`not`, conditional expressions, subscripts
  and slices, calls of the builtins in NAMES and of `math`'s functions in MATH_ATTRIBUTES, and the
  read-only methods in METHODS (`" ".join(...)`, `d.items()`, ...), and `fractions.Fraction` and
  `decimal.Decimal`. Nothing else: no attribute or name
  outside those tables, no comprehension, lambda or string formatting. Results are bounded (ITEMS elements
  or characters, KEYS keys of a set or dict, BITS bits of a number, DECIMAL_DIGITS of a Decimal), checked
  before an operation that could pass the bound (`*`, `**`, `<<`, `range`, `bytes(n)`, `set(...)`) or take
  time quadratic in it (big-number division, colliding keys), so that a test over a program's value cannot
  make the verifier hold more than that, nor spend more than a fraction of a second.
- `same_output`: a stdio test's comparison, upstream's (`open_instruct/code_utils/testing_util.py`, the
  LiveCodeBench grader, at 42aa63c and 9ade62d): the same number of lines, each stripped, equal as text or as
  whitespace-separated Decimals.
"""

from __future__ import annotations

import ast
import builtins
import decimal
import fractions
import math
import operator
from decimal import Decimal
from fractions import Fraction

DEPTH = 100  # nesting of a value the verifier reads back (a cyclic or deeper value comes back Opaque)
ITEMS = 1 << 24  # elements, characters or bytes of any value the evaluator makes
# bits of any int (or Fraction's part) it reads or makes: CPython divides and takes gcds in time quadratic in
# the digits, 0.1 s at this size (79,000 decimal digits), minutes at the record's 8 MiB
BITS = 1 << 18
# members of a set or keys of a dict it reads or makes: ints, floats and tuples hash the same in every
# process, so a program can send keys that all collide, and building the set is quadratic in their number
KEYS = 1 << 12
DECIMAL_DIGITS = 10_000  # digits and exponent of a Decimal (int(Decimal("1e999999")) is a million digits)
_SIZED = (str, bytes, bytearray, list, tuple, dict, set, frozenset)


class Unsupported(ValueError):
    """A part of a test the verifier does not evaluate itself (the message names it)."""


class LeafFailed(Exception):
    """The test needs the value of a call into the program that raised, or that had no value to return."""


class Missing(Exception):
    """The test needs the value of a call the program's process never reached (it ran out of time)."""


class Opaque:
    """A value of a type that does not travel (a generator, a function, an instance of the program's own
    class, a value past the size bound): equal only to itself, unordered, and without a truth value."""

    __slots__ = ("kind",)

    def __init__(self, kind: str):
        self.kind = kind

    def __bool__(self):
        raise TypeError(f"a {self.kind} from the program has no truth value outside its process")

    def __repr__(self) -> str:
        return f"<{self.kind} from the program>"


# the builtins a test may call or name outside the program's process, always Python's own (a program that
# defines its own `sorted` does not change what a test's `sorted` is; `_guard_call` bounds range, bytes, pow,
# sum and type), and the module math
_BUILTINS = ("abs", "all", "any", "bin", "bool", "bytes", "chr", "complex", "dict", "divmod", "enumerate",
             "float", "frozenset", "hex", "int", "isinstance", "len", "list", "max", "min", "oct", "ord", "pow",
             "range", "repr", "reversed", "round", "set", "sorted", "str", "sum", "tuple", "type", "zip")  # fmt: skip
NAMES = {name: getattr(builtins, name) for name in _BUILTINS} | {"math": math, "fractions": fractions,
                                                                  "decimal": decimal}  # fmt: skip
# their results are data (not an iterator or a type): with only program values as arguments, the call runs in
# the program's process, as part of the value it returns (`len(f(x))`, `sorted(f(x))`, `list(f(x))`)
DATA_FUNCTIONS = frozenset(("abs", "all", "any", "bool", "dict", "float", "frozenset", "int", "len", "list",
                            "max", "min", "repr", "round", "set", "sorted", "str", "sum", "tuple"))  # fmt: skip
# math's functions of bounded cost (not factorial, comb, perm, prod: their results grow without bound)
MATH_ATTRIBUTES = frozenset(("isclose", "isnan", "isinf", "isfinite", "fabs", "floor", "ceil", "trunc", "sqrt",
                             "isqrt", "exp", "log", "log2", "log10", "sin", "cos", "tan", "atan", "atan2",
                             "hypot", "copysign", "fsum", "gcd", "pi", "e", "tau", "inf", "nan"))  # fmt: skip
_TEXT = ("count", "endswith", "find", "join", "lower", "lstrip", "rfind", "rsplit", "rstrip", "split",
         "splitlines", "startswith", "strip", "upper")  # fmt: skip
METHODS = {
    str: frozenset((*_TEXT, "isdigit", "isalpha", "isalnum", "isspace", "islower", "isupper")),
    bytes: frozenset((*_TEXT, "decode", "hex")),
    list: frozenset(("count", "index")),
    tuple: frozenset(("count", "index")),
    dict: frozenset(("get", "items", "keys", "values")),
    set: frozenset(("issubset", "issuperset", "isdisjoint", "union", "intersection", "difference")),
    frozenset: frozenset(("issubset", "issuperset", "isdisjoint", "union", "intersection", "difference")),
}
# what a test may take from the modules in NAMES (math's, and the two number types)
MODULES = {"math": MATH_ATTRIBUTES, "fractions": frozenset(("Fraction",)), "decimal": frozenset(("Decimal",))}
KNOWN_ATTRIBUTES = frozenset().union(*MODULES.values(), *METHODS.values())

_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow,
           ast.LShift: operator.lshift, ast.RShift: operator.rshift, ast.BitOr: operator.or_,
           ast.BitXor: operator.xor, ast.BitAnd: operator.and_}  # fmt: skip
_UNARY = {ast.USub: operator.neg, ast.UAdd: operator.pos, ast.Invert: operator.invert}
_COMPARE = {ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le,
            ast.Gt: operator.gt, ast.GtE: operator.ge, ast.Is: operator.is_, ast.IsNot: operator.is_not,
            ast.In: lambda a, b: a in b, ast.NotIn: lambda a, b: a not in b}  # fmt: skip


def decode(node, depth: int = 0):
    """A value from the runner's JSON (`code_sandbox.encode`): exact builtin types and Opaque only. Raises
    ValueError on anything the runner does not write (a JSON object, an unknown tag, a non-hashable key)."""
    if node is None or type(node) in (bool, int, float, str):
        return node
    if type(node) is not list or not node or type(node[0]) is not str or depth >= DEPTH:
        raise ValueError(f"not a value the runner writes: {str(node)[:80]}")
    tag, rest = node[0], node[1:]
    if tag in ("s", "S", "d") and len(rest) > 2 * KEYS:
        raise ValueError(f"a set or dict of more than {KEYS} keys")
    if tag in ("l", "t", "s", "S"):
        items = [decode(item, depth + 1) for item in rest]
        try:
            return {"l": list, "t": tuple, "s": set, "S": frozenset}[tag](items)
        except TypeError as e:  # an unhashable member of a set
            raise ValueError(str(e)) from None
    if tag == "d" and len(rest) % 2 == 0:
        pairs = [decode(item, depth + 1) for item in rest]
        try:
            return dict(zip(pairs[::2], pairs[1::2]))
        except TypeError as e:
            raise ValueError(str(e)) from None
    if tag == "o" and len(rest) == 1 and type(rest[0]) is str:
        return Opaque(rest[0][:100])
    if tag == "q" and len(rest) == 2:
        return _fraction(rest, depth)
    if not rest or not all(type(part) in (str, int, float) for part in rest):
        raise ValueError(f"not a value the runner writes: tag {tag[:8]!r}")
    if tag == "i" and len(rest) == 1 and type(rest[0]) is str and len(rest[0]) <= BITS // 4 + 3:
        return int(rest[0], 16)  # base 16: linear, and no limit on digits
    if tag in ("b", "B") and len(rest) == 1 and type(rest[0]) is str:
        return (bytes if tag == "b" else bytearray).fromhex(rest[0])
    if tag == "c" and len(rest) == 2 and all(type(part) is float for part in rest):
        return complex(*rest)
    if tag == "r" and len(rest) == 3 and all(type(part) is int for part in rest) and rest[2] != 0:
        return range(*rest)
    if tag == "D" and len(rest) == 1 and type(rest[0]) is str and len(rest[0]) <= 2 * DECIMAL_DIGITS:
        try:
            return _check_decimal(Decimal(rest[0]))
        except (ArithmeticError, Unsupported):
            raise ValueError(f"not a Decimal the verifier reads: {rest[0][:40]!r}") from None
    raise ValueError(f"not a value the runner writes: tag {tag[:8]!r}")


def _fraction(rest: list, depth: int) -> Fraction:
    numerator, denominator = (decode(part, depth + 1) for part in rest)
    if type(numerator) is not int or type(denominator) is not int or denominator <= 0:
        raise ValueError("not a Fraction")
    return Fraction(numerator, denominator)


def _check_decimal(value):
    if isinstance(value, Decimal) and value.is_finite():
        if len(value.as_tuple().digits) > DECIMAL_DIGITS or abs(value.adjusted()) > DECIMAL_DIGITS:
            raise Unsupported(f"a Decimal past {DECIMAL_DIGITS} digits or exponent")
    return value


def truth(value) -> bool:
    """bool(value), for a decoded value (an Opaque raises TypeError)."""
    return bool(value)


def _bits(value) -> int:
    if type(value) in (int, bool):
        return abs(value).bit_length()
    return max(value.numerator.bit_length(), value.denominator.bit_length()) if type(value) is Fraction else 0


def _check_power(base, exponent) -> None:
    if type(exponent) in (int, bool) and exponent > 0 and _bits(base) > 1 and _bits(base) * exponent > BITS:
        raise Unsupported(f"a power past {BITS} bits")


def _check_product(a, b) -> None:
    for seq, times in ((a, b), (b, a)):
        if isinstance(seq, _SIZED) and type(times) in (int, bool) and len(seq) * times > ITEMS:
            raise Unsupported(f"a repetition past {ITEMS} elements")
    if type(a) in (int, bool) and type(b) in (int, bool) and a.bit_length() + b.bit_length() > BITS:
        raise Unsupported(f"an int product past {BITS} bits")


def _bounded(value):
    if isinstance(value, _SIZED) and len(value) > (KEYS if isinstance(value, (set, frozenset, dict)) else ITEMS):
        raise Unsupported(f"a {type(value).__name__} of {len(value)} elements")
    if _bits(value) > BITS:
        raise Unsupported(f"a number past {BITS} bits")
    return _check_decimal(value)


def _binary(op: type, a, b):
    if op in (ast.FloorDiv, ast.Mod, ast.Div) and max(_bits(a), _bits(b)) > BITS // 4:
        raise Unsupported(f"a division of numbers past {BITS // 4} bits")  # quadratic in their digits
    if op is ast.Mult:
        _check_product(a, b)
    elif op is ast.Pow:
        _check_power(a, b)
    elif op is ast.LShift and type(b) in (int, bool) and b > BITS:
        raise Unsupported(f"a shift past {BITS} bits")
    elif op is ast.Mod and isinstance(a, (str, bytes, bytearray)):
        raise Unsupported("%-formatting")  # a width or precision can ask for any length
    if op not in _BINARY:
        raise Unsupported(f"the operator {op.__name__}")
    return _bounded(_BINARY[op](a, b))


def _attribute(value, name: str):
    if value in (math, fractions, decimal) and name in MODULES[value.__name__]:
        return getattr(value, name)
    owner = value if isinstance(value, type) else type(value)
    if owner in METHODS and name in METHODS[owner]:
        return getattr(value, name)
    raise Unsupported(f"the attribute .{name} of a {type(value).__name__}")


def _guard_call(function, args: list, kwargs: dict) -> None:
    """Refuse the calls of NAMES whose cost is not bounded by their arguments' size."""
    if function is range and len(range(*args)) > ITEMS:
        raise Unsupported(f"a range of more than {ITEMS} numbers")
    if function is bytes and args and type(args[0]) in (int, bool) and args[0] > ITEMS:
        raise Unsupported(f"bytes({args[0]}): more than {ITEMS}")
    if function is pow and len(args) == 2:
        _check_power(*args)
    if function in (divmod, pow) and max(map(_bits, args), default=0) > BITS // 4:
        raise Unsupported(f"{function.__name__}() of numbers past {BITS // 4} bits")
    # a sequence start makes sum quadratic in the values' size (list + list + ...)
    start = args[1] if len(args) > 1 else kwargs.get("start", 0)
    if function is sum and type(start) not in (int, float, complex, bool):
        raise Unsupported(f"sum() with a start of type {type(start).__name__}")
    if function is type and (len(args) != 1 or kwargs):
        raise Unsupported("type() with more than one argument (a new class)")
    # a Fraction of "1e-999999999" is an int of that many digits (a Decimal's exponent is bounded)
    if function is Fraction and any(isinstance(arg, str) and "e" in arg.lower() for arg in args):
        raise Unsupported("a Fraction of a string with an exponent")
    # keys that all collide make a set or dict quadratic to build: KEYS at most (`_call` passes a list)
    if function in (set, frozenset, dict) and args and len(args[0]) > KEYS:
        raise Unsupported(f"a {function.__name__} of more than {KEYS} keys")


def _call(node: ast.Call, scope: dict):
    function = evaluate(node.func, scope)
    args = [evaluate(arg, scope) for arg in node.args]
    if function in (set, frozenset, dict) and args and not isinstance(args[0], _SIZED + (range,)):
        args[0] = list(args[0])  # an iterator's length, for the bound on keys
    kwargs = {keyword.arg: evaluate(keyword.value, scope) for keyword in node.keywords}
    _guard_call(function, args, kwargs)
    return _bounded(function(*args, **kwargs))


def _compare(node: ast.Compare, scope: dict) -> bool:
    left = evaluate(node.left, scope)
    for op, right_node in zip(node.ops, node.comparators):
        right = evaluate(right_node, scope)
        if not truth(_COMPARE[type(op)](left, right)):
            return False
        left = right
    return True


def _bool_op(node: ast.BoolOp, scope: dict):
    value = None
    for part in node.values:
        value = evaluate(part, scope)
        if truth(value) == isinstance(node.op, ast.Or):
            return value
    return value


def _display(node, scope: dict):
    if isinstance(node, (ast.Dict, ast.Set)) and len(node.keys if isinstance(node, ast.Dict) else node.elts) > KEYS:
        raise Unsupported(f"a display of more than {KEYS} keys")
    if isinstance(node, ast.Dict):
        return {evaluate(k, scope): evaluate(v, scope) for k, v in zip(node.keys, node.values)}
    items = [evaluate(element, scope) for element in node.elts]
    return {ast.List: list, ast.Tuple: tuple, ast.Set: set}[type(node)](items)


def evaluate(node: ast.expr, scope: dict):
    """The value of the expression `node` over `scope` (the test's names and the program's values, decoded;
    NAMES for the rest). Raises Unsupported for a form outside the evaluator's tables, LeafFailed or Missing
    where the expression needs a program value that is not there, and what Python raises otherwise."""
    kind = type(node)
    if kind is ast.Constant:
        return node.value
    if kind is ast.Name:
        if node.id in scope:
            value = scope[node.id]
            if isinstance(value, (LeafFailed, Missing)):
                raise value
            return value
        if node.id in NAMES:
            return NAMES[node.id]
        raise NameError(f"name {node.id!r} is not defined outside the program's process")
    if kind is ast.Compare:
        return _compare(node, scope)
    if kind is ast.BoolOp:
        return _bool_op(node, scope)
    if kind is ast.UnaryOp:
        operand = evaluate(node.operand, scope)
        return not truth(operand) if isinstance(node.op, ast.Not) else _UNARY[type(node.op)](operand)
    if kind is ast.BinOp:
        return _binary(type(node.op), evaluate(node.left, scope), evaluate(node.right, scope))
    if kind is ast.IfExp:
        return evaluate(node.body if truth(evaluate(node.test, scope)) else node.orelse, scope)
    if kind is ast.Call:
        return _call(node, scope)
    if kind is ast.Attribute:
        return _attribute(evaluate(node.value, scope), node.attr)
    if kind is ast.Subscript:
        return evaluate(node.value, scope)[evaluate(node.slice, scope)]
    if kind is ast.Slice:
        return slice(*(None if part is None else evaluate(part, scope) for part in (node.lower, node.upper, node.step)))
    if kind in (ast.List, ast.Tuple, ast.Set, ast.Dict):
        return _bounded(_display(node, scope))
    raise Unsupported(f"a {kind.__name__} outside the program's process")


def _lines(text) -> list:
    return [line.strip() for line in str(text).strip().split("\n")]


def same_output(got, want) -> bool:
    """Upstream's stdio comparison: line by line, each stripped; a line that differs as text may still hold
    the same numbers (whitespace-separated Decimals). The line counts are compared first, before either
    text is split, so a long wrong output costs no list of its lines."""
    if str(got).strip().count("\n") != str(want).strip().count("\n"):
        return False
    for a, b in zip(_lines(got), _lines(want)):
        if a != b:
            try:
                if [Decimal(x) for x in a.split()] != [Decimal(x) for x in b.split()]:
                    return False
            except Exception:
                return False
    return True
