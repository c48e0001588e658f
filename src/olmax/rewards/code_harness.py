"""The tests' side of a code test: the test run as written, in a process of its own, which alone decides.

The sandbox's runner (olmax.rewards.code_runner) forks one such process for a run (and another after
it killed one), confined as the program's are (limits, no network, the system call filter) and out of
their reach (under namespaces not in their view; not dumpable either way). For each test the runner hands
it, it reads that test from the tests' file, which no process of the program's ever holds, and runs it in
a fresh namespace, a module `__main__` of its own (`unittest.main()` finds the test's classes there):

- `code` tests (`run_code`): the program's process (olmax.rewards.code_program) reports the names the
  program defined among those the test uses; each becomes a global of the test's own namespace, as it would
  be had the test run after the program in one module (upstream's harness), except that a use of one is a
  request on the channel (olmax.rewards.code_remote, code_values): a function or class of the program's is
  a `Remote`, calling it sends its arguments as data and gets data back (or another Remote), with what
  either side changed written back; an object either side can import by name (`collections.Counter`, a
  module) is this process's own copy where it only computes (code_channel.PURE_MODULES). Names the test
  uses as modules, and well-known names it uses beside the program's, are this process's own, never the
  program's (code_tests `modules`, `known`); a builtin's name is the program's only where it is the task
  (`_bind`). Everything else of the test (imports, helper functions and classes, loops, comprehensions,
  try/except, `pytest.raises`, HumanEval's `check(candidate)`, the expected values) runs here and nowhere
  else. The test passes when it raises nothing (or ends by a SystemExit of its own with status 0, as
  `unittest.main()` does); a test that used no name of the program's is refused, never passed; a test
  during which a use of a program object was refused, the program's process ended or sent what is no
  answer, or test code the program ran failed, fails whatever the test caught.
- `code_stdio` tests: the input is written to a file that becomes the program's descriptor 0
  (olmax.rewards.code_runner hands it over); its output, a file, is read back here after the program
  ended and compared here, upstream's way (olmax.rewards.code_stdio).

Standard library only (this module runs inside the sandbox).
"""

from __future__ import annotations

import builtins
import importlib
import json
import signal
import sys
import types

from olmax.rewards import code_channel as ch
from olmax.rewards import code_stdio
from olmax.rewards.code_handles import Late, Refused, Spoiled
from olmax.rewards.code_remote import Codec

REASON_CHARS = 300  # of a verdict's reason


def _guarded(function, source: str, codec: Codec):
    """eval/exec/compile for the tests: only of text the test itself holds. A string the program returned
    would otherwise run here, where the verdict is made."""

    def guarded(code, *args, **kwargs):
        text = code.decode("utf-8", "replace") if isinstance(code, (bytes, bytearray)) else code
        if isinstance(text, str) and text.strip() and text not in source:
            raise codec.refuse(f"{function.__name__}() of text the test does not hold (a value of the program's?)")
        return function(code, *args, **kwargs)

    guarded.__name__ = function.__name__
    return guarded


def _tests_builtins(source: str, codec: Codec) -> dict:
    made = dict(vars(builtins))
    for name in ("eval", "exec", "compile"):
        made[name] = _guarded(made[name], source, codec)
    if "pickle" in source or "marshal" in source:
        _restrict_unpickling()
    return made


# what a test's unpickling may build: data types (the program's bytes would otherwise name any callable)
_UNPICKLED = {"builtins": {"list", "dict", "set", "frozenset", "tuple", "bytes", "bytearray", "int", "float",
                           "complex", "str", "bool", "range", "slice"},
              "collections": {"OrderedDict", "Counter", "defaultdict", "deque"}, "copyreg": {"_reconstructor"},
              "datetime": {"date", "time", "datetime", "timedelta", "timezone"}, "decimal": {"Decimal"},
              "fractions": {"Fraction"}}  # fmt: skip


def _restrict_unpickling() -> None:
    """pickle.loads and pickle.load build data types only, and marshal.loads refuses, in this process: a test
    that unpickles what the program returned would otherwise run what the program chose, here."""
    import marshal
    import pickle

    class Unpickler(pickle.Unpickler):
        def find_class(self, module, name):
            if name in _UNPICKLED.get(module, ()):
                return super().find_class(module, name)
            raise pickle.UnpicklingError(f"{module}.{name} is no data type the tests' process unpickles")

    pickle.Unpickler = Unpickler
    pickle.load = lambda file, **kwargs: Unpickler(file, **kwargs).load()
    pickle.loads = lambda data, **kwargs: Unpickler(__import__("io").BytesIO(data), **kwargs).load()

    def refuse(*args, **kwargs):
        raise ValueError("marshal.loads is refused in the tests' process (it makes code objects)")

    marshal.loads = marshal.load = refuse


def _where(error: BaseException) -> str:
    tb, line = error.__traceback__, None
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == "<test>":
            line = tb.tb_lineno
        tb = tb.tb_next
    return f" (line {line})" if line else ""


def _bind(namespace: dict, names, spec: dict) -> set:
    """The program's names, bound in the test's namespace (module docstring); returns those bound. The names
    the test uses as modules and the well-known names it takes from the library are this process's own
    (code_tests `modules`, `known`: imported here; left unbound where that fails); a name of Python's
    builtins stays Python's unless the test names no other name it could take from the program, and then
    only the innermost one the test calls that the program defines is the program's (the task: `pow` in
    `abs(pow(2, 0.5) - 1.41)`)."""
    if type(names) is not tuple:
        raise ch.ChannelError("the program's names are not a tuple")
    own = {**spec["modules"], **spec["known"]}
    for name, module in own.items():
        try:
            found = importlib.import_module(module)
            namespace[name] = found if name in spec["modules"] else getattr(found, name)
        except Exception:  # noqa: BLE001 (not installed here, or no such name: the test's NameError)
            pass
    program = {}
    for entry in names:
        if type(entry) is not tuple or len(entry) != 2 or type(entry[0]) is not str:
            raise ch.ChannelError("a name that is not (name, value)")
        program[entry[0]] = entry[1]
    task = next((name for name in spec["builtin_order"] if name in program), None) if spec["builtin_task"] else None
    bound = set()
    for name, value in program.items():
        if name in own or hasattr(builtins, name) and name != task:
            continue
        namespace[name] = value
        bound.add(name)
    return bound


def _ended_well(error: BaseException) -> bool:
    """A SystemExit the test raised itself with status 0 (`unittest.main()` after its tests passed); never
    one the program raised."""
    return (
        isinstance(error, SystemExit) and error.code in (None, 0, False) and not getattr(error, "olmax_program", False)
    )


def run_code(spec: dict, fd_in: int, fd_out: int, loaded: list) -> tuple[str, str, bool]:
    """A `code` test (module docstring): (verdict, reason, whether the program failed to load). Verdicts:
    "p" passed, "f" failed, "r" refused (it used no name of the program's), "t" out of time (raised here
    as Late by the caller's timer). `loaded` gets True once the program's names are in."""
    wanted = {"classes": spec["classes"], "names": spec["free"], "stdout": spec["prints"]}
    ch.send(fd_out, b"P", json.dumps(wanted).encode())
    kind, payload = ch.receive(fd_in)
    if kind == b"L":
        return "f", f"the program failed to load: {payload.decode('utf-8', 'replace')[:200]}", True
    module = types.ModuleType("__main__")
    namespace = module.__dict__
    codec = Codec(namespace, fd_in, fd_out, spec["accessors"], spec["dunders"])
    namespace["__builtins__"] = _tests_builtins(spec["source"], codec)
    if kind != b"N":
        return "f", "the program's process sent no names", True
    try:
        bound = _bind(namespace, codec.decode(payload), spec)
    except ch.ChannelError as e:
        return "f", f"the program's names could not be read: {e}", True
    loaded.append(True)
    main, sys.modules["__main__"] = sys.modules.get("__main__"), module
    try:
        exec(compile(spec["source"], "<test>", "exec", dont_inherit=True), namespace)
    except (Late, Spoiled):
        raise
    except AssertionError as e:
        said = f": {str(e)[:150]}" if e.args else ""
        return "f", f"an assert failed{_where(e)}{said}", False
    except BaseException as e:  # noqa: BLE001 (a test that raised fails, as upstream's)
        if not _ended_well(e) or codec.refused:
            verdict = "the test refused a use of a program object" if isinstance(e, Refused) else "the test raised"
            return "f", f"{verdict}{_where(e)}: {type(e).__name__}: {str(e)[:150]}", False
    finally:
        sys.modules["__main__"] = main
        if codec.spoiled:
            raise Spoiled(codec.spoiled)
    if codec.refused:
        return "f", f"the test refused a use of a program object (and caught it): {codec.refused[0][:150]}", False
    if not codec.requests and not bound & set(spec["free"]):
        return "r", "the test used no name of the program's", False
    return "p", "", False


def run(spec: dict, seconds: float, channel: tuple = (), exchange=None, output_bytes: int = 0) -> bytes:
    """One test under its time limit, as the verdict the runner reads: "<kind>[L] <reason>" (L: the program
    failed to load). A `code` test talks to the program's process over `channel` (the descriptors to read
    from it and to write to it); a stdio test runs it by `exchange` (code_stdio `judge`)."""
    late, loaded = [], []

    def expire(signum, frame):
        late.append(True)
        raise Late()

    signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        if "input" in spec:
            kind, reason, load = code_stdio.judge(spec, exchange, output_bytes)
        else:
            kind, reason, load = run_code(spec, *channel, loaded)
    except Late:
        kind, reason, load = "t", "past the time limit", "input" not in spec and not loaded
    except Spoiled as e:
        kind, reason, load = "f", str(e), False
    except ch.ChannelError as e:
        kind, reason, load = "f", f"the channel failed: {e}", False
    except Exception as e:  # noqa: BLE001 (this process's own failure: the test fails, saying so)
        kind, reason, load = "f", f"the tests' process failed: {type(e).__name__}: {str(e)[:150]}", False
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    if late:
        kind, reason = "t", "past the time limit" + (" while the program loaded" if load else "")
    return f"{kind}{'L' if load else ''} {reason}".encode("utf-8", "replace")[:REASON_CHARS]
