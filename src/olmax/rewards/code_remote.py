"""The tests' side of the channel to a program's process: the program's objects as Remotes, and the rules
for what the tests' own objects may do for the program.

A test runs in a process of its own (olmax.rewards.code_harness); each use it makes of a program name is
a request to the program's process (olmax.rewards.code_program) through this side's `Codec`, whose
messages code_values writes and reads. What a use may be, and what this process does not do for the
program:

- a program object that is not data is a `Remote`: calling it, getting or setting an attribute or item,
  `len`, `iter`, `next`, `in`, `isinstance` with its class (the program's answer must be a bool), `str`,
  `repr` and `format` are requests; it has only those of these methods its program object has (`PROTOCOL`),
  and the special names the test asks for itself (`p.__dict__`) are the program's. It has no truth value,
  order or hash, and equals only itself and never None: comparing two distinct ones, or one with a value,
  would be the program's own methods answering. Those uses, operators, conversions, `with` and copies of
  it, and an argument that cannot cross or an answer past the channel's bounds, are **refused**: `Refused`
  is raised and recorded, and a test with a recorded refusal fails whatever it caught (the refusal is no
  error of the program's for a test to expect); what the program printed is written where the test
  captures stdout;
- what the program raised comes back as the same builtin exception, or as a class of this side deriving
  from the builtin bases of the program's class; StopIteration from any request but `next` comes back as
  RuntimeError (PEP 479's rule: it would end the test's own iteration);
- the program may construct a class of the test's and call its methods only where they hold no test of
  their own (`Codec.constructible`, `accessor`: a constructor or method that stores and reads what it is
  given, code_tests `accessors`, or a dataclass's generated one); test code run so may not ask the
  program anything, and what it raises fails the test (`Spoiled`): no oracle of the test's verdict or
  values for the program;
- an instance of the test's class comes back with the attributes the program set, but never one that
  shadows what the class itself defines (a method, a property, a class attribute), unless its __init__
  assigns it, or it is a dataclass field or a slot;
- an empty numpy array of the program's refuses to meet a non-empty operand (`_empty_class`): numpy
  broadcasts it to an empty result, on which every comparison holds.

Standard library only (this module runs inside the sandbox).
"""

from __future__ import annotations

import builtins
import codecs
import json
import sys
import types

from olmax.rewards import code_channel as ch
from olmax.rewards import code_datatypes as dt
from olmax.rewards import code_values as cv
from olmax.rewards.code_handles import EVERY, UNHASHABLE, Late, Refused, Remote, Spoiled, remote_class

_ENUM_BASES = ("IntFlag", "Flag", "IntEnum", "StrEnum", "Enum")  # most specific first
_BATCH_AFTER = 8  # next() calls in a row on one iterator before its items are asked for in batches
_BATCH = 128  # the most items asked for at once (code_program.BATCH)
_PLAIN = (None, 0, 1, -1, "")  # defaults a class the program may construct can have (code_tests' constants too)


def _builtin_exception(name) -> type | None:
    found = getattr(builtins, name, None) if type(name) is str else None
    return found if isinstance(found, type) and issubclass(found, BaseException) else None


def _own(module: str, qualname: str):
    """This process's own object of that name where it is a pure one (code_channel.PURE_MODULES, Python's
    builtins but IMPURE_BUILTINS) and is found there under that very name (not `random._os.system`: an
    attribute path to another module's object), or a builtin type's slot (`object.__eq__`, what a program
    class that defines none has); else None (it stays a handle of the program's)."""
    pure = qualname.split(".")[0] not in ch.IMPURE_BUILTINS if module == "builtins" else (
        module.split(".")[0] in ch.PURE_MODULES)  # fmt: skip
    parts = [part for part in qualname.split(".") if part]
    slot = module == "builtins" and len(parts) == 2 and parts[1][:2] == parts[1][-2:] == "__"
    if not pure or any(part.startswith("_") for part in parts[: 1 if slot else None]):
        return None
    try:
        found = ch.resolve(module, qualname)
    except ch.ChannelError:
        return None
    if slot and type(found) not in (types.WrapperDescriptorType, types.MethodDescriptorType):
        return None
    return found if ch.importable(found) == (module, qualname) else None


def _plain(value) -> bool:
    return value is None or type(value) in (bool, int, float, str) and value in _PLAIN


class Codec(cv.Codec):
    """The tests' side: the tests' classes cross as their instances' attributes; the program's objects are
    Remotes; what either side imports by name is resolved here only where it is pure. `accessors` are the
    (first line, name) of the test's functions a program may have run for it (code_tests `accessors`)."""

    parity = 0

    def __init__(self, namespace: dict, fd_in: int, fd_out: int, accessors=(), dunders=()):
        super().__init__()
        self.namespace, self.fd_in, self.fd_out = namespace, fd_in, fd_out
        self.dunders = frozenset(dunders)
        self.accessors = {(line, name): recipe for line, name, recipe in accessors}
        self.proxies: dict[int, Remote] = {}
        self.classes: dict[str, type] = {}  # the tests' classes that crossed or were announced, by name
        self.methods: dict[type, tuple] = {}
        self.announced: set = set()
        self.errors: dict[int, type] = {}  # the program's exception classes, as classes of this side
        self.tuples: dict[tuple, type] = {}
        self.buffers: dict[int, list] = {}  # items of a program's iterator asked for and not used yet (reversed)
        self.last, self.streak = None, 0  # the iterator of the last request, if a next(), and the next()s in a row
        self.requests = 0
        self.refused: list[str] = []
        self.spoiled = ""
        self.calling_back = False
        self._empty = None
        self._text_in = None  # the decoder of what the program printed

    def refuse(self, text: str) -> Refused:
        """A refusal (module docstring), recorded: the test fails whatever it catches."""
        self.refused.append(text)
        return Refused(text)

    def spoil(self, text: str) -> Spoiled:
        self.spoiled = self.spoiled or text
        return Spoiled(self.spoiled)

    # --- values ----------------------------------------------------------------------------------------

    def proxy(self, number, kind, flags=EVERY) -> Remote:
        if type(number) is not int or type(kind) is not str or type(flags) is not int or not 0 <= flags <= EVERY | (
                UNHASHABLE):  # fmt: skip
            raise ch.ChannelError("a handle that is not (number, kind, methods)")
        if number not in self.proxies:
            self.proxies[number] = remote_class(flags)(self, number, kind[:100])
        return self.proxies[number]

    def test_class(self, cls: type) -> bool:
        return cls.__module__ == "__main__" and cls not in self.errors.values() and cls.__new__ is object.__new__

    def other(self, value, depth: int):  # noqa: C901 (one case per kind of value)
        kind = type(value)
        if issubclass(kind, Remote):
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

    def new_array(self, array):
        return array if array.size else array.view(self._empty or _empty_class(self))

    def set_attributes(self, obj, pairs: list) -> None:
        if len(pairs) % 2:
            raise ch.ChannelError("an attribute without a value")
        cls, fields = type(obj), {}
        for name, node in zip(pairs[::2], pairs[1::2]):
            if type(name) is not str or not name.isidentifier() or name.startswith("__"):
                raise ch.ChannelError("an attribute that is not a plain name")
            if not _writable(cls, name):
                raise ch.ChannelError(f"the program set {name}, which the test's {cls.__name__} defines itself")
            fields[name] = self.dec(node, 1)
        if isinstance(getattr(obj, "__dict__", None), dict):
            obj.__dict__.clear()
            obj.__dict__.update((k, v) for k, v in fields.items() if k not in cv.slots(cls))
        for name, value in fields.items():
            if name in cv.slots(cls):
                object.__setattr__(obj, name, value)

    def tagged(self, tag: str, rest: list, depth: int):  # noqa: C901 (one case per tag)
        if tag == "H" and len(rest) in (2, 3):
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
        standard library's (json.JSONDecodeError), else a class of this side deriving from its builtin
        bases (so that `except ValueError` catches a class of (KeyError, ValueError)), one per class."""
        found = _own(module, qualname) if type(module) is str and type(qualname) is str and module else None
        if isinstance(found, type) and issubclass(found, BaseException):
            return found
        if number not in self.errors:
            if not name.isidentifier():
                raise ch.ChannelError("an exception class whose name is not a name")
            found = [cls for cls in map(_builtin_exception, bases) if cls is not None]
            leaves = tuple(dict.fromkeys(c for c in found if not any(o is not c and issubclass(o, c) for o in found)))
            body = {"__module__": "__main__", "__qualname__": name}
            try:
                self.errors[number] = type(name, leaves or (Exception,), body)
            except TypeError:  # bases whose layouts conflict: the first
                self.errors[number] = type(name, leaves[:1], body)
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
                                if not name.startswith("_") and self.accessor(value)}))  # fmt: skip
        self.methods[cls] = methods
        params = getattr(cls, "__dataclass_params__", None)
        fields = tuple(getattr(cls, "__dataclass_fields__", {})) if params is not None and params.eq else None
        frozen = bool(params is not None and params.frozen)
        constructible = self.constructible(cls)
        recipe = json.dumps(self.recipe(cls)) if constructible else "null"
        return ("class", cls.__name__, methods, fields, frozen, constructible, recipe)

    def recipe(self, cls: type):
        """How the program's process constructs `cls` itself (code_tests `_recipe`), where its constructor only
        stores its arguments (or it is a dataclass without __post_init__): no round trip per `TreeNode(x)`."""
        init = cls.__init__
        code = getattr(init, "__code__", None)
        if code is not None and code.co_filename == "<test>":
            return self.accessors.get((code.co_firstlineno, code.co_name))
        if code is None or getattr(cls, "__post_init__", None) is not None:
            return None
        dataclasses = sys.modules["dataclasses"]
        params = []
        for f in dataclasses.fields(cls):
            if not f.init:
                return None
            default = None
            if f.default is not dataclasses.MISSING:
                default = ["c", f.default]
            elif f.default_factory is not dataclasses.MISSING:
                default = ["e", f.default_factory.__name__]  # (list, dict or set: `constructible`)
            params.append([f.name, default is not None, default, bool(getattr(f, "kw_only", False))])
        return {"params": params, "set": [[p[0], ["p", p[0]]] for p in params]}

    def accessor(self, function) -> bool:
        """Whether the program may have `function` of the test's run for it: a function of the test's text
        that stores and reads only what it is given (code_tests `accessors`), whose defaults are plain."""
        code = getattr(function, "__code__", None)
        if code is None or code.co_filename != "<test>" or (code.co_firstlineno, code.co_name) not in self.accessors:
            return False
        defaults = (
            *(getattr(function, "__defaults__", None) or ()),
            *(getattr(function, "__kwdefaults__", None) or {}).values(),
        )
        return all(map(_plain, defaults))

    def constructible(self, cls: type) -> bool:
        """Whether the program may construct the test's class `cls` (module docstring): its __init__ is
        object's, an accessor, or a dataclass's generated one with plain defaults and no __post_init__ but
        an accessor."""
        init = cls.__init__
        if init is object.__init__ or self.accessor(init):
            return True
        fields = getattr(cls, "__dataclass_fields__", None)
        code = getattr(init, "__code__", None)
        if not isinstance(fields, dict) or code is None or code.co_filename != "<string>":
            return False
        post = getattr(cls, "__post_init__", None)
        missing = sys.modules["dataclasses"].MISSING
        return (post is None or self.accessor(post)) and all(
            (f.default is missing or _plain(f.default)) and f.default_factory in (missing, list, dict, set)
            for f in fields.values())  # fmt: skip

    # --- requests ----------------------------------------------------------------------------------------

    def request(self, op: str, target, *operands):
        """Send a request (Remote's methods), serve the program's calls of the tests' classes meanwhile, and
        return its answer's value or raise what the program raised."""
        if self.spoiled:
            raise Spoiled(self.spoiled)
        if self.calling_back:
            raise self.spoil(f"test code the program ran asked the program for something ({op})")
        number = target._remote_number if isinstance(target, Remote) else None
        self.streak = self.streak + 1 if op == "next" and self.last == number else int(op == "next")
        self.last = number if op == "next" else None
        self.requests += 1
        try:
            entries = self.announce()
            classes = self.encode(entries) if entries else b""
            payload = self.encode((op, target, *operands))
        except ch.Unsendable as e:
            raise self.refuse(str(e)) from None
        try:
            if classes:  # first, so that the program's side has the classes the request's values name
                ch.send(self.fd_out, b"c", classes)
            ch.send(self.fd_out, b"R", payload)
            while True:
                kind, payload = ch.receive(self.fd_in)
                if kind == b"C":
                    self.callback(payload)
                    continue
                if kind == b"O":
                    self.printed(payload)
                    continue
                if kind != b"A":
                    raise ch.ChannelError("what arrived is no answer")
                answer = self.decode(payload)
                break
        except (Late, Spoiled):
            raise
        except (ch.ChannelError, OSError, Exception) as e:
            ended = isinstance(e, (ch.Closed, BrokenPipeError))
            what = f"the program's answer could not be read: {type(e).__name__}: {str(e)[:120]}"
            raise self.spoil("the program's process ended" if ended else what) from None
        if type(answer) is tuple and len(answer) == 2 and answer[0] == "ok":
            return answer[1]
        if type(answer) is tuple and len(answer) == 2 and answer[0] == "refused" and type(answer[1]) is str:
            raise self.refuse(answer[1][:300])
        if type(answer) is tuple and len(answer) == 4 and answer[0] == "raise":
            error = _rebuild(*answer[1:])
            if isinstance(error, (StopIteration, StopAsyncIteration)) and op != "next":
                error = RuntimeError(f"the program raised {type(error).__name__} from a {op} request (PEP 479)")
            raise error from None
        raise self.spoil("the program's answer is not one")

    def next_item(self, remote: Remote):
        """The next item of the program's iterator `remote`: after _BATCH_AFTER next() calls in a row on it,
        asked for in growing batches (a 50,000-item generator is not 50,000 round trips)."""
        number = remote._remote_number
        buffer = self.buffers.get(number)
        if buffer:
            return buffer.pop()
        count = (
            1
            if self.last != number or self.streak < _BATCH_AFTER
            else min(1 << (self.streak - _BATCH_AFTER + 1), _BATCH)
        )
        items = self.request("next", remote, count)
        if type(items) is not tuple or not items:
            raise self.spoil("the program's answer to next() is not its items")
        self.buffers[number] = list(reversed(items[1:]))
        return items[0]

    def printed(self, data: bytes) -> None:
        """What the program printed, written where the test captures this process's stdout (redirect_stdout);
        nowhere when it does not."""
        if self._text_in is None:
            self._text_in = codecs.getincrementaldecoder("utf-8")("replace")
        text = self._text_in.decode(data)
        if sys.stdout is not sys.__stdout__ and sys.stdout is not None:
            sys.stdout.write(text)

    def callback(self, payload: bytes) -> None:
        """The program constructed one of the tests' classes, or called a method of one (module docstring):
        run here, where the class allows it; anything else spoils the test."""
        call = self.decode(payload)
        if type(call) is not tuple or len(call) != 5 or call[0] not in ("new", "call") or type(call[3]) is not tuple:
            raise ch.ChannelError("a callback that is not (op, name, target, args, kwargs)")
        op, name, target, args, kwargs = call
        cls = type(target)
        if not self.test_class(cls) or self.classes.get(cls.__name__) is not cls:
            raise self.spoil("the program called back into something that is no class of the test's")
        if op == "new" and not self.constructible(cls) or op == "call" and name not in self.methods.get(cls, ()):
            raise self.spoil(f"the program ran {cls.__name__}.{name}, which it may not")
        self.calling_back = True
        try:
            function = cls.__init__ if op == "new" else getattr(cls, name)
            answer = self.encode(("ok", function(target, *args, **dict(kwargs))))
        except (Late, Spoiled):
            raise
        except BaseException as e:  # noqa: BLE001 (the test's code failed for the program: the test fails)
            what = "__init__" if op == "new" else name
            raise self.spoil(f"the test's {cls.__name__}.{what} raised when the program ran it: "
                             f"{type(e).__name__}: {str(e)[:100]}") from None  # fmt: skip
        finally:
            self.calling_back = False
        ch.send(self.fd_out, b"K", answer)


def _writable(cls: type, name: str) -> bool:
    """Whether the program may set attribute `name` of an instance of the test's `cls`: a name the class
    does not define, or one its __init__ assigns (not a method or property), a dataclass field or a slot."""
    defined = [vars(klass)[name] for klass in cls.__mro__[:-1] if name in vars(klass)]
    if not defined or name in getattr(cls, "__dataclass_fields__", {}) or name in cv.slots(cls):
        return True
    if callable(defined[0]) or hasattr(type(defined[0]), "__get__"):
        return False
    return any(name in klass.__init__.__code__.co_names for klass in cls.__mro__[:-1]
               if "__init__" in vars(klass) and getattr(klass.__init__, "__code__", None) is not None
               and klass.__init__.__code__.co_filename == "<test>")  # fmt: skip


def _rebuild(cls, args, text) -> BaseException:
    """What the program raised, as an exception of this side's (its class as the channel gave it), marked
    as the program's (a SystemExit of the program's is never the test's own ending)."""
    made = None
    if isinstance(cls, type) and issubclass(cls, BaseException):
        for attempt in (args, (text,)):
            try:
                made = cls(*attempt) if type(attempt) is tuple else cls()
                break
            except Exception:  # noqa: BLE001 (a constructor that wants other arguments)
                continue
    made = made if made is not None else RuntimeError(str(text)[:500])
    try:
        made.olmax_program = True
    except AttributeError:
        pass
    return made


def _empty_class(codec: Codec) -> type:
    """The class of the program's empty numpy arrays here: an operation with a non-empty operand (`x ==
    [1.0, 2.0]`, `np.allclose`, `x - 3.0`) or element-wise iteration (`.flat`, pytest.approx's) is refused,
    where numpy would make an empty result on which every comparison holds."""
    np = dt.numpy()

    class ndarray(np.ndarray):
        olmax_array = True

        def __repr__(self):  # numpy's own, not this subclass's name
            return repr(self.view(np.ndarray))

        def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
            if any(not isinstance(x, ndarray) and _size(np, x) for x in inputs):
                raise codec.refuse("an empty numpy array of the program's met a non-empty operand (numpy would "
                                   "make an empty result, on which every comparison holds)")  # fmt: skip
            plain = [x.view(np.ndarray) if isinstance(x, ndarray) else x for x in inputs]
            if "out" in kwargs:
                kwargs["out"] = tuple(x.view(np.ndarray) if isinstance(x, ndarray) else x for x in kwargs["out"])
            result = getattr(ufunc, method)(*plain, **kwargs)
            return result.view(ndarray) if isinstance(result, np.ndarray) and not result.size else result

        @property
        def flat(self):
            raise codec.refuse("an empty numpy array of the program's iterated element by element (pytest.approx "
                               "would find every one of its no elements close)")  # fmt: skip

    codec._empty = ndarray
    return ndarray


def _size(np, value) -> int:
    if isinstance(value, (np.ndarray, np.generic)):
        return value.size
    return len(value) if isinstance(value, (list, tuple)) else 1
