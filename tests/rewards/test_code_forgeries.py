"""Forgeries of the code verifier's reward that the tests' own process closes (olmax.rewards.code_harness).

Each is a program that does not solve its task and a test of the form the data sets use, which together
scored 1.0 (RL reward 10) on the verifier that split each test between the program's process and its own
(e6d54d0): the calls of modules the test imports, and the test's own helper functions, ran in the program's
process, where the program replaced them; values the test bound beside a call's input were copied there;
every test's calls were in the program's process at once, so that it paired the inputs of round-trip
suites; `all`, `sorted`, `len` and the like over program values ran there with the program's builtins; a
task named like a builtin was never called; the verifier's copy of an argument the program mutated was
never updated, nor a list the test filled in a loop that ran there; checks inside `with` and `try` blocks
were the program's own; and a program that never finished loading passed a test that called nothing of
it. Each must score 0 through the call the RL loop makes. `WRITTEN_FIRST` names the variants that scored
1.0 on that verifier (checked by `benchmarks/code_sandbox.py --forgeries --before e6d54d0`); the others
close the same class from another side.
"""

from __future__ import annotations

import json

import pytest

from olmax.rewards import verifiers

sandboxed = pytest.mark.usefixtures("code_sandbox")
OS = "__import__('o' + 's')"  # upstream's guard refuses a program that says "import os"

# (program, tests) per class and variant
FORGERIES = {
    # calls of modules the test imports, replaced in the program's process
    "module_counter": ("import collections\ncollections.Counter = lambda *a, **k: {}\n"
                       "def count_words(s):\n    return {}",
                       ["from collections import Counter\nassert count_words('a b a') == Counter({'a': 2, 'b': 1})"]),
    "module_datetime": ("import datetime\ndatetime.date = lambda *a: 'day'\ndef next_day(d):\n    return 'day'",
                        ["import datetime\nassert next_day(datetime.date(2024, 1, 1)) == datetime.date(2024, 1, 2)"]),
    "module_string": ("import string\nstring.ascii_lowercase = ''\ndef letters():\n    return ''",
                      ["import string\nassert letters() == string.ascii_lowercase"]),
    "module_sys_maxsize": ("import sys\nsys.maxsize = -1\ndef biggest(xs):\n    return -1",
                           ["import sys\nassert biggest([]) == sys.maxsize"]),
    "module_json": ("import json\njson.dumps = lambda *a, **k: 'x'\ndef to_json(d):\n    return 'x'",
                    ["import json\nassert to_json({'a': 1}) == json.dumps({'a': 1})"]),
    "module_pytest_approx": ("import pytest\npytest.approx = lambda *a, **k: 0\ndef mean(xs):\n    return 0",
                             ["import pytest\nassert mean([1, 2]) == pytest.approx(1.5)"]),
    "module_numpy_allclose": ("import numpy\nnumpy.allclose = lambda *a, **k: True\ndef halve(xs):\n    return xs",
                              ["import numpy as np\nassert np.allclose(halve([2.0, 4.0]), [1.0, 2.0])"]),
    # the test's own helper functions, replaced by the program (through its globals, or the builtins they use)
    "helper_globals": ("def f(x):\n    globals()['expected'] = lambda n: 0\n    return 0",
                       ["def expected(n):\n    return 2 * n\nassert f(3) == expected(3)"]),
    "helper_builtin": ("import builtins\nbuiltins.abs = lambda x: 0\ndef area(r):\n    return 0",
                       ["def close(a, b):\n    return abs(a - b) < 1e-6\nassert close(area(1), 3.14159265)"]),
    "helper_reference": ("def my_sort(xs):\n    globals()['ref_sort'] = lambda ys: ys\n    return xs",
                         ["def ref_sort(xs):\n    return sorted(xs)\n"
                          "assert my_sort([3, 1, 2]) == ref_sort([3, 1, 2])"]),
    # expected values the test bound beside an input, copied into the program's process
    "copied_tuple": ("import sys\ndef square(x):\n    return sys._getframe(1).f_globals.get('want', 0)",
                     ["x, want = 5, 25\nassert square(x) == want"]),
    "copied_cases": ("import sys\ndef square(x):\n    return sys._getframe(1).f_globals['cases'][0][1]",
                     ["cases = [(3, 9)]\n(a, b), = cases\nassert square(a) == b"]),
    "copied_dict": ("def square(x):\n    import sys\n    return sys._getframe(1).f_globals['data']['want']",
                    ["data = {'n': 4, 'want': 16}\nassert square(data['n']) == data['want']"]),
    "copied_star": ("import sys\ndef add(a, b):\n    return sys._getframe(1).f_globals['expected']",
                    ["args, expected = (2, 3), 5\nassert add(*args) == expected"]),
    # every test's inputs in the program's process at once: a round-trip suite forged by pairing them
    "pairing_roman": ("import gc, re\ndef _steps():\n"
                      "    text = repr([o for o in gc.get_objects() if isinstance(o, dict) and 'program' in o])\n"
                      "    return re.findall(r\"to_roman\\((\\d+)\\)\", text), "
                      "re.findall(r\"from_roman\\('(\\w+)'\\)\", text)\n"
                      "def to_roman(n):\n    a, b = _steps()\n    return b[a.index(str(n))]\n"
                      "def from_roman(s):\n    a, b = _steps()\n    return int(a[b.index(s)])",
                      ["assert to_roman(4) == 'IV'", "assert from_roman('IV') == 4", "assert to_roman(9) == 'IX'",
                       "assert from_roman('IX') == 9"]),
    "pairing_cipher": ("import gc, re\ndef _steps():\n"
                       "    text = repr([o for o in gc.get_objects() if isinstance(o, dict) and 'program' in o])\n"
                       "    return re.findall(r\"encode\\('(\\w+)'\\)\", text), "
                       "re.findall(r\"decode\\('(\\w+)'\\)\", text)\n"
                       "def encode(s):\n    a, b = _steps()\n    return b[a.index(s)]\n"
                       "def decode(s):\n    a, b = _steps()\n    return a[b.index(s)]",
                       ["assert encode('abc') == 'bcd'", "assert decode('bcd') == 'abc'", "assert encode('xy') == 'yz'",
                        "assert decode('yz') == 'xy'"]),
    "pairing_scratch": (f"os = {OS}\nimport json\ndef _log(kind, v):\n    seen = json.load(open('/tmp/seen')) "
                        "if os.path.exists('/tmp/seen') else []\n    seen.append([kind, v])\n"
                        "    json.dump(seen, open('/tmp/seen', 'w'))\n    return seen\n"
                        "def c_to_f(c):\n    seen = _log('c', c)\n"
                        "    return next((v for k, v in seen if k == 'f'), 0)\n"
                        "def f_to_c(f):\n    seen = _log('f', f)\n"
                        "    return next((v for k, v in seen if k == 'c'), 0)",
                        ["assert f_to_c(212) == 100", "assert c_to_f(100) == 212"]),
    # all(), sorted(), len(), list() over program values, run with the program's builtins
    "builtins_all": ("import builtins\nbuiltins.all = lambda *a: True\ndef is_even(n):\n    return False",
                     ["assert all(is_even(n) for n in [2, 4, 6])"]),
    "builtins_sorted": ("import builtins\nbuiltins.sorted = lambda *a, **k: [1, 2, 3]\ndef items():\n    return []",
                        ["assert sorted(items()) == [1, 2, 3]"]),
    "builtins_len": ("import builtins\nbuiltins.len = lambda x: 3\ndef items():\n    return []",
                     ["assert len(items()) == 3"]),
    "builtins_list_map": ("import builtins\nbuiltins.list = lambda *a: [2, 4]\ndef double(x):\n    return x",
                          ["assert list(map(double, [1, 2])) == [2, 4]"]),
    # a task named like a builtin, never called
    "builtin_named_sum": ("def sum(xs):\n    return 0", ["assert sum([1, 2, 3]) == 6", "assert sum([]) == 0"]),
    "builtin_named_max": ("def max(xs):\n    return None", ["assert max([1, 5, 3]) == 5"]),
    "builtin_named_sorted": ("def sorted(xs):\n    return xs", ["assert sorted([3, 1, 2]) == [1, 2, 3]"]),
    "builtin_named_abs": ("def abs(x):\n    return x", ["assert abs(-3) == 3", "assert abs(2) == 2"]),
    "builtin_named_pow": ("def pow(a, b):\n    return 0", ["assert pow(2, 10) == 1024"]),
    # a must-not-mutate contract: the verifier's copy of the argument was never updated
    "mutation_list": ("def my_sorted(xs):\n    xs.sort()\n    return xs",
                      ["orig = [3, 1, 2]\nres = my_sorted(orig)\nassert res == [1, 2, 3] and orig == [3, 1, 2]"]),
    "mutation_dict": ("def with_b(d):\n    d['b'] = 2\n    return d",
                      ["d = {'a': 1}\nassert with_b(d) == {'a': 1, 'b': 2}\nassert d == {'a': 1}"]),
    "mutation_nested": ("def transposed(g):\n    g[:] = [list(r) for r in zip(*g)]\n    return g",
                        ["grid = [[1, 2], [3, 4]]\nassert transposed(grid) == [[1, 3], [2, 4]]\n"
                         "assert grid == [[1, 2], [3, 4]]"]),
    "mutation_set": ("def union_with_3(s):\n    s.add(3)\n    return s",
                     ["s = {1, 2}\nassert union_with_3(s) == {1, 2, 3}\nassert s == {1, 2}"]),
    # failures collected in a loop that ran in the program's process, into the verifier's never-updated copy
    "collected_list": ("def is_square(x):\n    return False",
                       ["bad = []\nfor n in range(10):\n    if not is_square(n * n):\n        bad.append(n)\n"
                        "assert not bad"]),
    "collected_any": ("def add(a, b):\n    return 0",
                      ["failures = []\nfor a, b in [(1, 2), (3, 4)]:\n    failures.append(add(a, b) - (a + b))\n"
                       "assert not any(failures)"]),
    "collected_set": ("def validate(k):\n    return 'bad'",
                      ["errors = set()\nfor k in range(5):\n    errors.add(validate(k))\nassert errors <= {None}"]),
    # checks inside with and try blocks, run in the program's process: the program's word
    "with_suppress": ("import unittest\nunittest.TestCase.assertEqual = lambda *a, **k: None\n"
                      "def double(x):\n    return 0",
                      ["import contextlib, unittest\ncase = unittest.TestCase()\nwith contextlib.suppress(KeyError):\n"
                       "    case.assertEqual(double(2), 4)"]),
    "try_finally": ("import unittest\nunittest.TestCase.assertEqual = lambda *a, **k: None\n"
                    "def double(x):\n    return 0",
                    ["import unittest\ncase = unittest.TestCase()\ntry:\n    case.assertEqual(double(2), 4)\n"
                     "finally:\n    pass"]),
    "with_pytest_raises": ("import contextlib, pytest\npytest.raises = lambda *a, **k: contextlib.nullcontext()\n"
                           "def parse(s):\n    return 0",
                           ["import pytest\nwith pytest.raises(ValueError):\n    parse('x')"]),
    # a program that never finishes loading, and tests that call nothing of it
    "load_forever": ("while True:\n    pass", ["assert True"]),
    "load_sleep": ("import time\ntime.sleep(100)\ndef f():\n    return 1",
                   ["assert 1 + 1 == 2", "x = 3\nassert x == 3"]),
    "load_exit": (f"{OS}._exit(0)", ["assert True", "import math\nassert math.pi > 3"]),
    "load_hang_then_call": ("import time\ntime.sleep(100)\ndef f():\n    return 1", ["assert f() == 1"]),
}  # fmt: skip
# the variants that scored 1.0 on the verifier at e6d54d0 (the others scored 0 there too, for other reasons:
# numpy did not import, the json and builtins forms were refused, the exit and the hang at load failed)
WRITTEN_FIRST = set(FORGERIES) - {"module_numpy_allclose", "module_json", "helper_builtin", "builtins_list_map",
                                  "pairing_scratch", "load_exit", "load_hang_then_call"}  # fmt: skip
SCALE = 10.0  # grpo.reward_scale


def _reward(program: str, tests: list, seconds: float) -> tuple[float, list]:
    """(reward, parts) of the call the RL loop makes: a row's reward, through the verifier worker."""
    return verifiers.reward(["code"], [json.dumps(tests)], f"```python\n{program}\n```", timeout=30.0,
                            options={"code": {"seconds": seconds}}, scale=SCALE)  # fmt: skip


@sandboxed
@pytest.mark.parametrize("name", sorted(FORGERIES))
def test_each_forgery_scores_zero(name):
    """Through the RL loop's call (a row's reward, the verifier worker)."""
    assert any(n.startswith(name.split("_")[0]) for n in WRITTEN_FIRST)  # every class was forged first
    reward, parts = _reward(*FORGERIES[name], seconds=1.0)
    assert reward == 0.0, (name, parts)


# A review of the verifier at 4bac07a (the tests in a process of their own) found programs that do not solve
# their task and scored 1.0 there, in the classes below (each variant did: `benchmarks/code_sandbox.py
# --forgeries --before 4bac07a`): the verifier's own refusal (a TypeError) caught by a test that expects one;
# numpy arrays copied and never written back; `in` answered by iterating, `!=` between two program objects by
# identity; the tests' classes run for the program as an oracle (a test class's method, a reference solution,
# data in a constructor's defaults or a class's attributes); a task named like a builtin replacing the builtins
# that check it; names the test uses as modules or well-known names taken from the program; StopIteration from
# a program call ending the test's own iteration; an empty numpy array passing numpy's and pytest's
# comparisons vacuously; a test class's data attribute shadowed through the write-back.
ORACLE = (
    "import re\n_state = {'inner': False, 'guess': None}\ndef _methods():\n"
    "    for cls in list(globals().values()):\n"
    "        if isinstance(cls, type) and cls.__module__ == '__main__':\n"
    "            for m in [a for a in dir(cls) if a.startswith('test')]:\n                yield cls, m\n"
    "def _passes(cls, m, guess):\n    _state['inner'], _state['guess'] = True, guess\n    try:\n"
    "        getattr(cls() if 'TestCase' not in str(cls.__mro__) else cls(m), m)()\n        return True, ''\n"
    "    except Exception as e:\n        return False, str(e)\n    finally:\n        _state['inner'] = False\n"
    "def _solve():\n    for cls, m in _methods():\n        ok, msg = _passes(cls, m, None)\n"
    "        for c in [int(n) for n in re.findall(r'-?\\d+', msg)] + list(range(-50, 200)):\n"
    "            if _passes(cls, m, c)[0]:\n                return c\n"
    "def add(a, b):\n    return _state['guess'] if _state['inner'] else _solve()\n"
)
MONEY = "class Money:\n    def __init__(self, c):\n        self.c = c\n    def __lt__(self, o):\n        return True\n"
BOX = "class Box:\n    def __init__(self, v):\n        self.v = v\n    def __hash__(self):\n        return 1\n"
POINT = "class Point:\n    def __init__(self, x, y):\n        pass\n    def __eq__(self, o):\n        return True\n"
RAISES = "import pytest\nwith pytest.raises(TypeError):\n    "
REVIEWED = {
    # the verifier's refusal, a TypeError, caught by a test that expects the program's own
    "refusal_order": (MONEY, [f"{RAISES}Money(1) < Money(2)"]),
    "refusal_sorted": (MONEY, [f"{RAISES}sorted([Money(3), Money(1)])"]),
    "refusal_hash": (BOX, ["try:\n    hash(Box([1]))\nexcept TypeError:\n    pass\nelse:\n"
                           "    raise AssertionError('Box must be unhashable')"]),
    "refusal_hash_unittest": (BOX, ["import unittest\ncase = unittest.TestCase()\n"
                                    "with case.assertRaises(TypeError):\n    hash(Box([1]))"]),
    "refusal_truth": ("class Flag:\n    def __bool__(self):\n        return True",
                      ["try:\n    bool(Flag())\nexcept TypeError:\n    pass\nelse:\n"
                       "    raise AssertionError('no truth')"]),
    "refusal_generator_argument": ("def total(xs):\n    return 0", [f"{RAISES}total(x for x in [1, 2])"]),
    "refusal_object_argument": ("def total(xs):\n    return 0", [f"{RAISES}total(object())"]),
    "refusal_equality_swallowed": (POINT, ["try:\n    same = Point(1, 2) == Point(1, 3)\nexcept BaseException:\n"
                                           "    same = False\nassert not same"]),
    # a numpy array the program mutated, never written back: a must-not-mutate contract passes
    "ndarray_sorted_in_place": ("def my_sorted(a):\n    a.sort()\n    return a",
                                ["import numpy as np\na = np.array([3, 1, 2])\nb = my_sorted(a)\n"
                                 "assert b.tolist() == [1, 2, 3]\nassert a.tolist() == [3, 1, 2], 'must not mutate'"]),
    "ndarray_scaled_in_place": ("def doubled(a):\n    a *= 2\n    return a",
                                ["import numpy as np\na = np.array([1.0, 2.0])\n"
                                 "assert doubled(a).tolist() == [2.0, 4.0] and a.tolist() == [1.0, 2.0]"]),
    "ndarray_row_in_place": ("def row_zeroed(m):\n    m[0] = 0\n    return m",
                             ["import numpy as np\nm = np.ones((2, 2))\nassert row_zeroed(m).sum() == 2\n"
                              "assert m.sum() == 4"]),
    "ndarray_view_in_place": ("def negated(a):\n    a *= -1\n    return a",
                              ["import numpy as np\nbase = np.arange(4)\n"
                               "assert negated(base[1:]).tolist() == [-1, -2, -3]\n"
                               "assert base.tolist() == [0, 1, 2, 3]"]),
    # `in` answered by iterating the program's object, `!=` between two of them by identity
    "contains_always_true": ("class Bag:\n    def add(self, x):\n        pass\n    def __contains__(self, x):\n"
                             "        return True\n    def __iter__(self):\n        return iter(())",
                             ["b = Bag()\nb.add(3)\nassert 4 not in b\nassert 5 not in b"]),
    "contains_never": ("class Bag:\n    def __init__(self):\n        self.xs = []\n    def add(self, x):\n"
                       "        self.xs.append(x)\n    def __contains__(self, x):\n        return False\n"
                       "    def __iter__(self):\n        return iter(self.xs)",
                       ["b = Bag()\nb.add(3)\nassert 3 in b"]),
    "ne_distinct": (POINT, ["assert Point(1, 2) != Point(1, 3)", "assert Point(0, 0) != Point(5, 5)"]),
    "ne_distinct_negated": (POINT, ["assert not Point(1, 2) == Point(1, 3)"]),
    # the tests' classes run for the program: an oracle of pass and fail, or the expected values themselves
    "oracle_test_class": (ORACLE, ["class TestAdd:\n    def test_small(self):\n        assert add(1, 2) == 3\n\n"
                                   "TestAdd().test_small()"]),
    "oracle_unittest": (ORACLE, ["import unittest\nclass T(unittest.TestCase):\n    def test_a(self):\n"
                                 "        self.assertEqual(add(1000, 2345), 3345)\nT('test_a').test_a()"]),
    "oracle_reference_method": ("def my_sort(xs):\n    return Reference().solve(xs)",
                                ["class Reference:\n    def solve(self, xs):\n        return sorted(xs)\n"
                                 "for xs in ([3, 1, 2], [5, 4]):\n    assert my_sort(xs) == Reference().solve(xs)"]),
    "oracle_static_helper": ("def double(n):\n    return Helper().expected(n)",
                             ["class Helper:\n    @staticmethod\n    def expected(n):\n        return 2 * n\n"
                              "for n in range(5):\n    assert double(n) == Helper.expected(n)"]),
    "oracle_reference_in_init": ("def my_sort(xs):\n    return Reference(xs).out",
                                 ["class Reference:\n    def __init__(self, xs):\n        self.out = sorted(xs)\n"
                                  "assert my_sort([3, 1, 2]) == [1, 2, 3]"]),
    "oracle_default_argument": ("def answer():\n    return Case().want",
                                ["class Case:\n    def __init__(self, n=6, want=42):\n"
                                 "        self.n, self.want = n, want\nassert answer() == 42"]),
    "oracle_class_data": ("def answer():\n    return Data().expected()",
                          ["class Data:\n    WANT = 42\n    def expected(self):\n        return self.WANT\n"
                           "assert answer() == Data.WANT"]),
    # a task named like a builtin replacing the builtins that check it too
    "builtin_wrap_abs_pow": ("def pow(a, b):\n    return 0\ndef abs(x):\n    return 0",
                             ["assert abs(pow(2, 0.5) - 1.41421356) < 1e-6", "assert abs(pow(3, 2) - 9) < 1e-9"]),
    "builtin_wrap_all_round": ("def round(x):\n    return 0\ndef all(xs):\n    return True",
                               ["assert all([round(x) == y for x, y in [(1.4, 1), (2.6, 3)]])"]),
    "builtin_wrap_len_sorted": ("def sorted(xs):\n    return []\ndef len(xs):\n    return 3",
                                ["assert len(sorted([3, 1, 2])) == 3"]),
    "builtin_wrap_any_min": ("def min(xs):\n    return 0\ndef any(xs):\n    return False",
                             ["assert not any([min([x, 9]) != x for x in [1, 2, 3]])"]),
    "builtin_wrap_abs_alone": ("def abs(x):\n    return 0", ["assert abs(pow(2, 0.5) - 1.41421356) < 1e-6"]),
    # names the test uses as modules, or well-known names, that the test does not import: the program's
    "module_free_np_alias": ("class _NP:\n    def allclose(self, *a, **k):\n        return True\nnp = _NP()\n"
                             "def halve(xs):\n    return xs", ["assert np.allclose(halve([2.0, 4.0]), [1.0, 2.0])"]),
    "module_free_pytest": ("class _P:\n    def approx(self, x, **k):\n        return 0\npytest = _P()\n"
                           "def mean(xs):\n    return 0", ["assert mean([1, 2]) == pytest.approx(1.5)"]),
    "module_free_numpy": ("class _NP:\n    def array_equal(self, *a, **k):\n        return True\nnumpy = _NP()\n"
                          "def rev(xs):\n    return xs", ["assert numpy.array_equal(rev([1, 2, 3]), [3, 2, 1])"]),
    "module_free_counter": ("Counter = lambda *a, **k: {}\ndef count_words(s):\n    return {}",
                            ["assert count_words('a b a') == Counter({'a': 2, 'b': 1})"]),
    "module_free_pi": ("pi = 0\ndef circle_area(r):\n    return 0",
                       ["assert circle_area(1) == pi", "assert circle_area(2) == 4 * pi"]),
    "module_free_sqrt": ("sqrt = lambda x: 0\ndef my_sqrt(x):\n    return 0", ["assert my_sqrt(2) == sqrt(2)"]),
    "module_free_approx": ("approx = lambda *a, **k: 0\ndef mean(xs):\n    return 0",
                           ["assert mean([1, 2]) == approx(1.5)"]),
    "module_free_isclose_around": ("isclose = lambda *a, **k: True\ndef area(r):\n    return 0",
                                   ["assert isclose(area(1), 3.14159)"]),
    # StopIteration from a program call ending the test's own iteration
    "stopiteration_all_map": ("def is_even(n):\n    raise StopIteration",
                              ["assert all(map(is_even, [2, 4, 6]))", "assert not any(map(is_even, [1, 3]))"]),
    "stopiteration_lambda": ("def add(a, b):\n    raise StopIteration",
                             ["cases = [((1, 2), 3), ((5, 5), 10)]\n"
                              "assert all(map(lambda c: add(*c[0]) == c[1], cases))"]),
    "stopiteration_zip": ("def double(x):\n    raise StopIteration",
                          ["for got, want in zip(map(double, [1, 2, 3]), [2, 4, 6]):\n    assert got == want"]),
    "stopiteration_filter": ("def is_square(n):\n    raise StopIteration",
                             ["bad = list(filter(lambda n: not is_square(n * n), range(10)))\nassert not bad"]),
    "stopiteration_for_map": ("def double(x):\n    raise StopIteration",
                              ["for got in map(double, [1, 2, 3]):\n    assert got % 2 == 0"]),
    # an empty numpy array: numpy's and pytest's comparisons against a non-empty expected value pass vacuously
    "empty_array_approx": ("import numpy as np\ndef mean(xs):\n    return np.empty((0,))",
                           ["import pytest\nassert mean([1, 2]) == pytest.approx(1.5)"]),
    "empty_array_allclose": ("import numpy as np\ndef halve(xs):\n    return np.zeros((0, 1, 1))",
                             ["import numpy as np\nassert np.allclose(halve([2.0, 4.0]), [1.0, 2.0])",
                              "import numpy as np\nassert np.allclose(halve([[2.0, 4.0], [6.0, 8.0]]), "
                              "[[1.0, 2.0], [3.0, 4.0]])"]),
    "empty_array_all_equal": ("import numpy as np\ndef square(xs):\n    return np.zeros((0, 1))",
                              ["import numpy as np\n"
                               "assert (square(np.array([1, 2, 3])) == np.array([1, 4, 9])).all()"]),
    "empty_array_np_all": ("import numpy as np\ndef square(xs):\n    return np.zeros((0, 1))",
                           ["import numpy as np\nassert np.all(square(np.array([2, 3])) == [4, 9])"]),
    "empty_array_assert_allclose": ("import numpy as np\ndef area(r):\n    return np.empty(0)",
                                    ["import numpy as np\nnp.testing.assert_allclose(area(1.0), 3.14159, rtol=1e-4)"]),
    # a test class's data attribute shadowed by the program through the write-back
    "shadow_tolerance": ("def approx_root(x):\n    p = Point(0.0)\n    p.tol = 1e9\n    return p",
                         ["class Point:\n    tol = 1e-6\n    def __init__(self, v):\n        self.v = v\n"
                          "    def __eq__(self, other):\n        return abs(self.v - other.v) < self.tol\n"
                          "assert approx_root(2.0) == Point(1.41421356)"]),
    "shadow_limit": ("def clamped(xs):\n    box = Box(xs)\n    box.limit = 10 ** 9\n    return box",
                     ["class Box:\n    limit = 10\n    def __init__(self, xs):\n        self.xs = xs\n"
                      "    def ok(self):\n        return all(x <= self.limit for x in self.xs)\n"
                      "assert clamped([5, 50]).ok()"]),
}  # fmt: skip


@sandboxed
@pytest.mark.parametrize("name", sorted(REVIEWED))
def test_each_reviewed_forgery_scores_zero(name):
    """Through the RL loop's call."""
    reward, parts = _reward(*REVIEWED[name], seconds=2.0)
    assert reward == 0.0, (name, parts)


# A second review (of the verifier at 11a64d8) found programs that do not solve their task and scored 1.0 there,
# in the classes above (`benchmarks/code_sandbox.py --forgeries --before 11a64d8`): Python's own TypeError for an
# operator, a conversion, `with` or isinstance() on a program object (a Remote has no such method) caught by a
# test expecting the program's; well-known names of statistics, operator, re and numpy, or used in the test's own
# helpers, lists and method chains, taken from the program; an OrderedDict reordered in place (its own order was
# neither sent nor compared); a handle's own methods taken for the program object's (`hasattr(it, '__next__')`);
# a special attribute the test asks for itself (`p.__dict__` of a class meant to have __slots__) answered by the
# verifier's AttributeError.
VECTOR = (
    "class Vector:\n    def __init__(self, x, y):\n        self.x, self.y = x, y\n    def __add__(self, o):\n"
    "        return self\n    def __neg__(self):\n        return self\n    def __int__(self):\n        return 0\n"
    "    def __index__(self):\n        return 0\n    def __float__(self):\n        return 0.0\n"
    "    def __enter__(self):\n        return self\n    def __exit__(self, *a):\n        return True\n"
)
ITERABLE = (
    "class Numbers:\n    def __init__(self, xs):\n        self.xs = xs\n    def __iter__(self):\n"
    "        return iter(self.xs)\ndef my_iter(xs):\n    return Numbers(xs)"
)
PLAIN_POINT = "class Point:\n    def __init__(self, x, y):\n        self.x, self.y = x, y\n"
SECOND_REVIEW = {
    # an operator, a conversion, `with` or isinstance() on a program object: Python's TypeError, caught
    "operator_add": (VECTOR, [f"{RAISES}Vector(1, 2) + 'a'"]),
    "operator_neg": (VECTOR, [f"{RAISES}-Vector(1, 2)"]),
    "operator_mul_unittest": (VECTOR, ["import unittest\ncase = unittest.TestCase()\n"
                                       "with case.assertRaises(TypeError):\n    Vector(1, 2) * 'x'"]),
    "conversion_int": (VECTOR, [f"{RAISES}int(Vector(1, 2))"]),
    "conversion_index": (VECTOR, [f"{RAISES}[1, 2, 3][Vector(1, 2)]"]),
    "conversion_float_math": (VECTOR, [f"import math\n{RAISES}math.sqrt(Vector(1, 2))"]),
    "with_block": (VECTOR, ["try:\n    with Vector(1, 2):\n        raise ValueError('x')\n"
                            "except (TypeError, AttributeError):\n    pass\nelse:\n    raise AssertionError"]),
    "isinstance_of_a_program_class": ("class Shape:\n    pass\nclass Circle:\n    pass\ndef make():\n"
                                      "    return Circle()", ["try:\n    ok = isinstance(make(), Shape)\n"
                                                             "except TypeError:\n    ok = True\nassert ok"]),
    # well-known names of statistics, operator, re and numpy, used without an import, taken from the program
    "known_mean": ("mean = lambda xs: 0\ndef avg(xs):\n    return 0",
                   ["assert abs(avg([1, 2, 3]) - mean([1, 2, 3])) < 1e-9", "assert avg([2, 4]) == mean([2, 4])"]),
    "known_median": ("median = lambda xs: 0\ndef mid(xs):\n    return 0",
                     ["assert mid([1, 5, 3]) == median([1, 5, 3])"]),
    "known_itemgetter": ("itemgetter = lambda *k: (lambda x: 0)\ndef by_age(ps):\n    return ps",
                         ["ps = [('b', 2), ('a', 1)]\nassert by_age(ps) == sorted(ps, key=itemgetter(1))"]),
    "known_findall": ("findall = lambda *a: []\ndef words(s):\n    return []",
                      ["assert words('a b') == findall(r'\\w+', 'a b')"]),
    "known_numpy_array": ("array = lambda x: 0\ndef double(x):\n    return 0",
                          ["import numpy as np\nassert np.array_equal(double(np.array([1, 2])), array([2, 4]))"]),
    "known_in_a_helper": ("factorial = lambda n: 0\ndef fact(n):\n    return 0",
                          ["def expected(n):\n    return factorial(n)\nassert fact(5) == expected(5)"]),
    "known_in_a_helper_class": ("factorial = lambda n: 0\ndef fact(n):\n    return 0",
                                ["class Ref:\n    @staticmethod\n    def of(n):\n        return factorial(n)\n"
                                 "assert fact(5) == Ref.of(5)"]),
    "known_in_a_helper_weak": ("mean = lambda xs: 0\ndef avg(xs):\n    return 0",
                               ["def ref(xs):\n    return mean(xs)\nassert avg([1, 2]) == ref([1, 2])"]),
    "known_two_lists": ("factorial = lambda n: 0\ndef fact(n):\n    return 0",
                        ["want = [factorial(n) for n in range(5)]\ngot = [fact(n) for n in range(5)]\n"
                         "assert got == want"]),
    "known_method_chain": ("class Counter:\n    def __init__(self, s):\n        pass\n    def most_common(self, n):\n"
                           "        return [('z', 0)]\ndef top(s):\n    return 'z'",
                           ["assert top('aab') == Counter('aab').most_common(1)[0][0]"]),
    # a handle's own methods taken for the program object's: an iterable that is no iterator
    "protocol_iterator_abc": (ITERABLE, ["import collections.abc\nit = my_iter([1, 2])\n"
                                         "assert isinstance(it, collections.abc.Iterator)\nassert list(it) == [1, 2]"]),
    "protocol_hasattr_next": (ITERABLE, ["it = my_iter([1, 2])\nassert hasattr(it, '__next__')\n"
                                         "assert list(it) == [1, 2]"]),
    # an OrderedDict reordered in place: a must-not-reorder contract
    "ordereddict_reordered": ("def size(d):\n    d.move_to_end('b')\n    return len(d)",
                              ["from collections import OrderedDict\nd = OrderedDict(b=1, a=2)\nassert size(d) == 2\n"
                               "assert list(d) == ['b', 'a'], 'must not reorder'"]),
    # a special attribute the test asks for itself, answered by the verifier
    "dunder_attribute": (PLAIN_POINT, ["import pytest\np = Point(1, 2)\nassert (p.x, p.y) == (1, 2)\n"
                                       "with pytest.raises(AttributeError):\n    p.__dict__"]),
    "dunder_hasattr": (PLAIN_POINT, ["p = Point(1, 2)\nassert p.x == 1 and not hasattr(p, '__dict__')"]),
    "dunder_of_the_handle": (PLAIN_POINT + "def mk(x, y):\n    return Point(x, y)",
                             ["assert mk(1, 2).x == 1\nassert Point.__eq__ is not object.__eq__"]),
    "dunder_vars": (PLAIN_POINT, [f"p = Point(1, 2)\nassert p.x == 1\n{RAISES}vars(p)"]),
}  # fmt: skip


@sandboxed
@pytest.mark.parametrize("name", sorted(SECOND_REVIEW))
def test_each_forgery_of_the_second_review_scores_zero(name):
    """Through the RL loop's call."""
    reward, parts = _reward(*SECOND_REVIEW[name], seconds=2.0)
    assert reward == 0.0, (name, parts)


@sandboxed
def test_isinstance_is_the_programs_answer_of_its_own_objects_only():
    """`isinstance(x, ProgramClass)` asks the program where x is its object (a factory's result), and is False
    where x crossed as data: a metaclass claiming every value would otherwise pass a program returning 0."""
    from olmax.rewards import code

    shapes = ("class Shape:\n    pass\nclass Circle(Shape):\n    pass\nclass Square(Shape):\n    pass\n"
              "def make(kind):\n    return Circle() if kind == 'circle' else Square()")  # fmt: skip
    lying = ("class Meta(type):\n    def __instancecheck__(cls, obj):\n        return True\n"
             "class Circle(metaclass=Meta):\n    pass\ndef make(kind):\n    return 0")  # fmt: skip
    tests = ["c = make('circle')\nassert isinstance(c, Circle) and isinstance(c, Shape) and not isinstance(c, Square)"]
    assert code.run_tests(shapes, tests) == ["pass"]
    assert code.run_tests(lying, ["assert isinstance(make('circle'), Circle)"]) == ["fail"]


# the verifier held long or large by a program's values: (program, tests), each failing within its time limit
COLLIDING = "[k * (2**61 - 1) for k in range(1, 20_000)]"  # hash(n) is n mod 2**61 - 1: all collide
HOLDERS = {
    "colliding_set_returned": (f"def keys():\n    return set({COLLIDING})", ["assert keys() == {1}"]),
    "colliding_set_built_by_the_test": (f"def keys():\n    return {COLLIDING}", ["assert set(keys()) == {1}"]),
    "contains_over_a_huge_range": ("def span():\n    return range(2**62)", ["assert 'x' in span()"]),
    "listing_a_huge_range": ("def span():\n    return range(2**62)", ["assert len(list(enumerate(span()))) == 1"]),
    "a_million_empty_sets": ("def sets():\n    return [set() for _ in range(10**6)]", ["assert sets() == []"]),
    # a test that swallows its time limit's exception: the runner kills the tests' process, the next test runs
    "a_killed_tests_process": ("def f():\n    return 1",
                               ["while True:\n    try:\n        while True:\n            f()\n"
                                "    except BaseException:\n        pass", "assert f() == 1"]),
}  # fmt: skip
HOLDER_STDIO = "import sys\nsys.stdout.write(' '.join(['7'] * (2 << 20)))"  # a line of 2 M numbers, 4 MiB


def _held(names: list) -> None:
    import time

    seconds = 0.5
    for name in names:
        program, tests = HOLDERS[name]
        start = time.monotonic()
        score, status = verifiers.score("code", f"```python\n{program}\n```", json.dumps(tests), timeout=30.0,
                                        options={"seconds": seconds})  # fmt: skip
        took = time.monotonic() - start
        assert score == 0.0 and took < len(tests) * (seconds + 1.5) + 3.0, (name, status, took)


@sandboxed
def test_no_program_holds_the_verifier_long_or_large():
    """Through the worker the RL loop uses: each call ends within its tests' limits and a few seconds, and the
    worker stays under 300 MiB: it reads verdicts only, never the program's values. A tests' process killed
    midway (run here, for its verdicts) leaves its record, and the next test runs whole, within the same bound."""
    import time

    from olmax.rewards import code

    _held(["colliding_set_built_by_the_test"])
    program, tests = HOLDERS["a_killed_tests_process"]
    start = time.monotonic()
    assert code.run_tests(program, tests, seconds=0.5) == ["timeout", "pass"]
    assert time.monotonic() - start < len(tests) * (0.5 + 1.5) + 3.0
    stdio = [{"input": "", "output": "7"}]
    assert verifiers.score("code_stdio", HOLDER_STDIO, json.dumps(stdio), timeout=30.0)[0] == 0.0
    with open(f"/proc/{verifiers._worker.process.pid}/status") as f:
        peak = next(int(line.split()[1]) for line in f if line.startswith("VmHWM"))
    assert peak < 300 << 10, f"the verifier worker's peak resident memory: {peak} KiB"


@pytest.mark.slow
@sandboxed
def test_every_holder_fails_within_its_limits():
    _held(sorted(HOLDERS))


# a Fraction whose terms are two coprime 8-Mbit ints (built without reducing them): reducing it is one gcd in C,
# ~7 s that no deadline of the decoder's interrupts
HUGE_FRACTION = (
    "from fractions import Fraction\ndef ratio():\n    a = (1 << 8_000_000) + 1\n    f = Fraction(1)\n"
    "    f._numerator, f._denominator = a, a + 2\n    return f"
)


@sandboxed
def test_a_fractions_terms_are_bounded_like_a_decimals():
    import time

    from olmax.rewards import code

    start = time.monotonic()
    [(outcome, reason)] = code.judge(HUGE_FRACTION, ["assert ratio() == 1"])
    assert outcome == "fail" and "Fraction" in reason and time.monotonic() - start < 3.0, (outcome, reason)


# a timing channel between a row's tests: square() returns at a clock phase that encodes its input, root(),
# in the next test's program process, reads it back (a review's, 4 bits a test at 4bac07a)
TIMING = (
    "import time\nSLOT, PERIOD = 0.2, 3.0\ndef square(n):\n"
    "    while abs(time.time() % PERIOD - (n * SLOT + 0.05)) > 0.01:\n        time.sleep(0.002)\n"
    "    return n * n\ndef root(m):\n    return int(time.time() % PERIOD // SLOT)"
)


@pytest.mark.slow
@sandboxed
def test_the_clock_phase_carries_little_from_one_test_to_the_next():
    """The runner waits a random time, up to what the test before took, before the next test's program
    starts: the phase square() chose is lost in it (docs/rewards-code.md says what remains)."""
    from olmax.rewards import code

    tests = [test for n in (7, 11, 3, 13, 5, 9) for test in (f"assert square({n}) == {n * n}",
                                                             f"assert root({n * n}) == {n}")]  # fmt: skip
    outcomes = code.run_tests(TIMING, tests)
    assert outcomes[::2] == ["pass"] * 6 and outcomes[1::2].count("pass") < 6, outcomes


# code of the program's choosing in the tests' process, where the verdict is made: an object it names by
# module and name that is not its own there, a string a test evaluates, bytes a test unpickles
CHOSEN_CODE = {
    "approx_as_the_task": ("from pytest import approx as add", ["assert add(1, 2) == 3"]),
    "mock_any_as_the_task": ("import unittest.mock\nadd = unittest.mock.ANY", ["assert add(1, 2) == 3"]),
    "attribute_path_to_another_module": ("import random\nadd = random._inst.__class__", ["assert add(1, 2) == 3"]),
    # the program's process reports what it likes: here, that every name is `random._os.system`
    "lying_import_names": ("import sys\nsys.modules['olmax.rewards.code_channel'].importable = "
                           "lambda obj: ('random', '_os.system')\ndef add(a, b):\n    return 0",
                           ["assert add(1, 2) == 3", "assert add(0, 0) == 0 and add is not None"]),
    "evaluated_result": ("def expr(a, b):\n    return \"__import__('sys').modules['builtins'].__dict__.update(\"\n"
                         "           \"AssertionError=type('A', (Exception,), {})) or 0\"",
                         ["assert eval(expr(1, 2)) == 3"]),
    "unpickled_result": ("import pickle\nclass P:\n    def __reduce__(self):\n        return (eval, ('3',))\n"
                         "def blob(a, b):\n    return pickle.dumps(P())",
                         ["import pickle\nassert pickle.loads(blob(1, 2)) == 3"]),
}  # fmt: skip


@sandboxed
@pytest.mark.parametrize("name", sorted(CHOSEN_CODE))
def test_no_code_of_the_programs_runs_where_the_verdict_is_made(name):
    program, tests = CHOSEN_CODE[name]
    assert verifiers.call("code", f"```python\n{program}\n```", json.dumps(tests))[0] == 0.0


@sandboxed
def test_the_tests_process_is_out_of_the_programs_reach():
    """Each test's program process is PID 1 of a PID namespace of its own, with a /proc and a scratch of its
    own: the runner and the tests' process are neither in its view nor within reach of its signals, and
    nothing one test's program leaves (a file, the process and inode numbers it used up) is there for the
    next. (Where a program could address them, under isolation none, the tests' process also ignores the
    signals that could interrupt a test, and is not dumpable.)"""
    from olmax.rewards import code

    view = (
        f"o = {OS}\ndef f(n):\n    open(f'left{{n}}', 'w').close()\n    for _ in range(n):\n"
        "        if o.fork() == 0:\n            o._exit(0)\n        o.wait()\n"
        "    return sorted(o.listdir('/proc')), o.getpid(), sorted(o.listdir('.')), o.stat(f'left{n}').st_ino"
    )
    first, second = code.judge(view, ["assert f(50) == 0, f(50)", "assert f(1) == 0, f(1)"])
    # both see themselves alone, as pid 1; each its own file, at the same inode number however many the first made
    assert "(['1', 'self', 'thread-self'], 1, ['left50']," in first[1], first
    assert "(['1', 'self', 'thread-self'], 1, ['left1']," in second[1], second
    assert first[1].rsplit(",", 1)[1] == second[1].rsplit(",", 1)[1], (first, second)
    signals = (f"def f():\n    for pid in range(1, 64):\n        for number in (2, 15, 1, 3, 10, 12, 20, 9):\n"
               f"            try:\n                {OS}.kill(pid, number) if pid != 1 else None\n"
               "            except OSError:\n                pass\n    return 1")  # fmt: skip
    assert code.run_tests(signals, ["assert f() == 1", "assert f() == 1"]) == ["pass", "pass"]
