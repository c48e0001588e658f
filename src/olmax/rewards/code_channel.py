"""The channel between a test's process and its program's: frames, and what either side may name by import.

Each use the tests' process (olmax.rewards.code_harness) makes of a program name is a request to the
program's process (olmax.rewards.code_program) over a pair of pipes: a frame each way (`send`,
`receive`: a kind byte and a length, then that many bytes, read only when the length is within the
reader's bound), whose payload is a message of olmax.rewards.code_values. A side that reads what is no
frame, or one past its bound, raises ChannelError; a side whose peer closed its end raises Closed.

Standard library only: this module also runs inside the sandbox (olmax.rewards.code_sandbox).
"""

from __future__ import annotations

import importlib
import os
import struct
import sys

HEADER = struct.Struct("<cI")  # a frame: kind, payload length
MESSAGE_BYTES = 16 << 20  # one message's JSON text
COLLISIONS = 16  # keys of one set or dict that may share a hash (ints and tuples hash alike in every process)

# what the tests' side resolves by module and name as its own (else a handle): modules whose functions only
# compute over their arguments, and Python's builtins but those that reach code, files or the interpreter
PURE_MODULES = frozenset(("array", "bisect", "cmath", "collections", "copy", "dataclasses", "datetime", "decimal",
                          "enum", "fractions", "functools", "heapq", "itertools", "json", "math", "numbers",
                          "numpy", "operator", "random", "re", "statistics", "string", "textwrap", "typing",
                          "unicodedata"))  # fmt: skip
IMPURE_BUILTINS = frozenset(("__import__", "breakpoint", "compile", "delattr", "eval", "exec", "exit", "getattr",
                             "globals", "help", "input", "locals", "memoryview", "open", "quit", "setattr",
                             "vars"))  # fmt: skip


class ChannelError(Exception):
    """What arrived is not a message of this protocol, or is past a budget (the message says which)."""


class Closed(ChannelError):
    """The other side closed its end (its process ended)."""


class Unsendable(TypeError):
    """A value that cannot cross (a function of the tests', a value past the budgets)."""


def send(fd: int, kind: bytes, payload: bytes) -> None:
    """One frame: HEADER, then `payload`."""
    for data in (HEADER.pack(kind, len(payload)), payload):
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]


def _exactly(fd: int, size: int) -> bytes:
    parts, have = [], 0
    while have < size:
        chunk = os.read(fd, min(size - have, 1 << 20))
        if not chunk:
            raise Closed("the other side closed the channel")
        parts.append(chunk)
        have += len(chunk)
    return b"".join(parts)


def receive(fd: int, limit: int = MESSAGE_BYTES) -> tuple[bytes, bytes]:
    """(kind, payload) of the next frame; ChannelError for one past `limit` bytes (nothing of it is read)."""
    kind, length = HEADER.unpack(_exactly(fd, HEADER.size))
    if length > limit:
        raise ChannelError(f"a message of {length} bytes, past the bound of {limit}")
    return kind, _exactly(fd, length)


def check_keys(keys) -> None:
    """Refuse keys of which more than COLLISIONS share a hash: a set or dict of such keys takes time quadratic
    in their number to build (ints, floats and tuples hash the same in every process, so a program can make
    them collide; strings are hashed with this process's own random key)."""
    if len(keys) > COLLISIONS:
        counts: dict = {}
        for key in keys:
            try:
                h = hash(key)
            except TypeError as e:
                raise ChannelError(f"a key that cannot be one: {e}") from None
            counts[h] = counts.get(h, 0) + 1
            if counts[h] > COLLISIONS:
                raise ChannelError(f"more than {COLLISIONS} keys of one set or dict share a hash")


def importable(obj) -> tuple[str, str] | None:
    """(module, qualified name) under which `obj` (a module, class or function) is found again by import,
    else None: a module's own name with "" for a module."""
    if type(obj).__name__ == "module":
        name = getattr(obj, "__name__", None)
        return (name, "") if type(name) is str and sys.modules.get(name) is obj else None
    owner = getattr(obj, "__objclass__", None)  # a method descriptor (str.upper) names its class
    module = getattr(owner if owner is not None else obj, "__module__", None)
    qualname = getattr(obj, "__qualname__", None)
    if type(module) is not str or type(qualname) is not str or module == "__main__" or "<" in qualname:
        return None
    found = sys.modules.get(module)
    for part in qualname.split("."):
        found = getattr(found, part, None)
    return (module, qualname) if found is obj else None


def resolve(module: str, qualname: str):
    """The object `importable` named, imported in this process (ChannelError where it is not there)."""
    try:
        found = importlib.import_module(module)
        for part in filter(None, qualname.split(".")):
            found = getattr(found, part)
    except Exception as e:
        raise ChannelError(f"{module}.{qualname} cannot be imported here: {type(e).__name__}") from None
    return found
