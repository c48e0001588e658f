"""The program's objects on the tests' side of the channel (olmax.rewards.code_remote): a `Remote` is a
handle held by number whose use is a request to the program's process; the methods it has are those its
program object has (`PROTOCOL`, `remote_class`), and what it refuses (comparing, hashing, truth,
operators, conversions, `with`, copies) raises `Refused`, recorded so that the test fails whatever it
caught. `Spoiled` and `Late` end a test that can no longer pass or has run out of time.

Standard library only (this module runs inside the sandbox).
"""

from __future__ import annotations

import types

_KEPT_DUNDERS = frozenset(("__name__", "__qualname__"))  # fetched from the program; other dunders only where the
# test names them itself (`p.__dict__`, `hasattr(p, '__dict__')`: code_tests `dunders`)
_SHOWN_AS = {"generator": types.GeneratorType}  # the kinds a Remote shows as its class (isinstance)


class Refused(TypeError):
    """A use of a program object this process does not make (comparing, hashing or taking the truth of it:
    its own methods would answer), a value that does not cross, or an answer past the channel's bounds.
    Recorded (`Codec.refuse`): the test fails whatever it caught."""


class Spoiled(BaseException):
    """The test cannot pass any more: the program's process ended or sent what is no answer, or test code
    run for the program raised or asked the program for something. This and every later use fails, and the
    test fails whatever it caught."""


class Late(BaseException):
    """The test's time is up."""


# An object of the program's, held here by number: its use is a request to the program's process. (No docstring:
# `__doc__` is the program's.)
class Remote:
    __slots__ = ("_remote_codec", "_remote_number", "_remote_kind")

    def __init__(self, codec, number: int, kind: str):
        object.__setattr__(self, "_remote_codec", codec)
        object.__setattr__(self, "_remote_number", number)
        object.__setattr__(self, "_remote_kind", kind)

    @property
    def __class__(self):  # noqa: D105 (`isinstance(g, types.GeneratorType)` for the program's generators)
        return _SHOWN_AS.get(object.__getattribute__(self, "_remote_kind"), type(self))

    def _ask(self, op: str, *operands):
        return self._remote_codec.request(op, self, *operands)

    def _refuse(self, what: str):
        return self._remote_codec.refuse(f"a {self._remote_kind} of the program's {what}")

    def __getattribute__(self, name: str):
        # a special name this class defines itself (`__eq__`, `__hash__`, `__module__`) that the test names: the
        # program's (`Point.__eq__ is not object.__eq__`, `Point.__hash__ is None`); Python's own uses of them
        # (`==`, hash()) look them up on the class and never come here
        if name in _OWN_SPECIAL and name in object.__getattribute__(self, "_remote_codec").dunders:
            return object.__getattribute__(self, "_ask")("getattr", name)
        return object.__getattribute__(self, name)

    def __getattr__(self, name: str):
        if name.startswith("_remote_"):
            raise AttributeError(name)  # (a copy without its slots)
        special = name.startswith("__") and name.endswith("__")
        if special and name not in _KEPT_DUNDERS and name not in self._remote_codec.dunders:
            raise AttributeError(name)  # a library's probe (numpy's __array__, copy's __deepcopy__): not the program's
        return self._ask("getattr", name)

    @property
    def __doc__(self):  # noqa: D105 (the program's; the class's own docstring would answer first)
        return self._ask("getattr", "__doc__")

    def __setattr__(self, name: str, value) -> None:
        self._ask("setattr", name, value)

    def __delattr__(self, name: str) -> None:
        self._ask("delattr", name)

    def _text(self, op: str, *operands) -> str:
        text = self._ask(op, *operands)
        if type(text) is not str:
            raise self._refuse(f"answered {op}() with what is not a str")
        return text

    def __str__(self) -> str:
        return self._text("str")

    def __repr__(self) -> str:
        return self._text("repr")

    def __format__(self, spec: str) -> str:
        return self._text("format", spec)

    def __eq__(self, other):
        if other is None or other is self:  # (the program's None crosses as None)
            return other is self
        raise self._refuse("compared with another object (its own __eq__ would answer)")

    def __ne__(self, other):
        return not self.__eq__(other)

    def _order(self, other):
        raise self._refuse("ordered (its own methods would answer)")

    __lt__ = __le__ = __gt__ = __ge__ = _order

    def __hash__(self):
        raise self._refuse("hashed (its own __hash__ would answer)")

    def __bool__(self):
        raise self._refuse("has no truth value here (its own __bool__ would answer)")

    # `isinstance(shape, Circle)` with the program's class: its answer about its own object; a value that crossed
    # as data is no instance of a program's class here (its metaclass would say what it liked of the value)
    def __instancecheck__(self, instance) -> bool:
        return isinstance(instance, Remote) and self._check("isinstance", instance)

    def __subclasscheck__(self, subclass) -> bool:
        return isinstance(subclass, Remote) and self._check("issubclass", subclass)

    def _check(self, op: str, operand) -> bool:
        found = self._ask(op, operand)
        if type(found) is not bool:
            raise self._refuse(f"answered {op}() with what is not a bool")
        return found

    def _operator(self, *operands):
        raise self._refuse("met an operator, a conversion, `with` or a copy (its own methods would answer)")


class _Protocol:
    """The methods of a Remote that the program's object may lack (`remote_class`)."""

    def __call__(self, *args, **kwargs):
        return self._ask("call", args, tuple(kwargs.items()))

    def __getitem__(self, key):
        return self._ask("getitem", key)

    def __setitem__(self, key, value) -> None:
        self._ask("setitem", key, value)

    def __delitem__(self, key) -> None:
        self._ask("delitem", key)

    def __len__(self) -> int:
        size = self._ask("len")
        if type(size) is not int or size < 0:
            raise self._refuse("answered len() with what is not a count")
        return size

    def __iter__(self):
        found = self._ask("iter")
        return found if isinstance(found, Remote) else iter(found)

    def __next__(self):
        return self._remote_codec.next_item(self)

    def __contains__(self, item) -> bool:
        found = self._ask("contains", item)
        if type(found) is not bool:
            raise self._refuse("answered `in` with what is not a bool")
        return found


# what a Remote refuses beyond comparing, hashing and truth: operators (the operand would be the program's to see:
# `abs(area(1) - 3.14) < 1e-6`), conversions, `with` and copy/pickle (a copy of a handle is no copy of the
# program's object). Python's own TypeError for these (a Remote
# has no such method) would be caught by a test expecting the program's (`pytest.raises(TypeError): v + 'a'`
# passed a program whose __add__ takes anything): each is refused, and so recorded
_BINARY = ("add", "sub", "mul", "matmul", "truediv", "floordiv", "mod", "pow", "lshift", "rshift", "and", "xor", "or")
_OPERATORS = (*(form.format(name) for name in _BINARY for form in ("__{}__", "__r{}__", "__i{}__")),
              "__divmod__", "__rdivmod__", "__neg__", "__pos__", "__abs__", "__invert__", "__int__", "__float__",
              "__complex__", "__index__", "__round__", "__trunc__", "__floor__", "__ceil__", "__enter__", "__exit__",
              "__reduce__", "__reduce_ex__")  # fmt: skip
for _name in _OPERATORS:
    setattr(Remote, _name, Remote._operator)
del _name
del Remote.__slots__  # (its slots stay): `Point.__slots__` is the program's class's

_OWN_SPECIAL = frozenset(name for klass in (Remote, _Protocol) for name in dir(klass) if name.startswith("__")) - {
    "__class__", "__getattribute__", "__getattr__", "__setattr__", "__delattr__", "__doc__"}  # fmt: skip

# which of a program object's methods its handle has (code_program `protocol`), a bit each, and its hash refused
# or absent: `hasattr(it, '__next__')`, `isinstance(it, collections.abc.Iterator)`, `callable(f)` and
# `hash(obj)` are as the program's object's, not the verifier's
PROTOCOL = ("__call__", "__getitem__", "__setitem__", "__delitem__", "__len__", "__iter__", "__next__", "__contains__")
UNHASHABLE = 1 << len(PROTOCOL)
EVERY = UNHASHABLE - 1  # a handle whose methods the program did not say (an object it named by import)
_CLASSES: dict[int, type] = {}


def remote_class(flags: int) -> type:
    """The class of a handle whose program object has the methods `flags` names (PROTOCOL's bits; UNHASHABLE)."""
    found = _CLASSES.get(flags)
    if found is None:
        body = {name: vars(_Protocol)[name] for bit, name in enumerate(PROTOCOL) if flags >> bit & 1}
        body.update({"__slots__": (), "__qualname__": "Remote", "__module__": Remote.__module__,
                     "__doc__": vars(Remote)["__doc__"]})  # (type() would make it None)  # fmt: skip
        if flags & UNHASHABLE:
            body["__hash__"] = None  # unhashable, as the program's object: hash() is Python's own TypeError
        found = _CLASSES[flags] = type("Remote", (Remote,), body)
        del found.__slots__
    return found
