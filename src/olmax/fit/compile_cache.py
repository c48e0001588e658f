"""The persistent compilation cache every `olmax` command uses, so that a program compiled once (a train
step, the init, an evaluation) is read back instead of compiled again by the next run on the same host:
JAX's own cache (jax/_src/compilation_cache.py), keyed by the program, its compile options, the devices
and the jax/XLA versions, so a changed config, chip or version compiles anew.

- Where: OLMAX_COMPILE_CACHE when set (a folder; `off` turns the cache off), else `jax/` in olmax's
  cache folder, $OLMAX_CACHE or ~/.cache/olmax (where data.work_dir keeps the data orders too). A
  JAX_COMPILATION_CACHE_DIR the user set stands and is used as it is. The folder is local to the host
  whatever the run directory is (a gs:// run directory keeps no compiled programs); a gs:// folder
  given here is shared by every host that names it.
- A folder that cannot be used (not creatable, not writable, a file) is a one-line warning naming it
  and what to do; the run goes on without the cache (`enable`). A URL is not probed: JAX warns at the
  entry it cannot write, and the run goes on.
- A local folder is bounded (MAX_BYTES, least recently used entries evicted past it). JAX's bounded
  cache (jax/_src/lru_cache.py, jax 0.10.2) writes an entry, then its `-atime` file, under the folder's
  file lock, so the processes of one host share it and never read a half-written entry; but an entry
  whose `-atime` file is missing (a write cut short: a full disk, a kill) stops its eviction, which
  reads every entry's `-atime` file, and with it every later write to the folder, in every process.
  `enable` removes such entries under the same lock before JAX opens the folder (`repair`).
- A gs:// folder is unbounded (a bucket's lifecycle rule bounds it): JAX's bounded cache would lock
  with a lock file that filelock makes on the local disk, under a `gs:/...` path relative to the
  working directory, which no other host sees. Unbounded, JAX takes no lock; an object store writes an
  object whole or not at all, so no reader sees half an entry.
- Several hosts: JAX writes entries from process 0 only (jax/_src/compiler.py `_cache_write`), for a
  folder every host reads. With a folder local to each host, `share_with_hosts`, called by every
  process at the same point after the programs are compiled, sends the entries process 0 wrote or read
  since it started to the hosts that lack them, which write them to their own folders: the next run
  starts warm on every host. A shared folder (gs://) needs nothing sent. Either way the hosts' folders
  need the same path: JAX's key holds it (the GPU autotuning cache's folder, which jax 0.10.2 writes
  into the compile options it hashes), as it holds the program and the devices, which every host of a
  TPU slice or GPU cluster shares.
- What it does not keep: programs that compile in under a second (JAX's default threshold).

`model.remat=auto` keeps its choice beside the compiled programs as well (olmax.fit.remat), so a run
in a new run directory on the same devices neither searches nor compiles the chosen step again.
docs/performance/fast-start.md gives the rules and the time to the first step, cold and warm.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Mapping, MutableMapping, Optional

from olmax.rundir import paths

ENV = "OLMAX_COMPILE_CACHE"
OFF = "off"
MAX_BYTES = 20 * 2**30  # the cache's bound: a 7B step's executable is tens of MB, a host keeps hundreds
UNBOUNDED = -1  # JAX's "no eviction" size
# JAX's names in the folder (jax/_src/lru_cache.py, jax 0.10.2): KEY-cache holds an entry, KEY-atime its
# last use (8 bytes, little-endian ns), .lockfile the lock of a bounded cache
ENTRY, ATIME, LOCK = "-cache", "-atime", ".lockfile"
LOCK_TIMEOUT_S = 10  # JAX's own
STARTED_NS = time.time_ns()  # entries used since: this process's (`share_with_hosts`)
CHUNK_BYTES = 64 * 2**20  # at most this much of an entry on the devices at a time while sent


def warn(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr, flush=True)


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


def problem(folder: str) -> Optional[str]:
    """Why a local folder cannot hold the cache (it cannot be made, is a file, or cannot be written
    to), or None when it can."""
    path = Path(folder)
    if path.exists() and not path.is_dir():
        return "is not a folder"
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".olmax-probe-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        return f"cannot be written to ({e.strerror or e})"
    return None


def enable(environ: MutableMapping[str, str] = os.environ) -> Optional[str]:
    """Turn the cache on for this process (before or after jax is imported); returns its folder, or
    None when it is off: OLMAX_COMPILE_CACHE=off, or a local folder that cannot be used (a warning says
    which and what to do). A cache the user configured for JAX is used as it is, unless unusable."""
    folder = cache_dir(environ)
    if folder is None:
        return None
    users = "JAX_COMPILATION_CACHE_DIR" in environ
    why = None if paths.is_url(folder) else problem(folder)
    if why is not None:
        name = "JAX_COMPILATION_CACHE_DIR" if users else ENV
        warn(
            f"the compilation cache folder {folder} {why}: this run compiles every program and keeps none; "
            f"set {name} to a writable folder (or {ENV}=off to turn the cache off)"
        )
        if users:  # unset: JAX would warn at its first compile and keep nothing either
            environ.pop("JAX_COMPILATION_CACHE_DIR")
            _set(environ, {"JAX_COMPILATION_CACHE_DIR": None})
        return None
    if users:
        bound = int(environ.get("JAX_COMPILATION_CACHE_MAX_SIZE", UNBOUNDED))
    else:
        bound = UNBOUNDED if paths.is_url(folder) else MAX_BYTES
        _set(environ, {"JAX_COMPILATION_CACHE_DIR": folder, "JAX_COMPILATION_CACHE_MAX_SIZE": bound})
    if bound != UNBOUNDED and not paths.is_url(folder):
        repair(folder)
    return folder


def _set(environ: MutableMapping[str, str], settings: dict[str, object]) -> None:
    """JAX's settings, in the environment (where jax reads them when it is imported; None: unset) and
    in its config when jax already is imported (a command called from Python)."""
    for name, value in settings.items():
        if value is not None:
            environ[name] = str(value)
    if "jax" in sys.modules:
        for name, value in settings.items():
            sys.modules["jax"].config.update(name.lower(), value)


def active_dir() -> Optional[str]:
    """The compilation cache's folder in this process (jax's config), where records are kept beside the
    compiled programs; None when there is none."""
    import jax

    return jax.config.jax_compilation_cache_dir or None


def _lock(folder: str):
    import filelock  # JAX's bounded cache needs it, so it is there

    return filelock.FileLock(str(Path(folder) / LOCK), timeout=LOCK_TIMEOUT_S)


def repair(folder: str) -> list[str]:
    """Remove the entries of a bounded local folder that have no `-atime` file (their write was cut
    short, so they may be cut short too: JAX compiles them once more), under the lock JAX's writers
    hold, so an entry being written by another process is not taken for one. Returns their names."""
    removed = []
    try:
        with _lock(folder):
            for entry in Path(folder).glob(f"*{ENTRY}"):
                if not entry.with_name(entry.name.removesuffix(ENTRY) + ATIME).exists():
                    entry.unlink(missing_ok=True)
                    removed.append(entry.name)
    except TimeoutError:  # filelock's Timeout: a writer holds the folder for long; the next start repairs
        warn(f"the compilation cache folder {folder} stayed locked for {LOCK_TIMEOUT_S} s; not checked this run")
    return removed


def used_since(folder: str, since_ns: int) -> list[str]:
    """The entries of a local folder written or read since `since_ns` (by the `-atime` files a bounded
    cache keeps, else by the entry's modification time), by name."""
    names = []
    for entry in sorted(Path(folder).glob(f"*{ENTRY}")):
        atime = entry.with_name(entry.name.removesuffix(ENTRY) + ATIME)
        try:
            used = int.from_bytes(atime.read_bytes(), "little") if atime.exists() else entry.stat().st_mtime_ns
        except OSError:  # evicted meanwhile
            continue
        if used >= since_ns:
            names.append(entry.name)
    return names


def write_entry(folder: str, name: str, data: bytes) -> None:
    """Add an entry as JAX's bounded cache would, under its lock: the `-atime` file first, so that the
    entry is never without one, then the entry, whole (written aside and renamed). One already there
    is kept. The folder may pass its bound until JAX's next write evicts."""
    path = Path(folder)
    with _lock(folder):
        if (path / name).exists():
            return
        (path / (name.removesuffix(ENTRY) + ATIME)).write_bytes(time.time_ns().to_bytes(8, "little"))
        part = path / f".{name}.{os.getpid()}.part"
        part.write_bytes(data)
        os.replace(part, path / name)


def broadcast_bytes(data: Optional[bytes]) -> bytes:
    """Process 0's `data` on every process (the others pass None), through the devices in pieces of at
    most CHUNK_BYTES, each padded to a power of two so that few shapes are compiled. Collective."""
    import jax
    import numpy as np
    from jax.experimental import multihost_utils

    primary = jax.process_index() == 0
    size = len(data) if primary else 0
    pieces = int(multihost_utils.broadcast_one_to_all(np.int32(-(-size // CHUNK_BYTES))))
    out = []
    for i in range(pieces):
        piece = data[i * CHUNK_BYTES : (i + 1) * CHUNK_BYTES] if primary else b""
        length = int(multihost_utils.broadcast_one_to_all(np.int32(len(piece))))
        padded = np.zeros(max(4, 1 << (length - 1).bit_length()), np.uint8)
        padded[: len(piece)] = np.frombuffer(piece, np.uint8)
        # summed as 32-bit words, an integer type every platform's all-reduce takes
        words = multihost_utils.broadcast_one_to_all(padded.view(np.uint32))
        out.append(np.asarray(words).view(np.uint8)[:length].tobytes())
    return b"".join(out)


def share_with_hosts(folder: Optional[str] = None, since_ns: int = STARTED_NS) -> list[str]:
    """Give every host the entries process 0's folder got or served since `since_ns` (this process's
    start), for a run on several hosts, each with a local folder: JAX writes on process 0 only. Every
    process calls it at the same point, after the programs of interest are compiled (collectives);
    `folder` defaults to the one in use (`active_dir`). Returns the entries this process wrote."""
    import jax
    import numpy as np
    from jax.experimental import multihost_utils

    if jax.process_count() == 1:
        return []
    folder = active_dir() if folder is None else folder
    local = folder is not None and not paths.is_url(folder)  # a URL is every host's folder already
    primary = jax.process_index() == 0
    names = used_since(folder, since_ns) if primary and local else []
    names = json.loads(broadcast_bytes(json.dumps(names).encode() if primary else None))
    if not names:
        return []
    lacking = np.array([local and not (Path(folder) / n).exists() for n in names])
    wanted = np.asarray(multihost_utils.process_allgather(lacking)).any(axis=0)
    written = []
    for name, lacks, wanted_anywhere in zip(names, lacking, wanted):
        if not wanted_anywhere:
            continue
        data = broadcast_bytes(_read(Path(folder) / name) if primary else None)
        if lacks and data:  # every process takes part in every broadcast, so nothing here may raise
            try:
                write_entry(folder, name, data)
                written.append(name)
            except OSError as e:
                warn(f"the compiled program {name} cannot be kept in {folder} ({e}); this host compiles it next run")
    return written


def _read(path: Path) -> bytes:
    """An entry's bytes, or none where it went meanwhile (evicted by another process's write)."""
    try:
        return path.read_bytes()
    except OSError:
        return b""


def disable() -> None:
    """Turn the cache off for this process: a compile-only client (libtpu's topology, the CUDA plugin
    without a GPU) cannot load an executable back ("PjRtCompiler must be constructed with a Client to
    call DeserializeLoadedExecutable"), so what it would read only warns and what it would write
    only fills the folder."""
    import jax

    jax.config.update("jax_enable_compilation_cache", False)
