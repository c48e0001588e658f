"""What crosses the channel between a test's process and its program's: data, read within budgets.

The tests run in a process of their own (olmax.rewards.code_harness), the program in another
(olmax.rewards.code_program); every use of a program name from the tests is a request on the channel
between the two (olmax.rewards.code_channel), and the program's answer. Each is a message of JSON text
(`Codec.encode`, `Codec.decode`), read within budgets (code_channel.MESSAGE_BYTES, `ELEMENTS`, `DEPTH`,
code_channel.COLLISIONS, `DECODE_SECONDS`), so that no value a program sends can hold the tests' process
for long or make it hold much.

What crosses is data, rebuilt on the receiving side by that side's own classes, never code:

- None, bool, int, float, complex, str, bytes, range, slice, tuple, frozenset, and the standard library's
  and numpy's data types (olmax.rewards.code_datatypes: Fraction, Decimal, datetime, dict views, numpy's
  scalars);
- mutable objects, shared by reference so that identity and mutation survive the crossing: list, dict, set,
  bytearray, Counter, OrderedDict, defaultdict (a factory named by module and name), deque, numpy arrays,
  and instances of classes the TESTS define (their attributes; the program's side holds a stand-in of the
  class: code_program). Each such object has a number ("ref"), the same on both sides. A message carries
  the content ("defs") of each shared object it reaches that has not crossed before, and of each that
  changed since it last crossed (`_unchanged`: its items, compared by identity with those it had then), so
  that what the program mutated is written back into the tests' own objects after each call and what the
  tests mutated is seen by the program at the next, while an object that did not change costs a
  comparison, not a resend. A shared object a side made that only its codec still holds (that side's code
  dropped it) is forgotten, and the message tells the other side ("dropped"), so that neither holds or
  compares what no one can use (`_scan`);
- namedtuples and Enum members by class name; an object either side can import by module and name
  ("g": `len`, `collections.Counter`, `math.sqrt`), which the receiving side resolves itself (the tests'
  side only within code_channel.PURE_MODULES and under the object's own name, else as a handle);
- anything else of the program's (its functions, classes, instances, generators) as a handle: a number
  the tests' side holds as a proxy (code_handles.Remote), whose use is a request.

A subclass of a builtin data type that is not one of the above crosses as its base type's content, read
through the base type's own methods (an IntEnum of the program's as its int): its own methods are not
called on the receiving side.

Standard library only: this module also runs inside the sandbox (olmax.rewards.code_sandbox).
"""

from __future__ import annotations

import json
import sys
import time
from operator import is_

from olmax.rewards import code_datatypes as dt
from olmax.rewards.code_channel import MESSAGE_BYTES, ChannelError, Unsendable, check_keys, importable

ELEMENTS = 1 << 22  # values in one message, nested ones included
DEPTH = 100  # nesting of immutable values (a shared object is a reference: a linked list of any length is flat)
DECODE_SECONDS = 2.0  # CPU-side bound on decoding one message
_BIG = 1 << 63  # ints past +-2^63 travel as hex: JSON readers differ past 2^53, Python's stops at 4300 digits
_CHECK_EVERY = 4096  # elements between checks of the decode deadline
_SCALAR_TYPES = (str, float, bool, type(None))


class Codec:
    """One side's view of the channel for one test: the shared objects (`refs`, by number; `ids`, by id() of
    this side's object; `seen`, what each held when it last crossed), and the subclass's rules for what is
    not data (`other`, `instance_def`, `new_instance`, `set_attributes`, `tagged`). Refs this side makes are
    `parity` modulo 2 (the tests' side even, the program's odd), so that a message can never name one of the
    other side's that does not exist."""

    parity = 0

    def __init__(self):
        self.refs: dict[int, object] = {}
        self.ids: dict[int, int] = {}
        self.seen: dict[int, tuple] = {}
        self._next = 2 + self.parity

    # --- encoding -------------------------------------------------------------------------------------

    def encode(self, value, limit: int = MESSAGE_BYTES) -> bytes:
        """`value`, the content of the shared objects new to the other side or changed since they last
        crossed, and the refs this side dropped, as one message's JSON text. Unsendable where it cannot cross
        or is past the budgets (then nothing of it counts as crossed)."""
        self._pending: list = []
        self._defined: set = set()
        self._made: list = []
        self._snaps: dict = {}
        self._count = 0
        dropped, changed = _scan(self.refs, self.seen, self.parity)
        try:
            self._defined.update(changed)
            self._pending += [(self.refs[ref], ref) for ref in changed]
            out = self._enc(value, 0)
            defs = []
            while self._pending:
                obj, ref = self._pending.pop()
                defs.append(self._def(obj, ref))
            text = json.dumps([out, defs, dropped], separators=(",", ":"))
            if len(text) > limit:
                raise Unsendable(f"a message of {len(text)} bytes, past the bound of {limit}")
        except BaseException:
            self._forget(self._made)
            raise
        self.seen.update(self._snaps)
        self._forget(dropped)
        return text.encode("ascii")

    def _forget(self, refs) -> None:
        for ref in refs:
            obj = self.refs.pop(ref, None)
            if self.ids.get(id(obj)) == ref:
                del self.ids[id(obj)]
            self.seen.pop(ref, None)

    def _counted(self, n: int = 1) -> None:
        self._count += n
        if self._count > ELEMENTS:
            raise Unsendable(f"a value of more than {ELEMENTS} elements")

    def share(self, obj) -> int:
        """The ref of `obj`, a new one if it has none (its content then goes into the message being encoded)."""
        ref = self.ids.get(id(obj))
        if ref is None or self.refs.get(ref) is not obj:
            ref = self._next
            self._next += 2
            self.ids[id(obj)] = ref
            self.refs[ref] = obj
            self._made.append(ref)
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
            return ["b", dt.b64(value)]
        if kind is range or kind is slice:
            parts = (value.start, value.stop, value.step)
            return ["r" if kind is range else "sl", *(self._enc(part, depth + 1) for part in parts)]
        if dt.is_array(value):
            return ["@", self.share(value)]
        write = dt.writer(value)
        if write is not None:
            return write(self, value, depth)
        return self.other(value, depth)

    def other(self, value, depth: int):
        """The encoding of a value that is no data type above (the sides' own rules)."""
        raise Unsendable(f"a {type(value).__name__} cannot cross to the program")

    def _def(self, obj, ref: int) -> list:
        kind = _kind(obj)
        self._snaps[ref] = _snapshot(kind, obj)
        if kind == "I":
            return self.instance_def(obj, ref)
        if kind == "N":
            return [ref, kind, *dt.array_content(self, obj)]
        if kind == "B":
            self._counted(len(obj) >> 6)
            return [ref, "B", dt.b64(obj)]
        if kind in _KEYED_DICTS:
            items = list(_items(kind, obj))
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
        pairs = _pairs(obj)
        self._counted(2 * len(pairs))
        return [ref, "I", name, *(part for key, item in pairs for part in (key, self._enc(item, 1)))]

    # --- decoding -------------------------------------------------------------------------------------

    def decode(self, payload: bytes):
        """The value of a message (encode's), after forgetting the refs the other side dropped and writing
        each shared object's content into this side's object of that ref (made new for a ref this side has
        not seen). ChannelError for anything else."""
        if len(payload) > MESSAGE_BYTES:
            raise ChannelError(f"a message of {len(payload)} bytes, past the bound of {MESSAGE_BYTES}")
        self._deadline = time.process_time() + DECODE_SECONDS
        self._count = 0
        try:
            message = json.loads(payload)
        except (ValueError, RecursionError) as e:
            raise ChannelError(f"a message that is not JSON: {str(e)[:80]}") from None
        if type(message) is not list or len(message) != 3 or type(message[1]) is not list:
            raise ChannelError("a message that is not [value, definitions, dropped]")
        value, defs, dropped = message
        if type(dropped) is not list or not all(type(ref) is int and ref % 2 != self.parity for ref in dropped):
            raise ChannelError("dropped refs that are not numbers the other side made")
        self._forget(dropped)
        shells, self._fresh = [], set()
        for entry in defs:  # every shared object first, so that references among them resolve
            if type(entry) is not list or len(entry) < 2 or type(entry[0]) is not int or type(entry[1]) is not str:
                raise ChannelError("a definition that is not [ref, kind, ...]")
            shells.append((self._shell(entry), entry))
        # content: instances and sequences first, then sets and dicts, whose keys may hash an instance's fields
        for last in (False, True):
            for obj, entry in shells:
                if (entry[1] in _KEYED) == last:
                    self._fill(obj, entry)
        for obj, entry in shells:
            self.seen[entry[0]] = _snapshot(entry[1], obj)
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
            same = _kind(known) == kind and (kind != "I" or (len(entry) > 2 and type(known).__name__ == entry[2]))
            if not same:
                raise ChannelError(f"shared object {ref} changed its type")
            return known
        if ref % 2 == self.parity:
            raise ChannelError(f"a shared object {ref} this side never made")
        if kind == "I":
            if len(entry) < 3 or type(entry[2]) is not str:
                raise ChannelError("an instance without its class")
            obj = self.new_instance(entry[2])
        elif kind == "N":
            obj = self.new_array(dt.new_array(self, entry[2:]))
            self._fresh.add(ref)
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

    def new_array(self, array):
        """A numpy array the other side made, as this side holds it (the sides' own rules)."""
        return array

    def _fill(self, obj, entry: list) -> None:  # noqa: C901 (one case per kind)
        kind, rest = entry[1], entry[2:]
        self._tick(len(rest))
        if kind == "I":
            self.set_attributes(obj, rest[1:])
        elif kind == "N":
            if entry[0] not in self._fresh:
                dt.fill_array(self, obj, rest)
        elif kind == "B":
            obj[:] = dt.unb64(rest[0] if len(rest) == 1 else None)
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
            return dt.unb64(rest[0])
        if tag in ("r", "sl") and len(rest) == 3:
            parts = [self._dec(part, depth + 1) for part in rest]
            try:
                return range(*parts) if tag == "r" else slice(*parts)
            except (TypeError, ValueError) as e:
                raise ChannelError(f"not a range: {e}") from None
        if tag in dt.READERS:
            return dt.READERS[tag](self, rest, depth)
        return self.tagged(tag, rest, depth)

    def tagged(self, tag: str, rest: list, depth: int):
        """A value of a tag of the sides' own (handles, classes by name), or ChannelError."""
        raise ChannelError(f"an unknown tag {tag[:8]!r}")

    def dec(self, node, depth: int):
        """A nested value (for the sides' own tags)."""
        return self._dec(node, depth)


_SLOTS: dict = {}  # class -> its slot names (a test's classes, and the program side's stand-ins)


def slots(cls) -> tuple:
    """The slot names of `cls` and its bases."""
    names = _SLOTS.get(cls)
    if names is None:
        names = []
        for klass in getattr(cls, "__mro__", ())[:-1]:
            found = klass.__dict__.get("__slots__", ())
            names += [found] if isinstance(found, str) else [s for s in found if s not in ("__dict__", "__weakref__")]
        names = _SLOTS[cls] = tuple(names)
    return names


def _pairs(obj) -> list:
    """An instance's attributes as (name, value) pairs: its __dict__'s, then its slots' that are set."""
    fields = getattr(obj, "__dict__", None)
    pairs = list(fields.items()) if isinstance(fields, dict) else []
    for slot in slots(type(obj)):
        if hasattr(obj, slot):
            pairs.append((slot, object.__getattribute__(obj, slot)))
    return pairs


def _scan(refs: dict, seen: dict, parity: int) -> tuple[list, list]:
    """(the refs this side made whose objects only the codec holds now: its side's code dropped them; the
    refs whose content changed since they last crossed). One pass: it runs for every message. (A side drops
    only what it made: an object the other side made is dropped by that side, when no one there holds it,
    so that a test's list passed at every call, which the program does not keep, is not sent again each time.)"""
    dropped, changed = [], []
    for ref, obj in list(refs.items()):
        if ref % 2 == parity and sys.getrefcount(obj) <= _ALONE:
            dropped.append(ref)
        else:
            snap = seen.get(ref)
            if snap is None or not _unchanged(obj, snap):
                changed.append(ref)
    return dropped, changed


def _alone() -> int:
    """sys.getrefcount of an object only a dict holds, read as `_scan` reads it."""
    refs = {0: []}
    for _ref, obj in list(refs.items()):
        return sys.getrefcount(obj)


_ALONE = _alone()


# --- shared objects: their kinds, and what each held when it last crossed ---------------------------------


def _mutable_types() -> dict:
    import collections

    return {list: "l", dict: "d", set: "s", bytearray: "B", collections.Counter: "C",
            collections.OrderedDict: "O", collections.defaultdict: "dd", collections.deque: "Q"}  # fmt: skip


_SHARED = _mutable_types()
_KEYED_DICTS = frozenset(("d", "C", "O", "dd"))
_KEYED = _KEYED_DICTS | {"s"}
_MAKERS = {kind: cls for cls, kind in _SHARED.items()}


def _kind(obj) -> str:
    return _SHARED.get(type(obj)) or ("N" if dt.is_array(obj) else "I")


def _snapshot(kind: str, obj) -> tuple:
    """What `_unchanged` compares `obj` with later: its items themselves (held, so that their ids stay theirs)."""
    if kind == "I":
        fields = getattr(obj, "__dict__", None)
        if not slots(type(obj)) and type(fields) is dict:
            return (kind, list(fields), list(fields.values()))
        pairs = _pairs(obj)
        return (kind, [k for k, _ in pairs], [v for _, v in pairs])
    if kind in ("l", "Q"):
        return (kind, list(obj))
    if kind == "s":
        items = list(obj)
        return (kind, items, frozenset(map(id, items)))
    if kind in _KEYED_DICTS:
        keys, values = zip(*_items(kind, obj)) if len(obj) else ((), ())
        return (kind, list(keys), list(values), getattr(obj, "default_factory", None))
    if kind == "B":
        return (kind, bytes(obj))
    return (kind, *dt.snapshot_array(obj))


def _items(kind: str, obj):
    """A dict's items in its order: an OrderedDict's own (move_to_end changes it, not the dict's underneath)."""
    return _MAKERS["O"].items(obj) if kind == "O" else dict.items(obj)


def _unchanged(obj, snap: tuple) -> bool:
    kind = snap[0]
    if kind == "I":
        fields = getattr(obj, "__dict__", None)
        if not slots(type(obj)) and type(fields) is dict:
            return (
                len(fields) == len(snap[1])
                and all(map(is_, fields, snap[1]))
                and all(map(is_, fields.values(), snap[2]))
            )
        now = _snapshot(kind, obj)
        return now[1] == snap[1] and all(map(is_, now[2], snap[2]))
    if kind in ("l", "Q"):
        return len(obj) == len(snap[1]) and all(map(is_, obj, snap[1]))
    if kind == "s":
        return len(obj) == len(snap[1]) and frozenset(map(id, obj)) == snap[2]
    if kind in _KEYED_DICTS:
        items = list(_items(kind, obj))
        same = len(items) == len(snap[1]) and all(is_(k, old) for (k, _), old in zip(items, snap[1]))
        return same and all(is_(v, old) for (_, v), old in zip(items, snap[2])) and getattr(
            obj, "default_factory", None) is snap[3]  # fmt: skip
    if kind == "B":
        return obj == snap[1]
    return dt.snapshot_array(obj) == snap[1:]
