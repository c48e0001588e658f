"""What crosses the channel between a test's process and its program's: data, read within budgets.

The tests run in a process of their own (olmax.rewards.code_harness), the program in another
(olmax.rewards.code_program); every use of a program name from the tests is a request on the channel
between the two (olmax.rewards.code_channel), and the program's answer. Each is a message of JSON text
(`Codec.encode`, `Codec.decode`), read within budgets (code_channel.MESSAGE_BYTES, `ELEMENTS`, `DEPTH`,
code_channel.COLLISIONS, `DECODE_SECONDS`), so that no value a program sends can hold the tests' process
for long or make it hold much.

What crosses is data, rebuilt on the receiving side by that side's own classes, never code:

- None, bool, int, float, complex, str, bytes, range, slice, tuple, frozenset, Fraction, Decimal, the
  datetime types (fixed-offset time zones), numpy's arrays and scalars of numbers and booleans, dict views;
- mutable objects, shared by reference so that identity and mutation survive the crossing: list, dict, set,
  bytearray, Counter, OrderedDict, defaultdict (a factory named by module and name), deque, and instances of
  classes the TESTS define (their attributes; the program's side holds a stand-in of the class:
  code_program). Each such object has a number ("ref") for the whole test, the same on both sides; every
  message carries the current content of every shared object ("defs"), so that what the program mutated is
  written back into the tests' own objects after each call, and what the tests mutated is seen by the
  program at the next;
- namedtuples and Enum members by class name; an object either side can import by module and name
  ("g": `len`, `collections.Counter`, `math.sqrt`), which the receiving side resolves itself (the tests'
  side only within code_channel.PURE_MODULES and under the object's own name, else as a handle);
- anything else of the program's (its functions, classes, instances, generators) as a handle: a number
  the tests' side holds as a proxy (code_harness.Remote), whose use is a request.

A subclass of a builtin data type that is not one of the above crosses as its base type's content, read
through the base type's own methods (an IntEnum of the program's as its int): its own methods are not
called on the receiving side.

Standard library only: this module also runs inside the sandbox (olmax.rewards.code_sandbox).
"""

from __future__ import annotations

import binascii
import importlib
import json
import sys
import time

from olmax.rewards.code_channel import MESSAGE_BYTES, ChannelError, Unsendable, check_keys, importable

ELEMENTS = 1 << 22  # values in one message, nested ones included
DEPTH = 100  # nesting of immutable values (a shared object is a reference: a linked list of any length is flat)
DECODE_SECONDS = 2.0  # CPU-side bound on decoding one message
_BIG = 1 << 63  # ints past +-2^63 travel as hex: JSON readers differ past 2^53, Python's stops at 4300 digits
_CHECK_EVERY = 4096  # elements between checks of the decode deadline


def _b64(data) -> str:
    return binascii.b2a_base64(data, newline=False).decode("ascii")


def _unb64(text) -> bytes:
    if type(text) is not str:
        raise ChannelError("bytes that are not base64 text")
    try:
        return binascii.a2b_base64(text)
    except binascii.Error as e:
        raise ChannelError(f"bytes that are not base64: {e}") from None


def _ints(*values) -> None:
    if not all(type(v) is int for v in values):
        raise ChannelError("a field that is not an int")


def _numpy():
    return sys.modules.get("numpy")  # only where the sender or the program already imported it


_NUMPY_KINDS = frozenset("biufc")
_SCALAR_TYPES = (str, float, bool, type(None))


class Codec:
    """One side's view of the channel for one test: the shared objects (`refs`, by number; `ids`, by
    id() of this side's object), and the subclass's rules for what is not data (`other`, `instance_class`,
    `resolve_global`, `handle`). Refs this side makes are `parity` modulo 2 (the tests' side even, the
    program's odd), so that a message can never name one of the other side's that does not exist."""

    parity = 0

    def __init__(self):
        self.refs: dict[int, object] = {}
        self.ids: dict[int, int] = {}
        self._next = 2 + self.parity

    # --- encoding -------------------------------------------------------------------------------------

    def encode(self, value, limit: int = MESSAGE_BYTES) -> bytes:
        """`value` and the content of every shared object, as one message's JSON text. Unsendable where it
        cannot cross or is past the budgets."""
        self._pending: list = []
        self._defined: set = set()
        self._count = 0
        out = self._enc(value, 0)
        for ref, obj in list(self.refs.items()):  # every shared object, as it is now
            if ref not in self._defined:
                self._defined.add(ref)
                self._pending.append((obj, ref))
        defs = []
        while self._pending:
            obj, ref = self._pending.pop()
            defs.append(self._def(obj, ref))
        text = json.dumps([out, defs], separators=(",", ":"))
        if len(text) > limit:
            raise Unsendable(f"a message of {len(text)} bytes, past the bound of {limit}")
        return text.encode("ascii")

    def _counted(self, n: int = 1) -> None:
        self._count += n
        if self._count > ELEMENTS:
            raise Unsendable(f"a value of more than {ELEMENTS} elements")

    def share(self, obj) -> int:
        """The ref of `obj`, a new one if it has none; its content goes into the message being encoded."""
        ref = self.ids.get(id(obj))
        if ref is None or self.refs.get(ref) is not obj:
            ref = self._next
            self._next += 2
            self.ids[id(obj)] = ref
            self.refs[ref] = obj
        if ref not in self._defined:
            self._defined.add(ref)
            self._pending.append((obj, ref))
        return ref

    def _enc(self, value, depth: int):  # noqa: C901 (one case per type)
        self._counted()
        kind = type(value)
        if value is None or kind is bool or kind is str or kind is float:
            return value
        if kind is int:
            return value if -_BIG <= value < _BIG else ["i", hex(value)]
        if depth > DEPTH:
            raise Unsendable(f"a value nested past {DEPTH}")
        if kind in _SHARED:
            return ["@", self.share(value)]
        if kind is tuple:
            return ["t", *(self._enc(item, depth + 1) for item in value)]
        if kind is frozenset:
            return ["f", *(self._enc(item, depth + 1) for item in value)]
        if kind is complex:
            return ["c", value.real, value.imag]
        if kind is bytes:
            self._counted(len(value) >> 6)
            return ["b", _b64(value)]
        if kind is range or kind is slice:
            parts = (value.start, value.stop, value.step)
            return ["r" if kind is range else "sl", *(self._enc(part, depth + 1) for part in parts)]
        special = _special(value)
        if special is not None:
            return special(self, value, depth)
        return self.other(value, depth)

    def other(self, value, depth: int):
        """The encoding of a value that is no data type above (the sides' own rules)."""
        raise Unsendable(f"a {type(value).__name__} cannot cross to the program")

    def _def(self, obj, ref: int) -> list:
        kind = _SHARED.get(type(obj))
        if kind is None:
            return self.instance_def(obj, ref)
        if kind == "B":
            self._counted(len(obj) >> 6)
            return [ref, "B", _b64(obj)]
        if kind in ("d", "C", "O", "dd"):
            items = list(dict.items(obj))
            self._counted(2 * len(items))
            head = [ref, kind]
            if kind == "dd":  # a factory that is a class found by import (int, list, set); else none
                factory = obj.default_factory
                head.append(self._enc(factory, 0) if isinstance(factory, type) and importable(factory) else None)
            return head + [self._enc(part, 1) for pair in items for part in pair]
        self._counted(len(obj))  # before any copy of a list past the budget
        items = list(obj)
        head = [ref, kind] if kind != "Q" else [ref, kind, obj.maxlen]
        if all(type(item) in _SCALAR_TYPES or (type(item) is int and -_BIG <= item < _BIG) for item in items):
            return head + items  # the common case, a list of numbers or strings: as they are
        self._count -= len(items)
        return head + [self._enc(item, 1) for item in items]

    def instance_def(self, obj, ref: int) -> list:
        """The definition of a shared instance of a class of the tests' (the sides' own rules)."""
        raise Unsendable(f"a {type(obj).__name__} cannot cross")

    def attributes(self, obj, ref: int, name: str) -> list:
        """[ref, "I", class name, attribute, value, ...]: an instance's attributes (its __dict__, or its slots)."""
        fields = getattr(obj, "__dict__", None)
        pairs = list(fields.items()) if isinstance(fields, dict) else []
        for slot in _slots(type(obj)):
            if hasattr(obj, slot):
                pairs.append((slot, object.__getattribute__(obj, slot)))
        self._counted(2 * len(pairs))
        return [ref, "I", name, *(part for key, item in pairs for part in (key, self._enc(item, 1)))]

    # --- decoding -------------------------------------------------------------------------------------

    def decode(self, payload: bytes):
        """The value of a message (encode's), after writing every shared object's content into this side's
        object of that ref (made new for a ref this side has not seen). ChannelError for anything else."""
        if len(payload) > MESSAGE_BYTES:
            raise ChannelError(f"a message of {len(payload)} bytes, past the bound of {MESSAGE_BYTES}")
        self._deadline = time.process_time() + DECODE_SECONDS
        self._count = 0
        try:
            message = json.loads(payload)
        except (ValueError, RecursionError) as e:
            raise ChannelError(f"a message that is not JSON: {str(e)[:80]}") from None
        if type(message) is not list or len(message) != 2 or type(message[1]) is not list:
            raise ChannelError("a message that is not [value, definitions]")
        value, defs = message
        shells = []
        for entry in defs:  # every shared object first, so that references among them resolve
            if type(entry) is not list or len(entry) < 2 or type(entry[0]) is not int or type(entry[1]) is not str:
                raise ChannelError("a definition that is not [ref, kind, ...]")
            shells.append((self._shell(entry), entry))
        # content: instances and sequences first, then sets and dicts, whose keys may hash an instance's fields
        for last in (False, True):
            for obj, entry in shells:
                if (entry[1] in _KEYED) == last:
                    self._fill(obj, entry)
        return self._dec(value, 0)

    def _tick(self, n: int = 1) -> None:
        self._count += n
        if self._count > ELEMENTS:
            raise ChannelError(f"a message of more than {ELEMENTS} values")
        if self._count % _CHECK_EVERY < n and time.process_time() > self._deadline:
            raise ChannelError(f"a message that took more than {DECODE_SECONDS} s to read")

    def _shell(self, entry: list):
        ref, kind = entry[0], entry[1]
        known = self.refs.get(ref)
        if known is not None:
            same = (
                _SHARED.get(type(known)) == kind
                if kind != "I"
                else (_SHARED.get(type(known)) is None and len(entry) > 2 and type(known).__name__ == entry[2])
            )
            if not same:
                raise ChannelError(f"shared object {ref} changed its type")
            return known
        if ref % 2 == self.parity:
            raise ChannelError(f"a shared object {ref} this side never made")
        if kind == "I":
            if len(entry) < 3 or type(entry[2]) is not str:
                raise ChannelError("an instance without its class")
            obj = self.new_instance(entry[2])
        elif kind in _MAKERS:
            obj = _MAKERS[kind]()
        else:
            raise ChannelError(f"an unknown kind of shared object {kind[:8]!r}")
        self.refs[ref] = obj
        self.ids[id(obj)] = ref
        return obj

    def new_instance(self, name: str):
        """An instance, without content, of the class of the tests' called `name` (the sides' own rules)."""
        raise ChannelError(f"an instance of {name[:40]!r}, which this side does not know")

    def _fill(self, obj, entry: list) -> None:  # noqa: C901 (one case per kind)
        kind, rest = entry[1], entry[2:]
        self._tick(len(rest))
        if kind == "I":
            self.set_attributes(obj, rest[1:])
        elif kind == "B":
            obj[:] = _unb64(rest[0] if len(rest) == 1 else None)
        elif kind in ("l", "s", "Q"):
            if kind == "Q":
                if not rest or (rest[0] is not None and (type(rest[0]) is not int or rest[0] < 0)):
                    raise ChannelError("a deque without its maxlen")
                maxlen, rest = rest[0], rest[1:]
            if all(type(item) in _SCALAR_TYPES or type(item) is int for item in rest):
                items = rest  # the common case, numbers or strings as they are
            else:
                items = [self._dec(item, 1) for item in rest]
            if kind == "l":
                obj[:] = items
            elif kind == "s":
                check_keys(items)
                obj.clear()
                try:
                    obj.update(items)
                except TypeError as e:
                    raise ChannelError(f"a key that cannot be one: {e}") from None
            else:
                obj.__init__(items, maxlen)
        else:  # d, C, O, dd
            if kind == "dd":
                if not rest:
                    raise ChannelError("a defaultdict without its factory")
                factory, rest = self._dec(rest[0], 1), rest[1:]
                if factory is not None and not isinstance(factory, type):
                    raise ChannelError("a defaultdict whose factory is not a class")
                obj.default_factory = factory
            if len(rest) % 2:
                raise ChannelError("a dict with a key and no value")
            pairs = [self._dec(item, 1) for item in rest]
            keys = pairs[::2]
            check_keys(keys)
            try:
                if kind == "O":  # OrderedDict's own order, kept by its own methods
                    obj.clear()
                    obj.update(zip(keys, pairs[1::2]))
                else:  # (Counter.update would add counts)
                    dict.clear(obj)
                    dict.update(obj, zip(keys, pairs[1::2]))
            except TypeError as e:
                raise ChannelError(f"a dict key that cannot be one: {e}") from None

    def set_attributes(self, obj, pairs: list) -> None:
        """Write an instance's attributes from [name, value, ...] (the sides' own rules)."""
        raise ChannelError("instances do not cross here")

    def _dec(self, node, depth: int):  # noqa: C901 (one case per tag)
        self._tick()
        kind = type(node)
        if node is None or kind is bool or kind is int or kind is float or kind is str:
            return node
        if kind is not list or not node or type(node[0]) is not str:
            raise ChannelError(f"not a value: {str(node)[:60]}")
        if depth > DEPTH:
            raise ChannelError(f"a value nested past {DEPTH}")
        tag, rest = node[0], node[1:]
        if tag == "@":
            if len(rest) != 1 or type(rest[0]) is not int or rest[0] not in self.refs:
                raise ChannelError("a reference to no shared object")
            return self.refs[rest[0]]
        if tag == "t":
            return tuple(self._dec(item, depth + 1) for item in rest)
        if tag == "f":
            items = [self._dec(item, depth + 1) for item in rest]
            check_keys(items)
            try:
                return frozenset(items)
            except TypeError as e:
                raise ChannelError(f"a key that cannot be one: {e}") from None
        if tag == "i" and len(rest) == 1 and type(rest[0]) is str:
            self._tick(len(rest[0]) >> 6)
            try:
                return int(rest[0], 16)
            except ValueError:
                raise ChannelError("an int that is not hex") from None
        if tag == "c" and len(rest) == 2 and all(type(part) in (int, float) for part in rest):
            return complex(*rest)
        if tag == "b" and len(rest) == 1:
            self._tick(len(rest[0]) >> 6 if type(rest[0]) is str else 0)
            return _unb64(rest[0])
        if tag in ("r", "sl") and len(rest) == 3:
            parts = [self._dec(part, depth + 1) for part in rest]
            try:
                return range(*parts) if tag == "r" else slice(*parts)
            except (TypeError, ValueError) as e:
                raise ChannelError(f"not a range: {e}") from None
        if tag in _READERS:
            return _READERS[tag](self, rest, depth)
        return self.tagged(tag, rest, depth)

    def tagged(self, tag: str, rest: list, depth: int):
        """A value of a tag of the sides' own (handles, classes by name), or ChannelError."""
        raise ChannelError(f"an unknown tag {tag[:8]!r}")

    def dec(self, node, depth: int):
        """A nested value (for the sides' own tags)."""
        return self._dec(node, depth)


def _slots(cls) -> list:
    names = []
    for klass in getattr(cls, "__mro__", ())[:-1]:
        slots = klass.__dict__.get("__slots__", ())
        names += [slots] if isinstance(slots, str) else [s for s in slots if s not in ("__dict__", "__weakref__")]
    return names


# --- the standard library's data types -----------------------------------------------------------------


def _mutable_types() -> dict:
    import collections

    return {list: "l", dict: "d", set: "s", bytearray: "B", collections.Counter: "C",
            collections.OrderedDict: "O", collections.defaultdict: "dd", collections.deque: "Q"}  # fmt: skip


_SHARED = _mutable_types()
_KEYED = frozenset(("s", "d", "C", "O", "dd"))
_MAKERS = {kind: cls for cls, kind in _SHARED.items()}


def _special(value):
    """The encoder of a value of the standard library's (or numpy's) data types, or None."""
    kind = type(value)
    if kind in _VIEWS:
        return _write_view
    module = kind.__module__
    if module == "numpy":
        np = _numpy()
        return _write_numpy if np is not None and isinstance(value, (np.ndarray, np.generic)) else None
    if module in ("fractions", "decimal", "datetime"):
        return _WRITERS.get(kind.__qualname__)
    return None


def _write_fraction(codec, value, depth):
    return ["q", codec._enc(value.numerator, depth + 1), codec._enc(value.denominator, depth + 1)]


def _write_decimal(codec, value, depth):
    return ["D", str(value)]


def _offset(codec, tz, depth):
    if tz is None:
        return None
    import datetime

    if type(tz) is not datetime.timezone:
        raise Unsendable("a time zone other than a fixed offset")
    delta = tz.utcoffset(None)
    return ["tz", delta.days, delta.seconds, delta.microseconds, tz.tzname(None)]


def _write_datetime(codec, value, depth):
    kind = type(value).__name__
    if kind == "timedelta":
        return ["dt", kind, value.days, value.seconds, value.microseconds]
    if kind == "timezone":
        return ["dt", kind, _offset(codec, value, depth)]
    fields = {"date": ("year", "month", "day"), "time": ("hour", "minute", "second", "microsecond"),
              "datetime": ("year", "month", "day", "hour", "minute", "second", "microsecond")}[kind]  # fmt: skip
    tz = [] if kind == "date" else [_offset(codec, value.tzinfo, depth), value.fold]
    return ["dt", kind, *(getattr(value, name) for name in fields), *tz]


def _write_numpy(codec, value, depth):
    np = _numpy()
    if value.dtype.kind not in _NUMPY_KINDS or value.dtype.hasobject:
        raise Unsendable(f"a numpy value of dtype {value.dtype}")
    data = np.ascontiguousarray(value).tobytes()
    codec._counted(len(data) >> 6)
    if isinstance(value, np.ndarray):
        return ["N", value.dtype.str, list(value.shape), _b64(data)]
    return ["n", value.dtype.str, _b64(data)]


def _write_view(codec, value, depth):
    tag = _VIEWS[type(value)]
    items = list(value) if tag != "di" else [part for pair in value for part in pair]
    return [tag, *(codec._enc(item, depth + 1) for item in items)]


_WRITERS = {"Fraction": _write_fraction, "Decimal": _write_decimal, "date": _write_datetime,
            "time": _write_datetime, "datetime": _write_datetime, "timedelta": _write_datetime,
            "timezone": _write_datetime}  # fmt: skip
_VIEWS = {type({}.keys()): "dk", type({}.values()): "dv", type({}.items()): "di"}


def _read_fraction(codec, rest, depth):
    import fractions

    parts = [codec.dec(part, depth + 1) for part in rest]
    if len(parts) != 2 or any(type(part) is not int for part in parts) or parts[1] <= 0:
        raise ChannelError("not a Fraction")
    return fractions.Fraction(*parts)


def _read_decimal(codec, rest, depth):
    import decimal

    if len(rest) != 1 or type(rest[0]) is not str or len(rest[0]) > 10_000:
        raise ChannelError("not a Decimal")
    try:
        return decimal.Decimal(rest[0])
    except decimal.InvalidOperation:
        raise ChannelError("not a Decimal") from None


def _read_zone(node):
    import datetime

    if node is None:
        return None
    if type(node) is not list or len(node) != 5 or node[0] != "tz" or type(node[4]) not in (str, type(None)):
        raise ChannelError("not a time zone")
    _ints(*node[1:4])
    try:
        return datetime.timezone(datetime.timedelta(node[1], node[2], node[3]), node[4])
    except (ValueError, OverflowError) as e:
        raise ChannelError(f"not a time zone: {e}") from None


def _read_datetime(codec, rest, depth):
    import datetime

    if not rest or rest[0] not in ("date", "time", "datetime", "timedelta", "timezone"):
        raise ChannelError("not a datetime value")
    kind, fields = rest[0], rest[1:]
    try:
        if kind == "timezone":
            return _read_zone(fields[0] if len(fields) == 1 else [])
        if kind in ("date", "timedelta"):
            _ints(*fields)
            return getattr(datetime, kind)(*fields)
        *numbers, zone, fold = fields
        _ints(*numbers, fold)
        return getattr(datetime, kind)(*numbers, tzinfo=_read_zone(zone), fold=fold)
    except (TypeError, ValueError, OverflowError) as e:
        raise ChannelError(f"not a datetime value: {e}") from None


def _read_numpy(codec, rest, depth, array: bool):
    np = _numpy() or importlib.import_module("numpy")
    if len(rest) != (3 if array else 2) or type(rest[0]) is not str:
        raise ChannelError("not a numpy value")
    try:
        dtype = np.dtype(rest[0])
    except TypeError:
        raise ChannelError("not a numpy dtype") from None
    if dtype.kind not in _NUMPY_KINDS or dtype.hasobject or dtype.fields is not None:
        raise ChannelError(f"a numpy dtype {dtype} that does not cross")
    data = _unb64(rest[-1])
    codec._tick(len(data) >> 6)
    shape = rest[1] if array else []
    if type(shape) is not list or not all(type(n) is int and n >= 0 for n in shape):
        raise ChannelError("not a numpy shape")
    size = 1
    for n in shape:
        size *= n
    if size * dtype.itemsize != len(data):
        raise ChannelError("a numpy value whose bytes do not fit its shape")
    try:
        value = np.frombuffer(data, dtype=dtype).reshape(shape).copy()
    except ValueError as e:
        raise ChannelError(f"not a numpy value: {e}") from None
    return value if array else value[()]


def _read_view(tag: str):
    def read(codec, rest, depth):
        items = [codec.dec(item, depth + 1) for item in rest]
        if tag == "dv":
            return dict(enumerate(items)).values()
        keys = items if tag == "dk" else items[::2]
        if tag == "di" and len(items) % 2:
            raise ChannelError("dict items without a value")
        check_keys(keys)
        try:
            made = dict.fromkeys(keys) if tag == "dk" else dict(zip(keys, items[1::2]))
        except TypeError as e:
            raise ChannelError(f"a dict key that cannot be one: {e}") from None
        return made.keys() if tag == "dk" else made.items()

    return read


_READERS = {"q": _read_fraction, "D": _read_decimal, "dt": _read_datetime,
            "N": lambda codec, rest, depth: _read_numpy(codec, rest, depth, True),
            "n": lambda codec, rest, depth: _read_numpy(codec, rest, depth, False),
            **{tag: _read_view(tag) for tag in ("dk", "dv", "di")}}  # fmt: skip
