"""The persistent compilation cache every `olmax` command uses, so that a program compiled once (a train
step, the init, an evaluation) is read back instead of compiled again by the next run on the same host:
JAX's own cache (jax/_src/compilation_cache.py), keyed by the program, its compile options, the devices
and the jax/XLA versions, so a changed config, chip or version compiles anew.

- Where: OLMAX_COMPILE_CACHE when set (a folder; `off` turns the cache off), else `jax/` in olmax's
  cache folder, $OLMAX_CACHE or ~/.cache/olmax (where data.work_dir keeps the data orders too). A
  JAX_COMPILATION_CACHE_DIR the user set stands and is used as it is. The folder is local to the host
  whatever the run directory is (a gs:// run directory keeps no compiled programs); a gs:// folder
  given here is shared by every host that names it (JAX then locks with a soft lock file).
- Several processes: entries are written and read under the cache folder's file lock (JAX's LRU cache
  locks when its size is bounded: MAX_BYTES, least recently used entries evicted past it), so processes
  of one host sharing the folder never read a half-written entry.
- What it does not keep: programs that compile in under a second (JAX's default threshold).

`model.remat=auto` keeps its choice beside the compiled programs as well (olmax.fit.remat), so a run
in a new run directory on the same devices neither searches nor compiles the chosen step again.
docs/performance/tpu-v5e.md gives the time to the first step, cold and warm.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Mapping, MutableMapping, Optional

from olmax.rundir import paths

ENV = "OLMAX_COMPILE_CACHE"
OFF = "off"
MAX_BYTES = 20 * 2**30  # the cache's bound: a 7B step's executable is tens of MB, a host keeps hundreds


def cache_dir(environ: Mapping[str, str] = os.environ) -> Optional[str]:
    """The folder of the compilation cache for this environment, or None when it is off. A URL
    (gs://...) is kept as written: JAX reads and writes it through etils' epath."""
    if environ.get("JAX_COMPILATION_CACHE_DIR"):
        return environ["JAX_COMPILATION_CACHE_DIR"]
    given = environ.get(ENV)
    if given is not None:
        given = given.strip()
        if given.lower() in (OFF, ""):
            return None
        return given if paths.is_url(given) else str(Path(given).expanduser())
    return str(Path(environ.get("OLMAX_CACHE") or "~/.cache/olmax").expanduser() / "jax")


def enable(environ: MutableMapping[str, str] = os.environ) -> Optional[str]:
    """Turn the cache on for this process (before or after jax is imported); returns its folder, or
    None when OLMAX_COMPILE_CACHE=off. A cache the user configured for JAX is left as it is."""
    folder = cache_dir(environ)
    if folder is None or "JAX_COMPILATION_CACHE_DIR" in environ:
        return folder
    settings = {"JAX_COMPILATION_CACHE_DIR": folder, "JAX_COMPILATION_CACHE_MAX_SIZE": str(MAX_BYTES)}
    for name, value in settings.items():
        environ[name] = value  # read by jax when it is imported
    if "jax" in sys.modules:  # already imported (a command called from Python): set it directly
        config = sys.modules["jax"].config
        config.update("jax_compilation_cache_dir", folder)
        config.update("jax_compilation_cache_max_size", MAX_BYTES)
    return folder


def disable() -> None:
    """Turn the cache off for this process: a compile-only client (libtpu's topology, the CUDA plugin
    without a GPU) cannot load an executable back ("PjRtCompiler must be constructed with a Client to
    call DeserializeLoadedExecutable"), so what it would read only warns and what it would write
    only fills the folder."""
    import jax

    jax.config.update("jax_enable_compilation_cache", False)
