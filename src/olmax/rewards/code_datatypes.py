"""The standard library's and numpy's data types on the code channel: how each is written and read.

A message between a test's process and its program's (olmax.rewards.code_values) writes the builtin types
itself; this module writes and reads the rest of what crosses as data, each rebuilt on the receiving side
by that side's own classes: Fraction, Decimal, the datetime types (fixed-offset time zones), dict views,
numpy's scalars, and numpy's arrays, which are shared objects (code_values: a ref each, written back into
the sender's own array after each call; `array_content`, `new_array`, `fill_array`). What a value of the
program's could make the reader spend is bounded here too: a Decimal's characters and a Fraction's terms
(TERM_DIGITS), an array's bytes (they count against the message's elements).

Standard library only: this module also runs inside the sandbox (olmax.rewards.code_sandbox).
"""

from __future__ import annotations

import binascii
import sys

from olmax.rewards.code_channel import ChannelError, Unsendable, check_keys

TERM_DIGITS = 10_000  # a Decimal's characters, and a Fraction's terms' decimal digits
_TERM_BITS = int(TERM_DIGITS * 3.3219280948873626)  # (log2(10)): Fraction(a, b) reduces by one gcd, in C
NUMPY_KINDS = frozenset("biufcUS")  # numbers, booleans and text: no objects, no records


def b64(data) -> str:
    return binascii.b2a_base64(data, newline=False).decode("ascii")


def unb64(text) -> bytes:
    if type(text) is not str:
        raise ChannelError("bytes that are not base64 text")
    try:
        return binascii.a2b_base64(text)
    except binascii.Error as e:
        raise ChannelError(f"bytes that are not base64: {e}") from None


def _ints(*values) -> None:
    if not all(type(v) is int for v in values):
        raise ChannelError("a field that is not an int")


def numpy():
    return sys.modules.get("numpy")  # only where the sender or the program already imported it


def is_array(value) -> bool:
    """Whether `value` is a numpy array that crosses as a shared object (numpy's own class, or a subclass
    this channel made: code_remote's empty arrays of the program's)."""
    np = numpy()
    kind = type(value)
    return np is not None and isinstance(value, np.ndarray) and (kind.__module__ == "numpy" or
                                                                 getattr(kind, "olmax_array", False))  # fmt: skip


def writer(value):
    """The writer of a value of the standard library's (or numpy's scalar) data types, or None."""
    kind = type(value)
    if kind in _VIEWS:
        return _write_view
    module = kind.__module__
    if module == "numpy":
        np = numpy()
        return _write_scalar if np is not None and isinstance(value, np.generic) else None
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


def _dtype(value) -> str:
    if value.dtype.kind not in NUMPY_KINDS or value.dtype.hasobject or value.dtype.fields is not None:
        raise Unsendable(f"a numpy value of dtype {value.dtype}")
    return value.dtype.str


def _write_scalar(codec, value, depth):
    data = value.tobytes()
    codec._counted(len(data) >> 6)
    return ["n", _dtype(value), b64(data)]


def array_content(codec, array) -> list:
    """A shared array's definition after its ref and kind: [dtype, shape, bytes as base64]."""
    np = numpy()
    dtype = _dtype(array)
    data = np.ascontiguousarray(array).tobytes()
    codec._counted(len(data) >> 6)
    return [dtype, list(array.shape), b64(data)]


def snapshot_array(array) -> tuple:
    return array.dtype.str, array.shape, array.tobytes()


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
    if max(abs(part).bit_length() for part in parts) > _TERM_BITS:
        raise ChannelError(f"a Fraction whose terms are past {TERM_DIGITS} digits (reducing it would take long)")
    return fractions.Fraction(*parts)


def _read_decimal(codec, rest, depth):
    import decimal

    if len(rest) != 1 or type(rest[0]) is not str or len(rest[0]) > TERM_DIGITS:
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


def _numpy_value(codec, dtype_text, shape, data_text):
    import importlib

    np = numpy() or importlib.import_module("numpy")
    if type(dtype_text) is not str:
        raise ChannelError("not a numpy value")
    try:
        dtype = np.dtype(dtype_text)
    except TypeError:
        raise ChannelError("not a numpy dtype") from None
    if dtype.kind not in NUMPY_KINDS or dtype.hasobject or dtype.fields is not None:
        raise ChannelError(f"a numpy dtype {dtype} that does not cross")
    data = unb64(data_text)
    codec._tick(len(data) >> 6)
    if type(shape) is not list or not all(type(n) is int and n >= 0 for n in shape):
        raise ChannelError("not a numpy shape")
    size = 1
    for n in shape:
        size *= n
    if size * dtype.itemsize != len(data):
        raise ChannelError("a numpy value whose bytes do not fit its shape")
    try:
        return np.frombuffer(data, dtype=dtype).reshape(shape).copy()
    except ValueError as e:
        raise ChannelError(f"not a numpy value: {e}") from None


def _read_scalar(codec, rest, depth):
    if len(rest) != 2:
        raise ChannelError("not a numpy value")
    return _numpy_value(codec, rest[0], [], rest[1])[()]


def new_array(codec, rest: list):
    """A shared array from its definition's content (`array_content`)."""
    if len(rest) != 3:
        raise ChannelError("not a numpy array")
    return _numpy_value(codec, *rest)


def fill_array(codec, array, rest: list) -> None:
    """Write a shared array's new content into this side's array of that ref: its bytes, in place (its views
    see them); a change of dtype or shape is refused (the other side's array cannot be rebuilt in place)."""
    np = numpy()
    made = new_array(codec, rest)
    if made.dtype != array.dtype or made.shape != array.shape:
        raise ChannelError(f"a numpy array whose dtype or shape changed ({array.dtype}{list(array.shape)} to "
                           f"{made.dtype}{list(made.shape)}): it is written back in place")  # fmt: skip
    try:
        np.copyto(array, made)
    except ValueError as e:  # a read-only array
        raise ChannelError(f"a numpy array that cannot be written back: {e}") from None


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


READERS = {"q": _read_fraction, "D": _read_decimal, "dt": _read_datetime, "n": _read_scalar,
           **{tag: _read_view(tag) for tag in ("dk", "dv", "di")}}  # fmt: skip
