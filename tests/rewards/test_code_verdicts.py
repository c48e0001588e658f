"""The code verifier's verdicts are out of the program's reach (olmax.rewards.code_harness, code_program).

Each attack is a program that does not solve its task (`add(a, b)`, or echoing a number for stdio) and tries
to score anyway, through the call the RL loop makes (`verifiers.reward`, default isolation): by ending its
test's process with exit status 0, by stopping the tests from running, by changing how the runner reads an
exit status, by reading the report channel or the expected answers out of the runner, by returning a value
that compares equal to anything, or by replacing the stdio comparison. Every one scored 1.0 (RL reward 10)
on the verifier that ran tests in the program's process (before c5425a3); each must score 0. Honest
programs, over the test forms the datasets use, score 1.0. Then what reaches the program's process (never an
expected value), the forms that run as written, and the channel's strictness and bounds.
"""

from __future__ import annotations

import json
import time
import tracemalloc

import pytest

from olmax.rewards import code, code_channel, code_handles, code_remote, code_stdio, code_tests, code_values
from olmax.rewards import verifiers as rewards

sandboxed = pytest.mark.usefixtures("code_sandbox")

OS = "__import__('o' + 's')"
TESTS = ["assert add(1, 2) == 3", "assert add(2, 5) == 7", "assert add(-4, 4) == 0"]
SCALE = 10.0  # grpo.reward_scale, open-instruct's --verification_reward
STDIO = [{"input": "3\n", "output": "6\n"}, {"input": "10\n", "output": "20\n"}]  # print twice the input
# the runner's own frames, found from the program (at load or from the function under test)
FRAMES = "import sys\ndef frames():\n    f = sys._getframe()\n    while f:\n        yield f\n        f = f.f_back\n"


def _score(program: str, tests=TESTS, stdio: bool = False) -> float:
    """The score through the call the RL loop makes: a row's reward (SCALE x the score), through the verifier
    worker."""
    name = code.STDIO_NAME if stdio else code.NAME
    reward, parts = rewards.reward([name], [json.dumps(tests)], f"```python\n{program}\n```", timeout=30.0, scale=SCALE)
    assert reward in (0.0, SCALE), (reward, parts)  # the pass-rate threshold (0.99) makes it all or nothing here
    return reward / SCALE


# the test's process ends with status 0 before its assert can fail
EXITS = {
    "os_exit": f"def add(a, b):\n    {OS}._exit(0)",
    "libc_exit": "import ctypes\ndef add(a, b):\n    ctypes.CDLL(None)._exit(0)",
    "exec_python": f"import sys\ndef add(a, b):\n    {OS}.execv(sys.executable, [sys.executable, '-c', ''])",
    "alarm_handler": "import signal\ndef add(a, b):\n"
                     f"    signal.signal(signal.SIGALRM, lambda *_: {OS}._exit(0))\n"
                     "    signal.setitimer(signal.ITIMER_REAL, 0.01)\n    while True:\n        pass",
    "audit_hook": f"import sys\nsys.addaudithook(lambda event, args: {OS}._exit(0) if event == 'exec' else None)\n"
                  "def add(a, b):\n    return 0",
    "thread": f"import _thread, time\ndef add(a, b):\n    _thread.start_new_thread({OS}._exit, (0,))\n"
              "    time.sleep(2)",
    "in_eq": f"class E:\n    def __eq__(self, other):\n        {OS}._exit(0)\ndef add(a, b):\n    return E()",
}  # fmt: skip
# the tests never run: exec, or the runner's function that runs them, replaced
NO_RUN = {
    "builtins_exec": "import builtins\nbuiltins.exec = lambda *args, **kwargs: None\ndef add(a, b):\n    return 0",
    "runner_exec": "import sys\nsys.modules['__main__'].exec = lambda *args, **kwargs: None\ndef add(a, b):\n"
                   "    return 0",
    "runner_run": "import sys\nsys.modules['__main__']._run = lambda *args, **kwargs: (0, '')\ndef add(a, b):\n"
                  "    return 0",
}  # fmt: skip
# how the runner reads a test's exit status, replaced
WAIT = {
    "waitstatus_to_exitcode": f"{OS}.waitstatus_to_exitcode = lambda status: 0\ndef add(a, b):\n    return 0",
    "waitpid": f"o = {OS}\nreal = o.waitpid\no.waitpid = lambda pid, flags: (real(pid, flags)[0], 0)\n"
               "def add(a, b):\n    return 0",
}  # fmt: skip
# the runner's report descriptor and nonce, or the expected answers, read out of the runner's process
READ_OUT = {
    "nonce_from_frames": FRAMES + "for f in frames():\n    if 'job' in f.f_locals and 'report' in f.f_locals:\n"
                         "        job, fd = f.f_locals['job'], f.f_locals['report']\n"
                         f"        for i in range({len(TESTS)}):\n"
                         f"            {OS}.write(fd, f\"{{job['nonce']}} {{i}} pass\\n\".encode())\n"
                         f"        {OS}._exit(0)\n",
    "nonce_from_gc": "import gc\nfor o in gc.get_objects():\n    if isinstance(o, dict) and 'nonce' in o:\n"
                     f"        for i in range({len(TESTS)}):\n"
                     f"            {OS}.write(3, f\"{{o['nonce']}} {{i}} pass\\n\".encode())\n"
                     f"        {OS}._exit(0)\n",
    "test_constants": "import sys\ndef add(a, b):\n    consts = sys._getframe(1).f_code.co_consts\n"
                      "    return [c for c in consts if type(c) is int][-1]",
    "test_text_from_gc": "import gc, re\ndef add(a, b):\n    for o in gc.get_objects():\n"
                         "        for s in (o.values() if isinstance(o, dict) else o if isinstance(o, list) else ()):\n"
                         "            m = isinstance(s, str) and re.search(rf'add\\({a}, {b}\\) == (-?\\d+)', s)\n"
                         "            if m:\n                return int(m.group(1))\n    return 0",
    "test_text_from_frames": FRAMES + "import re\ndef add(a, b):\n    for f in frames():\n"
                             "        for s in f.f_locals.values():\n"
                             "            m = isinstance(s, str) and re.search(rf'add\\({a}, {b}\\) == (-?\\d+)', s)\n"
                             "            if m:\n                return int(m.group(1))\n    return 0",
}  # fmt: skip
# a value that compares equal to anything (or makes the comparison come out so)
EQUAL = {
    "eq_true": "class A:\n    def __eq__(self, other):\n        return True\ndef add(a, b):\n    return A()",
    "int_subclass": "class I(int):\n    __eq__ = lambda self, other: True\n    __hash__ = int.__hash__\n"
                    "def add(a, b):\n    return I(0)",
    "str_subclass": "class S(str):\n    __eq__ = lambda self, other: True\n    __hash__ = str.__hash__\n"
                    "def add(a, b):\n    return S('')",
    "list_subclass_lying_repr": "class L(list):\n    __eq__ = lambda self, other: True\n"
                                "    __repr__ = lambda self: '3'\ndef add(a, b):\n    return L()",
    "dict_subclass": "class D(dict):\n    __eq__ = lambda self, other: True\ndef add(a, b):\n    return D()",
    "nan_float_subclass": "class F(float):\n    __eq__ = lambda self, other: True\n    __hash__ = float.__hash__\n"
                          "def add(a, b):\n    return F('nan')",
}  # fmt: skip
# the same cheat for the other comparison forms: (program, tests)
OTHER_FORMS = {
    "ne_false": ("class N:\n    __ne__ = lambda self, other: False\ndef add(a, b):\n    return N()",
                 [f"assert not add({a}, {b}) != {a + b}" for a, b in ((1, 2), (2, 5))]),
    "sub_zero": ("class Z:\n    __sub__ = __rsub__ = lambda self, other: 0\ndef add(a, b):\n    return Z()",
                 [f"assert abs(add({a}, {b}) - {a + b}) < 1e-9" for a, b in ((1, 2), (2, 5))]),
    "ordering": ("class O:\n    __le__ = __ge__ = __lt__ = __gt__ = lambda self, other: True\n"
                 "def add(a, b):\n    return O()", ["assert 3 <= add(1, 2) <= 3"]),
    "isclose_float": ("import math\nclass C(float):\n    pass\nmath.isclose = lambda *args, **kwargs: True\n"
                      "def add(a, b):\n    return C(0)", ["import math\nassert math.isclose(add(1, 2), 3)"]),
    "in_tuple": ("class T:\n    __eq__ = lambda self, other: True\n    __hash__ = object.__hash__\n"
                 "def add(a, b):\n    return T()", ["assert add(1, 2) in (3, 4)"]),
}  # fmt: skip
# a stdio program that does not double its input: exits 0, replaces the runner's comparison, or reads the
# expected output out of the runner
STDIO_ATTACKS = {
    "exit": f"{OS}._exit(0)",
    "same_output": "import sys\nsys.modules['__main__'].same_output = lambda got, want: True\nprint(0)",
    "lines": "import sys\nsys.modules['__main__']._lines = lambda text: []\nprint(0)",
    "compare_code": "import sys\nm = sys.modules['__main__']\n"
                    "m.same_output.__code__ = (lambda got, want: True).__code__\nprint(0)",
    "output_from_frames": FRAMES + "import io\nfor f in frames():\n    test = f.f_locals.get('test')\n"
                          "    if isinstance(test, dict) and 'output' in test:\n        print(test['output'])\n"
                          "        break\nelse:\n    print(0)",
    # (a dict of strings alone is not tracked by gc: the list holding it is)
    "output_from_gc": "import gc, sys\nstdin = sys.stdin.read()\nfound = [d['output'] for o in gc.get_objects()\n"
                      "         if isinstance(o, list) for d in o if isinstance(d, dict) and d.get('input') == stdin]\n"
                      "print(found[0] if found else 0)",
}  # fmt: skip


@sandboxed
@pytest.mark.parametrize("attack", sorted(EXITS))
def test_exit_status_zero_is_no_pass(attack):
    assert _score(EXITS[attack]) == 0.0


@sandboxed
@pytest.mark.parametrize("attack", sorted(NO_RUN))
def test_tests_that_never_run_do_not_pass(attack):
    assert _score(NO_RUN[attack]) == 0.0


@sandboxed
@pytest.mark.parametrize("attack", sorted(WAIT))
def test_the_runners_exit_status_reading_is_irrelevant(attack):
    assert _score(WAIT[attack]) == 0.0


@sandboxed
@pytest.mark.parametrize("attack", sorted(READ_OUT))
def test_nothing_to_forge_or_copy_in_the_runner(attack):
    assert _score(READ_OUT[attack]) == 0.0


@sandboxed
def test_records_the_program_writes_carry_no_verdict():
    """Against this verifier's report: a program that writes records (verdicts, the earlier protocol's
    values) on every descriptor and ends before the tests get nothing; only the runner holds the report."""
    records = "b''.join(f'{kind} {i} {len(body)}\\n{body}'.encode() for i in range(3) for kind, body in "
    records += "(('p', ''), ('v', '[3]'), ('pass', '')))"
    forge = f"r = {records}\nfor fd in range(3, 64):\n    try:\n        {OS}.write(fd, r)\n"
    forge += f"    except OSError:\n        pass\n{OS}._exit(0)"
    assert _score(forge) == 0.0 and code.run_tests(forge, TESTS) == ["fail"] * 3


@sandboxed
@pytest.mark.parametrize("attack", sorted(EQUAL))
def test_values_that_equal_anything_equal_nothing(attack):
    assert _score(EQUAL[attack]) == 0.0


@sandboxed
@pytest.mark.parametrize("attack", sorted(OTHER_FORMS))
def test_other_comparison_forms_cannot_be_cheated(attack):
    program, tests = OTHER_FORMS[attack]
    assert _score(program, tests) == 0.0


@sandboxed
@pytest.mark.parametrize("attack", sorted(STDIO_ATTACKS))
def test_stdio_verdicts_are_the_verifiers(attack):
    assert _score(STDIO_ATTACKS[attack], STDIO, stdio=True) == 0.0


@sandboxed
def test_an_honest_program_scores_one():
    assert _score("def add(a, b):\n    return a + b") == 1.0


# honest programs over the test forms of the data sets: all score 1.0, as they did when tests ran in the
# program's process
HONEST = {
    "counter_vs_dict": ("from collections import Counter\ndef count(s):\n    return Counter(s)",
                        ["assert count('abca') == {'a': 2, 'b': 1, 'c': 1}", "assert count('') == {}"]),
    "namedtuple_vs_tuple": ("from collections import namedtuple\nP = namedtuple('P', 'x y')\ndef mid(a, b):\n"
                            "    return P((a[0] + b[0]) / 2, (a[1] + b[1]) / 2)",
                            ["assert mid((0, 0), (2, 4)) == (1.0, 2.0)", "assert mid((0, 0), (2, 4)).y == 2"]),
    "generator_through_list": ("def evens(n):\n    yield from range(0, n, 2)",
                               ["assert list(evens(5)) == [0, 2, 4]", "assert sorted(evens(3), reverse=True) == [2, 0]",
                                "assert next(evens(9)) == 0", "assert 4 in evens(9)"]),
    "class_method": ("class Solution:\n    def twoSum(self, nums, target):\n        seen = {}\n"
                     "        for i, n in enumerate(nums):\n            if target - n in seen:\n"
                     "                return [seen[target - n], i]\n            seen[n] = i",
                     ["assert Solution().twoSum([2, 7, 11, 15], 9) == [0, 1]",
                      "s = Solution()\nnums = [3, 2, 4]\nassert s.twoSum(nums, 6) == [1, 2], 'wrong'"]),
    "tolerances": ("def area(r):\n    return 3.141592653589793 * r * r",
                   ["assert abs(area(1) - 3.14159) < 1e-5", "import math\nassert math.isclose(area(2), 12.566370614)",
                    "from math import isclose\nassert isclose(area(0), 0.0, abs_tol=1e-12)",
                    "assert round(area(1), 2) == 3.14"]),
    "truth_and_none": ("def is_even(n):\n    return n % 2 == 0\ndef nothing():\n    pass",
                       ["assert is_even(4)", "assert not is_even(3)", "assert nothing() is None",
                        "assert is_even(2) is True and is_even(1) is False", "assert is_even(3) or is_even(2)"]),
    "containers": ("def split(s):\n    return s.split(), set(s), tuple(s), {'n': len(s)}, s.encode()",
                   ["assert split('a b') == (['a', 'b'], {'a', ' ', 'b'}, ('a', ' ', 'b'), {'n': 3}, b'a b')",
                    "assert split('ab')[3]['n'] == 2", "assert len(split('abc')[0]) == 1",
                    "assert ' '.join(split('x y')[0]) == 'x y'", "assert split('a')[4].decode() == 'a'"]),
    "numbers": ("from fractions import Fraction\ndef half(x):\n    return Fraction(x, 2)\n"
                "def big(n):\n    return 3 ** n",
                ["assert half(3) == Fraction(3, 2)", "assert half(4) == 2", "assert big(200) == 3 ** 200",
                 "assert big(2) + big(2) == 18", "assert big(3) % 5 == 2", "assert -big(1) == -3"]),
    "statements": ("calls = []\ndef log(x):\n    calls.append(x)\n    return len(calls)",
                   ["log(1)", "for i in range(3):\n    log(i)", "x = log(5)\nassert x == 1",
                    "assert [log(i) for i in range(2)] == [1, 2]", "assert calls == []"]),
    "comparisons_over_calls": ("def inc(x):\n    return x + 1\ndef dec(x):\n    return x - 1",
                               ["assert inc(1) == dec(3)", "assert inc(1) < inc(2) <= 3", "assert inc(dec(5)) == 5",
                                "assert inc(1) in [1, 2, 3]", "assert inc(0) if True else False",
                                "assert type(inc(1)) == int and isinstance(dec(1), int)"]),
}  # fmt: skip


@sandboxed
@pytest.mark.parametrize("case", sorted(HONEST))
def test_honest_programs_over_the_data_sets_forms_still_pass(case):
    program, tests = HONEST[case]
    assert code.run_tests(program, tests) == ["pass"] * len(tests)
    assert all(code_tests.plan(test).form != code_tests.REFUSED for test in tests)


@sandboxed
def test_stdio_and_timeouts_score_as_before():
    doubles = "n = int(input())\nprint(n * 2)"
    assert _score(doubles, STDIO, stdio=True) == 1.0
    assert _score("print(' 6.0 ')", STDIO[:1], stdio=True) == 1.0  # upstream: lines stripped, Decimals compared
    assert _score("print(6)\nprint(7)", STDIO[:1], stdio=True) == 0.0
    start = time.monotonic()
    outcomes = code.run_tests(
        "def add(a, b):\n    while True:\n        pass", TESTS[:1] + ["assert 1 == 2"], seconds=0.3
    )
    assert outcomes == ["timeout", "fail"] and time.monotonic() - start < 3
    # a later call that hangs after an assert that already failed: that assert's verdict stands
    assert code.run_tests(
        "def f(x):\n    while x:\n        pass\n    return x", ["assert f(0) == 1\nf(1)"], seconds=0.3
    ) == ["fail"]


# what reaches the program's process: a program that searches everything it can read there (every object
# gc knows, its frames, every argument it is given) for a marker only the expected side holds, and returns
# it when found, would pass each of these tests had the marker reached it
MARK = 987654321
LEAK = f"""import gc, sys
def leak(*args, **kwargs):
    seen = [args, kwargs, *gc.get_objects()]
    frame = sys._getframe().f_back
    while frame:
        seen.append(frame.f_locals)
        frame = frame.f_back
    text = repr(seen)
    found = [n for n in (int('{MARK:x}', 16), int('{MARK // 1000:x}', 16)) if str(n) in text]
    return int('{MARK:x}', 16) if found else 0
f = g = two_sum = leak
class Solution:
    def go(self, *args, **kwargs):
        return leak(args, kwargs)
"""  # (the marker is made at run time: the program's own text, in its memory, must not hold it)
EXPECTED_SIDES = [
    f"assert f(1, 2) == {MARK}",
    f"assert f(1) == [{MARK}, 2][0]",
    f"assert abs(f(0.5) - {MARK}) < 1e-9",
    f"import math\nassert math.isclose(f(2), {MARK})",
    f"expected = {MARK}\nassert f(3) == expected",
    f"cases = [(1, {MARK}), (2, {MARK})]\nfor a, b in cases:\n    assert f(a) == b",
    f"cases = {{1: {MARK}}}\nassert all(f(k) == v for k, v in cases.items())",
    f"x, want = 3, {MARK}\nassert f(x) == want",
    f"def check(candidate):\n    assert candidate(1) == {MARK}\ncheck(f)",
    f"assert Solution().go([1], k=2) == {MARK}",
    f"assert f(1) in ({MARK}, {MARK + 1})",
    f"if f(1) != {MARK}:\n    raise AssertionError",
    f"bad = [i for i in range(3) if f(i) != {MARK}]\nassert not bad",
    f"try:\n    assert f(1) == {MARK}\nexcept ZeroDivisionError:\n    pass",
    f"assert sorted([f(1)]) == sorted([{MARK}])",
    f"from fractions import Fraction\nassert f(1) == Fraction({MARK}, 1)",
    f"assert f(1) == int('{MARK}')",
    f"assert f(1) == (lambda: {MARK})()",
]


@sandboxed
def test_the_expected_side_never_reaches_the_program():
    assert code.run_tests(LEAK, EXPECTED_SIDES) == ["fail"] * len(EXPECTED_SIDES)
    # the search finds what it is given: a marker passed as an argument, by the test's choice, comes back
    given = [f"assert f({MARK}) == {MARK}", f"assert g([{MARK // 1000}]) == {MARK}"]
    assert code.run_tests(LEAK, given) == ["pass"] * 2


# the forms the earlier verifier refused (a comparison inside a loop, if, try or comprehension; a lambda,
# f-string, map or str method of the test's; a value computed from the program's passed back; * unpacking;
# import *): each runs as written now, an honest program passes and a wrong one fails
ONCE_REFUSED = [
    "for a, b in [(1, 2), (3, 4)]:\n    assert inc(a) == b",
    "if inc(1) != 2:\n    raise AssertionError",
    "assert all(inc(i) == i + 1 for i in range(3))",
    "assert [inc(i) for i in range(3)] == [i + 1 for i in range(3)]",
    "assert inc(1) == max(map(int, '12'))",
    "assert str(inc(1)) == ' 2'.replace(' ', '')",
    "assert inc(2) == (lambda: 3)()",
    "assert f'{inc(1)}' == '2'",
    "r = inc(1) + 1\nassert inc(r) == 4",
    "assert [inc(x) for x in [*range(2)]] == [1, 2]",
    "from math import *\nassert inc(0) == floor(pi) - 2",
    "try:\n    inc('a')\nexcept TypeError:\n    pass\nelse:\n    raise AssertionError('no TypeError')",
]


@sandboxed
def test_forms_once_refused_run_as_written():
    honest, wrong = "def inc(x):\n    return x + 1", "def inc(x):\n    return x + 2 if isinstance(x, int) else x"
    assert all(code_tests.plan(test).form == code_tests.RUN for test in ONCE_REFUSED)
    assert code.run_tests(honest, ONCE_REFUSED) == ["pass"] * len(ONCE_REFUSED)
    assert code.run_tests(wrong, ONCE_REFUSED) == ["fail"] * len(ONCE_REFUSED)


def test_survey_counts_the_forms_and_bad_tests_name_themselves(caplog):
    tests = ["assert f(1) == 2", "f(1)", "for x in y:\n    assert x", "assert True", "pass", "assert f(1 =="]
    with caplog.at_level("WARNING", logger="olmax.rewards.code_tests"):
        assert code_tests.survey(tests) == {"run": 3, "refused": 3}
    assert "names nothing a program could define" in caplog.text and "does not parse" in caplog.text
    humaneval = {"test": "def check(candidate):\n    assert candidate(1) == 2", "entry_point": "inc"}
    assert code_tests.plan(humaneval).form == code_tests.RUN and "check(inc)" in code_tests.plan(humaneval).source
    with pytest.raises(ValueError, match="code test 1 is a dict, not a string"):
        code.run_tests("", ["assert f(1)", {"input": "", "output": ""}], isolation="none")
    with pytest.raises(ValueError, match="code test 0's entry_point is no expression"):
        code.run_tests("", [{"test": "", "entry_point": "1 +"}], isolation="none")
    with pytest.raises(ValueError, match="code_stdio test 0 is not an object with input and output"):
        code.run_tests("", ["print(1)"], stdio=True, isolation="none")
    # a test that errors by itself fails and says where; one refused at load says why
    reasons = code.judge("def f(x):\n    return x", ["assert f(1) == 1\nassert g(2)", "assert True"], isolation="none")
    assert reasons[0][0] == "fail" and "line 2" in reasons[0][1] and "NameError" in reasons[0][1]
    assert reasons[1] == ("fail", "it names nothing a program could define")


def _codec():
    return code_remote.Codec({}, -1, -1)


def test_the_channel_reads_strictly():
    codec = _codec()
    for junk in (b"{}", b"[1]", b'[["zz"], [], []]', b'[["@", 5], [], []]', b'[1, [[2, "l"]], []]',
                 b'[1, [[3, "?"]], []]', b'[["f", ["@", 3]], [[3, "l"]], []]', b'[["i", "xyz"], [], []]',
                 b'[1, [], ["x"]]', b'[1, []]', b"[" * 100_000, b"not json"):  # fmt: skip
        with pytest.raises(code_channel.ChannelError):
            codec.decode(junk)
    # a program's object is a handle: it equals only itself, never None, and has no truth value, order or hash;
    # each refusal is recorded, so that a test that catches it fails all the same
    one, two = codec.decode(b'[["t", ["H", 1, "A"], ["H", 2, "A"], ["H", 1, "A"]], [], []]')[:2]
    assert one is codec.decode(b'[["H", 1, "A"], [], []]') and one == one and one != None and not one == None  # noqa: E711
    uses = (lambda: one == 3, lambda: one != 3, lambda: one == two, lambda: one != two, lambda: one < 3,
            lambda: bool(one), lambda: hash(one), lambda: 3 in [one], lambda: {one})  # fmt: skip
    for use in uses:
        with pytest.raises(code_handles.Refused):
            use()
    assert len(codec.refused) == len(uses)
    # data comes back as this side's own types
    value = codec.decode(b'[["t", ["i", "ff"], ["b", "YWI="], ["q", 1, 3], ["D", "0.1"], ["dt", "date", 2024, 2, 29],'
                         b' ["c", 1.0, -2.0], ["r", 0, 9, 3], ["f", 1, 2], ["dk", "a"]], [], []]')  # fmt: skip
    assert value == (255, b"ab", __import__("fractions").Fraction(1, 3), __import__("decimal").Decimal("0.1"),
                     __import__("datetime").date(2024, 2, 29), 1 - 2j, range(0, 9, 3), frozenset({1, 2}),
                     {"a": None}.keys())  # fmt: skip


COLLIDING = ", ".join(f'["i", "{k * (2**61 - 1):x}"]' for k in range(1, 20_000))  # hash(n) is n mod 2**61 - 1


@pytest.mark.parametrize(
    "message",
    [
        f'[["f", {COLLIDING}], [], []]',  # keys that all hash alike: a quadratic set
        f'[["@", 1], [[1, "d", {", ".join(f"{k}, 0" for k in COLLIDING.split(", "))}]], []]',
        '[["t", ' + ", ".join(['["t"'] * 200) + "]" * 201 + ", [], []]",  # nested past DEPTH
        '[["b", "' + "A" * ((16 << 20) + 4) + '"], [], []]',  # past MESSAGE_BYTES
        '[["@", 1], [[1, "l", ' + ", ".join(["0"] * 1001) + "]], []]",  # past ELEMENTS (made 1000 here)
        '[["@", 1], [[1, "l", ' + ", ".join(['["t", 0]'] * 501) + "]], []]",
    ],
    ids=["colliding_set", "colliding_dict", "deep", "bytes", "elements", "nested_elements"],
)
def test_the_channel_bounds_what_a_program_value_can_make(message, monkeypatch):
    monkeypatch.setattr(code_values, "ELEMENTS", 1000)  # the mechanism, at a size a test reads quickly
    start = time.thread_time()  # this thread's CPU time: other jobs on a shared host do not add to it
    with pytest.raises(code_channel.ChannelError):
        _codec().decode(message.encode())
    cpu = time.thread_time() - start
    tracemalloc.start()
    try:
        with pytest.raises(code_channel.ChannelError):
            _codec().decode(message.encode())
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert cpu < 2.0 and peak < 3 * len(message) + (64 << 20), (cpu, peak)


@sandboxed
@pytest.mark.parametrize(
    "program",
    [
        "def add(a, b):\n    return [0] * (60 << 20)",  # past the channel's elements
        "def add(a, b):\n    return 1 << 40_000_000",
        "def add(a, b):\n    x = []\n    for _ in range(100_000):\n        x = [x]\n    return x",  # deep, but shared
        "def add(a, b):\n    x = []\n    x.append(x)\n    return x",  # cyclic
        "def add(a, b):\n    return {'k' * i: 'v' * i for i in range(4000)}",
    ],
)
def test_huge_deep_and_cyclic_values_fail_within_bounds(program):
    tracemalloc.start()
    try:
        outcomes = code.run_tests(program, TESTS[:1], seconds=10.0)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert outcomes == ["fail"] and peak < 1 << 20, (outcomes, peak)  # the verifier sees a verdict, no value


@sandboxed
def test_test_code_run_for_the_program_neither_uses_it_nor_fails_quietly():
    """A method of the test's class that the program calls runs in the tests' process: where it uses the
    program (`len()` of a program object stored on it), or raises (a constructor given what it cannot take,
    which the program catches), the test fails, whatever the program or the test catch."""
    box = "class Box:\n    def __init__(self, items):\n        self.items = items\n    def size(self):\n"
    box += "        return len(self.items)\n"
    uses = "class Items:\n    def __len__(self):\n        return 2\ndef wrap():\n    return Box(Items()).size()"
    [(outcome, reason)] = code.judge(uses, [box + "assert wrap() == 2"])
    assert outcome == "fail" and "asked the program" in reason, reason
    raises = "def make():\n    try:\n        return Num('x')\n    except Exception:\n        return Num(1)"
    [(outcome, reason)] = code.judge(raises, ["class Num:\n    def __init__(self, v):\n        self.v = int(v)\n"
                                              "assert make().v == 1"])  # fmt: skip
    assert outcome == "fail" and "Num.__init__ raised" in reason, reason


@sandboxed
def test_a_result_past_the_channels_bounds_says_so():
    """A result past the channel's budgets (4.4 M elements) fails its test saying so, not as a program whose
    process ended; and a test cannot catch it as an error of the program's."""
    grid = "def grid(n):\n    return [[0] * n for _ in range(n)]"
    [(outcome, reason)] = code.judge(grid, ["assert len(grid(2100)) == 2100"])
    assert outcome == "fail" and "past" in reason and "ended" not in reason, reason
    assert code.run_tests(grid, ["try:\n    grid(2100)\nexcept Exception:\n    pass"]) == ["fail"]


def test_same_output_is_upstreams():
    cases = [("6\n", "6"), (" 0.50 \n2", "0.5\n2.0"), ("1 2", "1  2"), ("a", "b"), ("1\n2", "1"), ("", ""),
             ("1e3", "1000"), ("x 1", "x 1.0"), ("nan", "nan"), ("1\n\n", "1"), ("1 2 3", "1 2"),
             ("1", "1 2")]  # fmt: skip
    assert [code_stdio.same_output(a, b) for a, b in cases] == [True, True, True, False, False, True, True, False,
                                                                 True, True, False, False]  # fmt: skip
