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


@sandboxed
@pytest.mark.parametrize("name", sorted(FORGERIES))
def test_each_forgery_scores_zero(name):
    assert any(n.startswith(name.split("_")[0]) for n in WRITTEN_FIRST)  # every class was forged first
    program, tests = FORGERIES[name]
    score, status = verifiers.call("code", f"```python\n{program}\n```", json.dumps(tests), {"seconds": 1.0})
    assert score == 0.0, (name, status)


@sandboxed
def test_the_rl_loops_call_gives_every_class_nothing():
    """One variant of each class through the RL loop's call (a row's reward, the verifier worker)."""
    for name in (
        "module_counter",
        "helper_globals",
        "copied_tuple",
        "pairing_roman",
        "builtins_all",
        "builtin_named_sum",
        "mutation_list",
        "collected_list",
        "with_suppress",
        "load_forever",
    ):
        program, tests = FORGERIES[name]
        reward, parts = verifiers.reward(["code"], [json.dumps(tests)], f"```python\n{program}\n```", timeout=30.0,
                                         options={"code": {"seconds": 1.0}}, scale=SCALE)  # fmt: skip
        assert reward == 0.0, (name, parts)


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
    """Through the worker the RL loop uses: each call ends within its tests' limits and a few seconds (a
    tests' process killed midway leaves its record, and the next test runs whole), and the worker stays
    under 300 MiB: it reads verdicts only, never the program's values."""
    from olmax.rewards import code

    _held(["colliding_set_built_by_the_test", "a_killed_tests_process"])
    assert code.run_tests("def f():\n    return 1", HOLDERS["a_killed_tests_process"][1], seconds=0.5) == [
        "timeout", "pass"]  # fmt: skip
    stdio = [{"input": "", "output": "7"}]
    assert verifiers.score("code_stdio", HOLDER_STDIO, json.dumps(stdio), timeout=30.0)[0] == 0.0
    with open(f"/proc/{verifiers._worker.process.pid}/status") as f:
        peak = next(int(line.split()[1]) for line in f if line.startswith("VmHWM"))
    assert peak < 300 << 10, f"the verifier worker's peak resident memory: {peak} KiB"


@pytest.mark.slow
@sandboxed
def test_every_holder_fails_within_its_limits():
    _held(sorted(HOLDERS))


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
