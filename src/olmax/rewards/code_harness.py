"""The tests' side of a code test: the test run as written, in a process of its own, which alone decides.

The sandbox's runner (olmax.rewards.code_runner) forks one such process for a run (and another after
it killed one), confined as the program's are (limits, no network, the system call filter) and out of
their reach (under namespaces not in their view; not dumpable either way). For each test the runner hands
it, it reads that test from the tests' file, which no process of the program's ever holds, and runs it in
a fresh namespace:

- `code` tests (`run_code`): the program's process (olmax.rewards.code_program) reports the names the
  program defined; each becomes a global of the test's own namespace, as it would be had the test run
  after the program in one module (upstream's harness), except that a use of one is a request on the
  channel (olmax.rewards.code_channel, code_values): a function or class of the program's is a `Remote`,
  calling it sends its arguments as data and gets data back (or another Remote), with every shared
  object written back; an object either side can import by name (`collections.Counter`, a module) is this
  process's own copy where it only computes (code_channel.PURE_MODULES, `_own`). Everything else of
  the test (imports, helper functions and classes, loops, comprehensions, try/except, `pytest.raises`,
  HumanEval's `check(candidate)`, the expected values) runs here and nowhere else. A Remote has no truth value, order
  or hash, and equals only itself: those would be the program's own methods answering for it. The
  test passes when it raises nothing; a test that used no name of the program's is refused, never
  passed; a test during which the program's process ended or sent what is no answer fails, whatever the
  test caught.
- `code_stdio` tests: the input is written to a file that becomes the program's descriptor 0
  (olmax.rewards.code_runner hands it over); its output, a file, is read back here after the program
  ended and compared here, upstream's way (olmax.rewards.code_stdio).

Standard library only (this module runs inside the sandbox).
"""

from __future__ import annotations

import builtins
import signal
import sys

from olmax.rewards import code_channel as ch
from olmax.rewards import code_stdio
from olmax.rewards import code_values as cv

REASON_CHARS = 300  # of a verdict's reason
_KEPT_DUNDERS = frozenset(("__name__", "__qualname__", "__doc__"))  # fetched from the program; other dunders not
_ENUM_BASES = ("IntFlag", "Flag", "IntEnum", "StrEnum", "Enum")  # most specific first


class Refused(TypeError):
    """A use of a program object this process does not make (comparing, hashing or taking the truth of
    it: its own methods would answer), or a value of the test's that does not cross (a function)."""


class ProgramGone(BaseException):
    """The program's process ended, or sent what is no answer: this and every later use fails, and the
    test fails whatever it catches (a BaseException, so that `except Exception` does not swallow it)."""


class Late(BaseException):
    """The test's time is up."""


class Remote:
    """An object of the program's, held here by number: its use is a request to the program's process."""

    __slots__ = ("_remote_codec", "_remote_number", "_remote_kind")

    def __init__(self, codec, number: int, kind: str):
        object.__setattr__(self, "_remote_codec", codec)
        object.__setattr__(self, "_remote_number", number)
        object.__setattr__(self, "_remote_kind", kind)

    def _ask(self, op: str, *operands):
        return self._remote_codec.request(op, self, *operands)

    def __call__(self, *args, **kwargs):
        return self._ask("call", args, tuple(kwargs.items()))

    def __getattr__(self, name: str):
        if name.startswith("__") and name.endswith("__") and name not in _KEPT_DUNDERS:
            raise AttributeError(name)
        return self._ask("getattr", name)

    def __setattr__(self, name: str, value) -> None:
        self._ask("setattr", name, value)

    def __delattr__(self, name: str) -> None:
        self._ask("delattr", name)

    def __getitem__(self, key):
        return self._ask("getitem", key)

    def __setitem__(self, key, value) -> None:
        self._ask("setitem", key, value)

    def __delitem__(self, key) -> None:
        self._ask("delitem", key)

    def __len__(self) -> int:
        size = self._ask("len")
        if type(size) is not int or size < 0:
            raise Refused("the program's len() is not a count")
        return size

    def __iter__(self):
        found = self._ask("iter")
        return found if isinstance(found, Remote) else iter(found)

    def __next__(self):
        return self._ask("next")

    def __contains__(self, item) -> bool:
        return any(found is item or found == item for found in self)

    def _text(self, op: str, *operands) -> str:
        text = self._ask(op, *operands)
        if type(text) is not str:
            raise Refused(f"the program's {op}() is not a str")
        return text

    def __str__(self) -> str:
        return self._text("str")

    def __repr__(self) -> str:
        return self._text("repr")

    def __format__(self, spec: str) -> str:
        return self._text("format", spec)

    def __eq__(self, other):
        if isinstance(other, Remote):
            return self is other
        raise Refused(f"a {self._remote_kind} of the program's compared with a value (its own __eq__ would answer)")

    def __ne__(self, other):
        return not self.__eq__(other)

    def _order(self, other):
        raise Refused(f"a {self._remote_kind} of the program's ordered (its own methods would answer)")

    __lt__ = __le__ = __gt__ = __ge__ = _order

    def __hash__(self):
        raise Refused(f"a {self._remote_kind} of the program's hashed (its own __hash__ would answer)")

    def __bool__(self):
        raise Refused(f"a {self._remote_kind} of the program's has no truth value here (its own __bool__ would answer)")


def _builtin_exception(name) -> type | None:
    found = getattr(builtins, name, None) if type(name) is str else None
    return found if isinstance(found, type) and issubclass(found, BaseException) else None


def _own(module: str, qualname: str):
    """This process's own object of that name where it is a pure one (code_channel.PURE_MODULES, Python's
    builtins but IMPURE_BUILTINS) and is found there under that very name (not `random._os.system`: an
    attribute path to another module's object); else None (it stays a handle of the program's)."""
    pure = qualname.split(".")[0] not in ch.IMPURE_BUILTINS if module == "builtins" else (
        module.split(".")[0] in ch.PURE_MODULES)  # fmt: skip
    if not pure or any(part.startswith("_") for part in qualname.split(".") if part):
        return None
    try:
        found = ch.resolve(module, qualname)
    except ch.ChannelError:
        return None
    return found if ch.importable(found) == (module, qualname) else None


class Codec(cv.Codec):
    """The tests' side: the tests' classes cross as their instances' attributes; the program's objects are
    Remotes; what either side imports by name is resolved here only where it is pure."""

    parity = 0

    def __init__(self, namespace: dict, fd_in: int, fd_out: int):
        super().__init__()
        self.namespace, self.fd_in, self.fd_out = namespace, fd_in, fd_out
        self.proxies: dict[int, Remote] = {}
        self.classes: dict[str, type] = {}  # the tests' classes that crossed or were announced, by name
        self.methods: dict[type, tuple] = {}
        self.announced: set = set()
        self.errors: dict[int, type] = {}  # the program's exception classes, as classes of this side
        self.tuples: dict[tuple, type] = {}
        self.requests = 0
        self.gone = ""

    # --- values ----------------------------------------------------------------------------------------

    def proxy(self, number, kind) -> Remote:
        if type(number) is not int or type(kind) is not str:
            raise ch.ChannelError("a handle that is not (number, kind)")
        if number not in self.proxies:
            self.proxies[number] = Remote(self, number, kind[:100])
        return self.proxies[number]

    def test_class(self, cls: type) -> bool:
        return cls.__module__ == "__main__" and cls not in self.errors.values() and cls.__new__ is object.__new__

    def other(self, value, depth: int):  # noqa: C901 (one case per kind of value)
        kind = type(value)
        if kind is Remote:
            return ["H", value._remote_number]
        enum = sys.modules.get("enum")
        if enum is not None and isinstance(value, enum.Enum) and kind.__module__ == "__main__":
            self.register(kind)
            return ["e", kind.__name__, value.name]
        if isinstance(value, tuple) and isinstance(getattr(kind, "_fields", None), tuple):
            return ["nt", kind.__name__, list(kind._fields), *(self._enc(item, depth + 1) for item in value)]
        if not isinstance(value, type) and self.test_class(kind) and not isinstance(value, BaseException):
            self.register(kind)
            return ["@", self.share(value)]
        special = cv._special(value)
        if special is not None:
            return special(self, value, depth)
        found = ch.importable(value)
        if found is not None:
            return ["g", *found]
        raise ch.Unsendable(f"a {kind.__name__} of the test's cannot be passed to the program (only data crosses)")

    def register(self, cls: type) -> None:
        known = self.classes.setdefault(cls.__name__, cls)
        if known is not cls:
            raise ch.Unsendable(f"two classes of the test's are named {cls.__name__}")

    def instance_def(self, obj, ref: int) -> list:
        return self.attributes(obj, ref, type(obj).__name__)

    def new_instance(self, name: str):
        cls = self.classes.get(name)
        if cls is None or not self.test_class(cls):
            raise ch.ChannelError(f"an instance of {name[:40]!r}, which is no class of the test's")
        return object.__new__(cls)

    def set_attributes(self, obj, pairs: list) -> None:
        if len(pairs) % 2:
            raise ch.ChannelError("an attribute without a value")
        cls, fields = type(obj), {}
        for name, node in zip(pairs[::2], pairs[1::2]):
            if type(name) is not str or not name.isidentifier() or name.startswith("__"):
                raise ch.ChannelError("an attribute that is not a plain name")
            inherited = getattr(cls, name, None)
            if callable(inherited) or hasattr(type(inherited), "__get__") and not isinstance(inherited, (int, str)):
                raise ch.ChannelError(f"the program set {name}, a method or property of the test's {cls.__name__}")
            fields[name] = self.dec(node, 1)
        if isinstance(getattr(obj, "__dict__", None), dict):
            obj.__dict__.clear()
            obj.__dict__.update(fields)
        else:
            for name, value in fields.items():
                object.__setattr__(obj, name, value)

    def tagged(self, tag: str, rest: list, depth: int):  # noqa: C901 (one case per tag)
        if tag == "H" and len(rest) == 2:
            return self.proxy(*rest)
        if tag == "g" and len(rest) == 3 and type(rest[0]) is str and type(rest[1]) is str:
            found = _own(rest[0], rest[1])
            return self.proxy(rest[2], rest[1] or rest[0]) if found is None else found
        if tag == "x" and len(rest) == 5 and type(rest[1]) is str and type(rest[4]) is list:
            return self.error_class(*rest)
        if tag == "nt" and len(rest) >= 2 and type(rest[0]) is str and type(rest[1]) is list:
            return self.named_tuple(rest[0], rest[1])._make(self.dec(item, depth + 1) for item in rest[2:])
        if tag == "e" and len(rest) == 2 and isinstance(self.classes.get(rest[0]), type):
            try:
                return self.classes[rest[0]][rest[1]]
            except (KeyError, TypeError):
                raise ch.ChannelError(f"no member {str(rest[1])[:40]} of {rest[0]}") from None
        raise ch.ChannelError(f"an unknown value {tag[:8]!r}")

    def error_class(self, number, name: str, module, qualname, bases: list) -> type:
        """An exception class of the program's, here: the same class where it is a pure one of the
        standard library's (json.JSONDecodeError), else a class of this side deriving from the first of its
        builtin bases (so that `except ValueError` catches it), one per class of the program's."""
        found = _own(module, qualname) if type(module) is str and type(qualname) is str and module else None
        if isinstance(found, type) and issubclass(found, BaseException):
            return found
        if number not in self.errors:
            base = next(filter(None, map(_builtin_exception, bases)), Exception)
            if not name.isidentifier():
                raise ch.ChannelError("an exception class whose name is not a name")
            self.errors[number] = type(name, (base,), {"__module__": "__main__", "__qualname__": name})
        return self.errors[number]

    def named_tuple(self, name: str, fields: list) -> type:
        known = self.classes.get(name) or self.namespace.get(name)
        if isinstance(known, type) and getattr(known, "_fields", None) == tuple(fields):
            return known
        if not name.isidentifier() or not all(type(f) is str and f.isidentifier() for f in fields):
            raise ch.ChannelError("a namedtuple whose name or fields are not names")
        key = (name, tuple(fields))
        if key not in self.tuples:
            import collections

            self.tuples[key] = collections.namedtuple(name, fields)
        return self.tuples[key]

    # --- the tests' classes, announced to the program's side ------------------------------------------

    def announce(self) -> tuple:
        """What the program's side must make of the tests' classes not announced yet (code_program
        `Codec.announce`): its namespace's and those that crossed."""
        found = [v for v in list(self.namespace.values()) if isinstance(v, type) and v.__module__ == "__main__"]
        entries = []
        for cls in found + list(self.classes.values()):
            if cls.__name__ in self.announced or cls in self.errors.values():
                continue
            self.announced.add(cls.__name__)
            entry = self._announcement(cls)
            if entry is not None:
                self.classes.setdefault(cls.__name__, cls)
                entries.append(entry)
        return tuple(entries)

    def _announcement(self, cls: type):
        enum = sys.modules.get("enum")
        if enum is not None and issubclass(cls, enum.Enum):
            base = next(name for name in _ENUM_BASES if hasattr(enum, name) and issubclass(cls, getattr(enum, name)))
            members = tuple((m.name, m.value) for m in cls)
            if all(type(v) in (int, str, float, bool) for _, v in members):
                return ("enum", cls.__name__, base, members)
            return None
        if issubclass(cls, tuple) and isinstance(getattr(cls, "_fields", None), tuple):
            return ("namedtuple", cls.__name__, cls._fields)
        if not self.test_class(cls) or issubclass(cls, BaseException):
            return None
        methods = tuple(sorted({name for klass in cls.__mro__[:-1] if klass.__module__ == "__main__"
                                for name, value in vars(klass).items()
                                if not name.startswith("_") and callable(value)}))  # fmt: skip
        self.methods[cls] = methods
        params = getattr(cls, "__dataclass_params__", None)
        fields = tuple(getattr(cls, "__dataclass_fields__", {})) if params is not None and params.eq else None
        return ("class", cls.__name__, methods, fields, bool(params is not None and params.frozen))

    # --- requests ----------------------------------------------------------------------------------------

    def request(self, op: str, target, *operands):
        """Send a request (Remote's methods), serve the program's calls of the tests' classes meanwhile, and
        return its answer's value or raise what the program raised."""
        if self.gone:
            raise ProgramGone(self.gone)
        self.requests += 1
        try:
            entries = self.announce()
            classes = self.encode(entries) if entries else b""
            payload = self.encode((op, target, *operands))
        except ch.Unsendable as e:
            raise Refused(str(e)) from None
        try:
            if classes:  # first, so that the program's side has the classes the request's values name
                ch.send(self.fd_out, b"c", classes)
            ch.send(self.fd_out, b"R", payload)
            while True:
                kind, payload = ch.receive(self.fd_in)
                if kind == b"C":
                    self.callback(payload)
                    continue
                if kind != b"A":
                    raise ch.ChannelError("what arrived is no answer")
                answer = self.decode(payload)
                break
        except Late:
            raise
        except (ch.ChannelError, OSError, Exception) as e:
            self.gone = "the program's process ended" if isinstance(e, (ch.Closed, BrokenPipeError)) else (
                f"the program's answer could not be read: {type(e).__name__}: {str(e)[:120]}")  # fmt: skip
            raise ProgramGone(self.gone) from None
        if type(answer) is tuple and len(answer) == 2 and answer[0] == "ok":
            return answer[1]
        if type(answer) is tuple and len(answer) == 4 and answer[0] == "raise":
            raise _rebuild(*answer[1:]) from None
        self.gone = "the program's answer is not one"
        raise ProgramGone(self.gone)

    def callback(self, payload: bytes) -> None:
        """The program constructed one of the tests' classes, or called a method of one: run here."""
        call = self.decode(payload)
        if type(call) is not tuple or len(call) != 5 or call[0] not in ("new", "call") or type(call[3]) is not tuple:
            raise ch.ChannelError("a callback that is not (op, name, target, args, kwargs)")
        op, name, target, args, kwargs = call
        cls = type(target)
        try:
            if not self.test_class(cls) or self.classes.get(cls.__name__) is not cls:
                raise Refused("the program called back into something that is no class of the test's")
            if op == "new":
                result = cls.__init__(target, *args, **dict(kwargs))
            elif name in self.methods.get(cls, ()):
                result = getattr(target, name)(*args, **dict(kwargs))
            else:
                raise AttributeError(f"{cls.__name__} has no method {str(name)[:40]} the program may call")
            answer = self.encode(("ok", result))
        except Late:
            raise
        except Exception as e:  # what the tests' code raised, for the program to see
            error = type(e).__name__ if _builtin_exception(type(e).__name__) is type(e) else "RuntimeError"
            answer = self.encode(("raise", error, str(e)[:500]))
        ch.send(self.fd_out, b"K", answer)


def _rebuild(cls, args, text) -> BaseException:
    """What the program raised, as an exception of this side's (its class as the channel gave it)."""
    if isinstance(cls, type) and issubclass(cls, BaseException):
        for attempt in (args, (text,)):
            try:
                return cls(*attempt) if type(attempt) is tuple else cls()
            except Exception:  # noqa: BLE001 (a constructor that wants other arguments)
                continue
    return RuntimeError(str(text)[:500])


# --- running one test ---------------------------------------------------------------------------------------


def _guarded(function, source: str):
    """eval/exec/compile for the tests: only of text the test itself holds. A string the program returned
    would otherwise run here, where the verdict is made."""

    def guarded(code, *args, **kwargs):
        text = code.decode("utf-8", "replace") if isinstance(code, (bytes, bytearray)) else code
        if isinstance(text, str) and text.strip() and text not in source:
            raise Refused(f"{function.__name__}() of text the test does not hold (a value of the program's?)")
        return function(code, *args, **kwargs)

    guarded.__name__ = function.__name__
    return guarded


def _tests_builtins(source: str) -> dict:
    made = dict(vars(builtins))
    for name in ("eval", "exec", "compile"):
        made[name] = _guarded(made[name], source)
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
    """The program's names, bound in the test's namespace (module docstring); returns those bound. A name of
    Python's builtins stays Python's unless the test names no other name it could take from the program
    (then it is the task's: a `sum` the program defines); a free name the test uses only as `X.attr` that
    is a module of the standard library is this side's module (the test's own `math.isclose` is math's)."""
    if type(names) is not tuple:
        raise ch.ChannelError("the program's names are not a tuple")
    bound = set()
    for entry in names:
        if type(entry) is not tuple or len(entry) != 2 or type(entry[0]) is not str:
            raise ch.ChannelError("a name that is not (name, value)")
        name, value = entry
        if hasattr(builtins, name) and not spec["builtin_task"]:
            continue
        namespace[name] = value
        bound.add(name)
    for name in spec["modules"]:
        if name.split(".")[0] in sys.stdlib_module_names:
            try:
                namespace[name] = __import__(name)
                bound.discard(name)
            except ImportError:
                pass
    return bound


def run_code(spec: dict, fd_in: int, fd_out: int, loaded: list) -> tuple[str, str, bool]:
    """A `code` test (module docstring): (verdict, reason, whether the program failed to load). Verdicts:
    "p" passed, "f" failed, "r" refused (it used no name of the program's), "t" out of time (raised here
    as Late by the caller's timer). `loaded` gets True once the program's names are in."""
    ch.send(fd_out, b"P", " ".join(spec["classes"]).encode("ascii", "replace"))
    kind, payload = ch.receive(fd_in)
    if kind == b"L":
        return "f", f"the program failed to load: {payload.decode('utf-8', 'replace')[:200]}", True
    namespace = {"__name__": "__main__", "__builtins__": _tests_builtins(spec["source"])}
    codec = Codec(namespace, fd_in, fd_out)
    if kind != b"N":
        return "f", "the program's process sent no names", True
    try:
        bound = _bind(namespace, codec.decode(payload), spec)
    except ch.ChannelError as e:
        return "f", f"the program's names could not be read: {e}", True
    loaded.append(True)
    try:
        exec(compile(spec["source"], "<test>", "exec", dont_inherit=True), namespace)
    except (Late, ProgramGone):
        raise
    except AssertionError as e:
        said = f": {str(e)[:150]}" if e.args else ""
        return "f", f"an assert failed{_where(e)}{said}", False
    except BaseException as e:  # noqa: BLE001 (a test that raised fails, as upstream's)
        verdict = "the test refused a use of a program object" if isinstance(e, Refused) else "the test raised"
        return "f", f"{verdict}{_where(e)}: {type(e).__name__}: {str(e)[:150]}", False
    finally:
        if codec.gone:
            raise ProgramGone(codec.gone)
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
    except ProgramGone as e:
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
