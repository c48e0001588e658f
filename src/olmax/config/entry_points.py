"""The plug-ins installed under an entry-point group (`olmax.objectives`, `olmax.data_kinds`), read once
per sys.path. importlib.metadata reads every folder of sys.path for each query (about 14 ms on the
development host), and every config that is built, copied or unpickled asks for its objective's and data
kind's names. A plug-in installed into a folder newly put on sys.path (a test's, a notebook's) changes
the key and is found; one installed into a folder already read, while the process runs, is not."""

import functools
import importlib.metadata
import sys


def installed(group: str) -> dict:
    """{name: entry point} of `group`'s plug-ins on the current sys.path."""
    return _read(group, tuple(sys.path))


@functools.lru_cache(maxsize=16)
def _read(group: str, path: tuple[str, ...]) -> dict:
    return {ep.name: ep for ep in importlib.metadata.entry_points(group=group)}
