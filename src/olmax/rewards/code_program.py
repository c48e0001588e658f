"""The program's side of a code test: the program alone in a process, answering the tests' requests.

A process of this kind is forked for each test by the sandbox's runner (olmax.rewards.code_runner) from a
process that holds the program and nothing of any test, and is confined before it runs anything
(limits, upstream's guard, the system call filter). Then, for a `code` test (`serve`):

1. the program runs, as upstream runs it before each test (a fresh process per test: no test sees what
   another gave the program, and a program that fails to load fails every test);
2. of the names it defined, those the test uses go to the tests' process (code_harness), each as data,
   as an object either side imports by name, or as a handle (its functions, classes, instances);
3. it answers requests: call a handle, get or set an attribute or item, len, iter, next (items of a
   generator in batches, when the tests ask for many in a row: `next_items`), `in`, str, repr, format.
   Arguments arrive as data (olmax.rewards.code_values): builtin values, shared containers and numpy
   arrays, and instances of the tests' classes, which here are stand-ins (`Codec.stand_in`) holding their
   attributes; constructing one runs here from its description where its constructor only stores its
   arguments (`construct`), else, like calling one of its methods, is a request back to the tests'
   process, where the tests' own class runs, only for what that process lets run (code_remote). Each
   answer carries the result (data, or a handle), and the content of the shared objects that changed,
   which the tests' side writes back into its own objects; one past the channel's bounds is refused.

The description of a constructor (its parameters, plain defaults and which attribute each goes to) is
all of the tests' code that reaches this process: nothing else of it, nor their expected values or
another test's inputs; what it answers is data that the tests' process judges. For a `code_stdio` test
(`run_stdio`), the program runs with the test's input as its descriptor 0 (a file the tests' process
wrote) and a file as its descriptor 1, which the tests' process reads after it ended, however it ended
(an exit, os._exit, a crash, the time limit).

Standard library only (this module runs inside the sandbox).
"""

from __future__ import annotations

import builtins
import io
import json
import sys

from olmax.rewards import code_channel as ch
from olmax.rewards import code_values as cv

SMALL = 10_000  # elements of a program's global sent as data (a larger one is a handle)
PRINTED_PIECE = 1 << 20  # bytes of what the program printed in one message
BATCH = 128  # items of a generator's the tests' process may ask for at once (code_remote asks for more in a run)
_EXCEPTION_BASES = frozenset(name for name, value in vars(builtins).items()
                             if isinstance(value, type) and issubclass(value, BaseException))  # fmt: skip
_BUILTIN_BASES = (bool, int, float, complex, str, bytes, bytearray, tuple, frozenset, list, dict, set)


class Codec(cv.Codec):
    """The program's side: its non-data objects become handles; the tests' classes are stand-ins here."""

    parity = 1

    def __init__(self, namespace: dict, fd_in: int, fd_out: int):
        super().__init__()
        self.namespace, self.fd_in, self.fd_out = namespace, fd_in, fd_out
        self.handles: dict[int, object] = {}
        self.handle_ids: dict[int, int] = {}
        self.stand_ins: dict[str, type] = {}  # the tests' classes, by name
        self.enums: dict[str, type] = {}  # the tests' Enums, by name
        self.tuples: dict[tuple, type] = {}  # namedtuple stand-ins, by (name, fields)
        self.deferred: dict[int, BaseException] = {}  # what an iterator raised after the items of a batch
        self.printed: io.BytesIO | None = None  # what the program printed since the last answer, where kept

    def handle(self, obj) -> int:
        number = self.handle_ids.get(id(obj))
        if number is None or self.handles[number] is not obj:
            number = len(self.handles) + 1
            self.handles[number] = obj
            self.handle_ids[id(obj)] = number
        return number

    def other(self, value, depth: int):  # noqa: C901 (one case per kind of object)
        kind = type(value)
        if kind is _Handle:
            return ["H", self.handle(value.value), type(value.value).__name__[:100], protocol(value.value)]
        if self.enums.get(kind.__name__) is kind:  # a member of the tests' Enum
            return ["e", kind.__name__, value.name]
        if self.stand_ins.get(kind.__name__) is kind:
            return ["@", self.share(value)]
        if isinstance(value, tuple) and isinstance(getattr(kind, "_fields", None), tuple):
            return ["nt", kind.__name__, list(kind._fields), *(self._enc(item, depth + 1) for item in value)]
        if isinstance(value, type) and issubclass(value, BaseException):
            return self.exception_class(value)
        for base in _BUILTIN_BASES:  # a subclass of a data type: its base type's content, by its base's methods
            if isinstance(value, base) and kind is not base:
                return self._enc(_content(value, base), depth)
        found = ch.importable(value)
        if found is not None:
            return ["g", *found, self.handle(value)]
        return ["H", self.handle(value), str(getattr(kind, "__qualname__", "object"))[:100], protocol(value)]

    def exception_class(self, cls: type) -> list:
        found = ch.importable(cls) or ("", "")
        bases = [c.__name__ for c in cls.__mro__ if c.__module__ == "builtins" and c.__name__ in _EXCEPTION_BASES]
        return ["x", self.handle(cls), cls.__name__[:100], *found, bases]

    def instance_def(self, obj, ref: int) -> list:
        return self.attributes(obj, ref, type(obj).__name__)

    def new_instance(self, name: str):
        return object.__new__(self.stand_in(name))

    def set_attributes(self, obj, pairs: list) -> None:
        if len(pairs) % 2:
            raise ch.ChannelError("an attribute without a value")
        fields = {}
        for name, node in zip(pairs[::2], pairs[1::2]):
            if type(name) is not str or not name.isidentifier() or name.startswith("__"):
                raise ch.ChannelError("an attribute that is not a plain name")
            fields[name] = self.dec(node, 1)
        obj.__dict__.clear()
        obj.__dict__.update(fields)

    def tagged(self, tag: str, rest: list, depth: int):
        if tag == "H" and len(rest) == 1 and rest[0] in self.handles:
            return self.handles[rest[0]]
        if tag == "g" and len(rest) >= 2 and type(rest[0]) is str and type(rest[1]) is str:
            return ch.resolve(rest[0], rest[1])
        if tag == "nt" and len(rest) >= 2 and type(rest[1]) is list:
            return self.named_tuple(rest[0], rest[1])._make(self.dec(item, depth + 1) for item in rest[2:])
        if tag == "e" and len(rest) == 2 and rest[0] in self.enums:
            try:
                return self.enums[rest[0]][rest[1]]
            except (KeyError, TypeError):
                raise ch.ChannelError(f"no member {str(rest[1])[:40]} of {rest[0]}") from None
        raise ch.ChannelError(f"an unknown value {tag[:8]!r}")

    # --- the tests' classes, here ----------------------------------------------------------------------

    def named_tuple(self, name, fields) -> type:
        if type(name) is not str or not all(type(f) is str and f.isidentifier() for f in fields):
            raise ch.ChannelError("a namedtuple whose name or fields are not names")
        key = (name, tuple(fields))
        if key not in self.tuples:
            import collections

            self.tuples[key] = collections.namedtuple(name, fields)
        return self.tuples[key]

    def stand_in(self, name: str) -> type:
        """The class standing in for the tests' class `name`, one per name (`complete` makes it what the
        tests' process announced): its instances hold attributes."""
        if not name.isidentifier():
            raise ch.ChannelError("a class whose name is not a name")
        codec = self
        if name not in self.stand_ins:

            def __init__(self, *args, **kwargs):
                if not type(self).olmax_constructible:
                    raise TypeError(f"the test's class {name} is not one the program may construct")
                if type(self).olmax_recipe is not None:
                    construct(self, type(self).olmax_recipe, args, kwargs)
                else:
                    codec.callback("new", name, self, args, kwargs)

            body = {"__init__": __init__, "__module__": "__main__", "__qualname__": name, "olmax_constructible": True,
                    "olmax_recipe": None}  # fmt: skip
            self.stand_ins[name] = type(name, (), body)
        return self.stand_ins[name]

    def complete(self, name: str, methods: tuple, fields: tuple | None, frozen: bool, constructible: bool,
                 recipe: dict | None) -> type:  # fmt: skip
        """The stand-in of `name` as announced: constructing one runs the tests' __init__ in their process, as
        calling one of `methods` runs that method there (`callback`), where the tests' process lets the
        program do so (code_remote: constructors and accessors that only store and read what they are
        given), or here from its `recipe` (a constructor that only stores its arguments: `construct`);
        constructing one of another class is a TypeError here. A dataclass's stand-in compares (and,
        frozen, hashes) by its `fields`."""
        made = self.stand_in(name)
        codec = self
        made.olmax_constructible, made.olmax_recipe = constructible, recipe
        for method in methods:
            if type(method) is str and method.isidentifier():
                setattr(made, method, _method(codec, method))
        if fields is not None:
            made.__eq__ = lambda a, b: type(a) is type(b) and all(
                getattr(a, f, None) == getattr(b, f, None) for f in fields)  # fmt: skip
            made.__hash__ = (lambda a: hash(tuple(getattr(a, f, None) for f in fields))) if frozen else None
        return made

    def announce(self, entries) -> None:
        """The tests' classes their process announced (code_harness `Codec.announce`): each made here and
        bound among the program's globals, where the tests' definition would have replaced the program's."""
        for entry in entries:
            if type(entry) is not tuple or len(entry) < 3 or type(entry[1]) is not str:
                raise ch.ChannelError("an announcement that is not (kind, name, ...)")
            kind, name = entry[0], entry[1]
            if kind == "class" and len(entry) == 7 and type(entry[6]) is str:
                made = self.complete(name, entry[2], entry[3], bool(entry[4]), bool(entry[5]), json.loads(entry[6]))
            elif kind == "namedtuple":
                made = self.named_tuple(name, list(entry[2]))
            elif kind == "enum" and len(entry) == 4 and entry[2] in ("Enum", "IntEnum", "StrEnum", "Flag", "IntFlag"):
                import enum

                made = self.enums[name] = getattr(enum, entry[2])(name, list(entry[3]))
            else:
                raise ch.ChannelError(f"an unknown announcement {str(kind)[:20]}")
            self.namespace[name] = made

    def callback(self, op: str, name: str, target, args: tuple, kwargs: dict):
        """Ask the tests' process to run its class's __init__ (op "new") or method `name` on the stand-in
        `target`: returns what it returned. (The tests' process answers nothing else: test code run for the
        program may not ask the program anything, and what it raises fails the test there.)"""
        ch.send(self.fd_out, b"C", self.encode((op, name, target, args, tuple(kwargs.items()))))
        kind, payload = ch.receive(self.fd_in)
        value = self.decode(payload) if kind == b"K" else None
        if type(value) is not tuple or len(value) != 2 or value[0] != "ok":
            raise ch.ChannelError("the tests' process did not run the call")
        return value[1]

    # --- requests ----------------------------------------------------------------------------------------

    def answer(self, payload: bytes) -> None:
        """One request: (op, target, operands...) -> ("ok", result) or ("raise", class, args, text), with the
        shared objects' content (code_values); ("refused", why) where the result or the objects the program
        changed are past the channel's bounds, or the request could not be read."""
        try:
            request = self.decode(payload)
            if type(request) is not tuple or len(request) < 2 or request[0] not in _OPS:
                raise ch.ChannelError("a request that is not (op, target, ...)")
        except ch.ChannelError as e:
            ch.send(self.fd_out, b"A", self.encode(("refused", f"the program's side could not read a request: {e}")))
            return
        op, target, operands = request[0], request[1], request[2:]
        try:
            result = self.next_items(target, *operands) if op == "next" else _OPS[op](target, *operands)
            message = self.encode(("ok", result))
        except ch.Unsendable as e:
            message = self.encode(("refused", f"the program's answer is past the channel's bounds: {e}"))
        except BaseException as e:  # noqa: BLE001 (what the program raised, for the tests to see)
            try:
                message = self.raised(e)
            except ch.Unsendable as e:  # the objects the program changed are past the bounds
                message = self.encode(("refused", f"the program's answer is past the channel's bounds: {e}"))
        self.forward_printed()
        ch.send(self.fd_out, b"A", message)

    def capture(self) -> None:
        """Keep what the program prints from now on, for the tests' process (`forward_printed`)."""
        self.printed = io.BytesIO()
        sys.stdout = io.TextIOWrapper(self.printed, encoding="utf-8", write_through=True)

    def forward_printed(self) -> None:
        """What the program printed during a request, ahead of its answer, for a test that may capture stdout
        (code_tests `prints`: `contextlib.redirect_stdout`); in pieces the channel carries."""
        if self.printed is None or not self.printed.tell():
            return
        data = self.printed.getvalue()
        self.printed.seek(0)
        self.printed.truncate()
        for start in range(0, len(data), PRINTED_PIECE):
            ch.send(self.fd_out, b"O", data[start : start + PRINTED_PIECE])

    def next_items(self, iterator, count: int = 1) -> tuple:
        """Up to `count` items of the program's `iterator` (at least one): what it raised after some items is
        raised at the next request for it, so that the tests see the items first, then the error. A batch
        ends at an item that is not plain data (a list it may yield again, changed, as the next item)."""
        error = self.deferred.pop(id(iterator), None)
        if error is not None:
            raise error
        items: list = []
        limit = min(count, BATCH) if type(count) is int and count > 0 else 1
        while len(items) < limit:
            try:
                items.append(next(iterator))
            except BaseException as e:  # noqa: BLE001 (StopIteration, or what the program raised)
                if not items:
                    raise
                self.deferred[id(iterator)] = e
                break
            if not _plain(items[-1]):
                break
        return tuple(items)

    def raised(self, error: BaseException) -> bytes:
        text = _text(error)
        try:
            return self.encode(("raise", type(error), tuple(error.args), text))
        except ch.Unsendable:
            return self.encode(("raise", type(error), (), text))


class _Handle:
    """A value that crosses as a handle whatever it is (a program's large global)."""

    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value


def _method(codec: Codec, name: str):
    def method(self, *args, **kwargs):
        return codec.callback("call", name, self, args, kwargs)

    method.__name__ = method.__qualname__ = name
    return method


def construct(obj, recipe: dict, args: tuple, kwargs: dict) -> None:
    """Set the attributes of a new stand-in `obj` as the tests' constructor described by `recipe` would
    (code_tests `_recipe`), from the program's arguments: TypeError for arguments that do not fit it, as
    Python's own binding says."""
    params, values = recipe["params"], {}
    positional = [p for p in params if not p[3]]
    if len(args) > len(positional):
        raise TypeError(f"__init__() takes {len(positional) + 1} positional arguments but {len(args) + 1} were given")
    values.update((p[0], value) for p, value in zip(positional, args))
    for key, value in kwargs.items():
        if key in values or key not in {p[0] for p in params}:
            raise TypeError(f"__init__() got {'multiple values for' if key in values else 'an unexpected'} "
                            f"argument {key!r}")  # fmt: skip
        values[key] = value
    for name, has_default, default, _ in params:
        if name not in values:
            if not has_default:
                raise TypeError(f"__init__() missing a required argument: {name!r}")
            values[name] = _value(default, values)
    for attribute, node in recipe["set"]:
        setattr(obj, attribute, _value(node, values))


def _value(node: list, values: dict):
    kind = node[0]
    if kind == "p":
        return values[node[1]]
    if kind == "c":
        return node[1]
    if kind == "e":
        return {"list": list, "dict": dict, "set": set}[node[1]]()
    return _value(node[3] if (values[node[1]] is None) == node[2] else node[4], values)


def _content(value, base: type):
    """A subclass instance's content as its base type, read through the base type's own methods."""
    if base in (list, tuple, set, frozenset):
        return base(base.__iter__(value))
    if base is dict:
        return dict(dict.items(value))
    if base is bytearray:
        return bytearray(bytes(memoryview(value)))
    return {bool: bool, int: int.__index__, float: float.__float__, complex: complex.__complex__,
            str: str.__str__, bytes: bytes}[base](value)  # fmt: skip


def _text(error: BaseException) -> str:
    try:
        return f"{type(error).__name__}: {str(error)[:500]}"
    except Exception:  # a program's __str__ that fails
        return type(error).__name__


def _call(target, args: tuple = (), kwargs: tuple = ()):
    return target(*args, **dict(kwargs))


_OPS = {
    "call": _call,
    "getattr": getattr,
    "setattr": setattr,
    "delattr": delattr,
    "getitem": lambda target, key: target[key],
    "setitem": lambda target, key, value: target.__setitem__(key, value),
    "delitem": lambda target, key: target.__delitem__(key),
    "len": len,
    "iter": iter,
    "next": next,  # (several items at once: Codec.next_items)
    "contains": lambda target, item: item in target,
    "isinstance": lambda cls, obj: isinstance(obj, cls),
    "issubclass": lambda cls, sub: issubclass(sub, cls),
    "str": str,
    "repr": repr,
    "format": format,
}


def _plain(value) -> bool:
    """An item of data no later item can change: a number, a string, bytes, None, or a tuple of those."""
    kind = type(value)
    return kind in _PLAIN_TYPES or kind is tuple and all(type(item) in _PLAIN_TYPES for item in value)


_PLAIN_TYPES = frozenset((int, float, complex, str, bytes, bool, type(None)))


def _small(value, budget: list) -> bool:
    """Whether `value` is at most budget[0] elements (spent; text and bytes count one per 64), looking into
    builtin containers only."""
    budget[0] -= 1 + (len(value) >> 6 if type(value) in (str, bytes, bytearray) else 0)
    if budget[0] < 0:
        return False
    if type(value) in (list, tuple, set, frozenset):
        return all(_small(item, budget) for item in value)
    if isinstance(value, dict):
        return all(_small(k, budget) and _small(v, budget) for k, v in dict.items(value))
    return True


# the methods a handle of the tests' side has where the program's object has them (code_remote PROTOCOL, in order),
# and whether it is unhashable (the bit after them)
_PROTOCOL = ("__call__", "__getitem__", "__setitem__", "__delitem__", "__len__", "__iter__", "__next__", "__contains__")


def protocol(obj) -> int:
    kind = type(obj)
    flags = sum(1 << bit for bit, name in enumerate(_PROTOCOL) if getattr(kind, name, None) is not None)
    return flags | (1 << len(_PROTOCOL) if getattr(kind, "__hash__", None) is None else 0)


def load(program: str, namespace: dict) -> BaseException | None:
    """Run the program in `namespace`: None, or what it raised."""
    try:
        exec(compile(program, "<program>", "exec", dont_inherit=True), namespace)
    except BaseException as e:  # noqa: BLE001 (SystemExit and the rest: the program failed to load)
        return e
    return None


def serve(program: str, fd_in: int, fd_out: int) -> None:
    """A `code` test's program side (module docstring): the names of the tests' classes, bound as stand-ins,
    and the names the test uses that it does not bind ("P"); load; report those of the latter the program
    defined ("N"), or the failure ("L"); then answer requests until the tests' process closes the channel."""
    namespace = {"__name__": "__main__", "__builtins__": builtins}
    codec = Codec(namespace, fd_in, fd_out)
    kind, payload = ch.receive(fd_in, 1 << 20)
    try:
        wanted = json.loads(payload) if kind == b"P" else {}
    except ValueError:
        wanted = {}
    for name in wanted.get("classes", ()):
        if type(name) is str and name.isidentifier():
            namespace[name] = codec.stand_in(name)
    failed = load(program, namespace)
    if failed is not None:
        ch.send(fd_out, b"L", _text(failed).encode("utf-8", "replace")[:1000])
        return
    names = [(name, namespace[name]) for name in wanted.get("names", ()) if type(name) is str and name in namespace]
    # a global that is data crosses as data (shared, if mutable) where it is small; else as a handle
    names = [(name, value if _small(value, [SMALL]) else _Handle(value)) for name, value in names]
    try:
        report = codec.encode(tuple(names))
    except ch.Unsendable as e:  # tens of thousands of small globals
        ch.send(fd_out, b"L", f"its globals are past the channel's bounds: {e}".encode()[:1000])
        return
    if wanted.get("stdout") is True:  # after the load: what it prints then, upstream's tests did not capture
        codec.capture()
    ch.send(fd_out, b"N", report)
    while True:
        try:
            kind, payload = ch.receive(fd_in)
        except ch.Closed:
            return
        if kind == b"c":
            codec.announce(codec.decode(payload))
        elif kind == b"R":
            codec.answer(payload)
        else:
            return


def run_stdio(program: str) -> int:
    """A `code_stdio` test's program: the program with descriptors 0 and 1 as the runner set them (the
    test's input, a file; an empty file for its output), as a script reading sys.stdin (or open(0), or
    sys.stdin.buffer) and printing. Returns the exit status: 0 when it ended, or exited with 0 or None
    (its output flushed then too), else 1."""
    sys.stdin = io.TextIOWrapper(io.BufferedReader(io.FileIO(0, "r", closefd=False)), encoding="utf-8")
    sys.stdout = io.TextIOWrapper(io.BufferedWriter(io.FileIO(1, "w", closefd=False)), encoding="utf-8")
    raised = load(program, {"__name__": "__main__", "__builtins__": builtins})
    status = 0 if raised is None or isinstance(raised, SystemExit) and raised.code in (None, 0) else 1
    try:
        sys.stdout.flush()
    except BaseException:  # noqa: BLE001 (a program that closed or replaced its stdout)
        pass
    return status
