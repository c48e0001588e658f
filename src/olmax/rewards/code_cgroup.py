"""A memory cgroup for each sandbox run, where the host delegates one to this user (cgroup v2).

Without one, the namespace sandbox bounds memory by count: RLIMIT_AS per process, PROCESSES processes, and a
filter refusing what holds memory outside an address space (olmax.rewards.code_seccomp). What that leaves
out, the kernel's own memory per process (page tables, the VMAs of many small mappings, task structures),
a memory cgroup bounds whole: cgroup v2 charges a cgroup's processes' pages and the kernel memory they
allocate (slab, page tables, pipe and socket buffers) against its memory.max (Documentation/admin-guide/
cgroup-v2.rst, "Memory"). Creating one needs a cgroup v2 directory this user may write, with the memory
controller enabled for its children: a subtree the host delegated (systemd's Delegate=yes, a container
given its own writable cgroup namespace), or the root of the hierarchy for root.

`delegated()` finds one, once per process: from this process's own cgroup up to the hierarchy's root, the
first directory whose cgroup.subtree_control holds "memory" and whose cgroup.procs this user may write (moving
a process needs write access to the cgroup.procs of the common ancestor of its old and new cgroups), made
sure of by creating and removing a child. Where there is none it says why (no cgroup v2, no memory controller
in it: this project's CPU host has the memory controller on cgroup v1, not delegated either). `make` creates
one run's cgroup, `remove` deletes it once its processes are gone; the sandbox's keeper moves itself in
before it enters the namespaces (code_sandbox `enter`), so that every process of the run is charged there.
"""

from __future__ import annotations

import functools
import itertools
import logging
import os
import time

logger = logging.getLogger(__name__)

_RUNS = itertools.count()
_REMOVE_SECONDS = 2.0  # for the last processes of a run to leave its cgroup (the kernel frees them last)


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def _unescape(field: str) -> str:
    # mountinfo writes space, tab, newline and backslash as octal escapes (proc(5))
    head, *rest = field.split("\\")
    return head + "".join(chr(int(part[:3], 8)) + part[3:] for part in rest)


def _hierarchy(proc: str) -> tuple[str, str] | None:
    """(this process's cgroup v2 directory, the hierarchy's mount point), or None without cgroup v2."""
    path = next((line[3:] for line in _read(f"{proc}/cgroup").splitlines() if line.startswith("0::")), None)
    for line in _read(f"{proc}/mountinfo").splitlines():
        left, _, right = line.partition(" - ")
        fields = left.split()
        if path is not None and right.split()[:1] == ["cgroup2"] and len(fields) > 4:
            # the mount shows the hierarchy from its root (field 4) on: the process's path is below that
            root, point = _unescape(fields[3]), _unescape(fields[4])
            inside = os.path.relpath(path, root)
            if not inside.startswith(".."):
                return os.path.normpath(os.path.join(point, inside)), point
    return None


def _usable(directory: str) -> str | None:
    """Why a run's cgroup cannot be made in `directory`, or None when it can (a child made and removed)."""
    controllers = _read(f"{directory}/cgroup.controllers").split()
    if "memory" not in controllers:
        return f"{directory} has no memory controller (cgroup.controllers: {' '.join(controllers) or 'none'})"
    if "memory" not in _read(f"{directory}/cgroup.subtree_control").split():
        return f"{directory} does not enable memory for its children (cgroup.subtree_control)"
    if not os.access(directory, os.W_OK) or not os.access(f"{directory}/cgroup.procs", os.W_OK):
        return f"{directory} is not writable by this user (not delegated)"
    trial = os.path.join(directory, f"olmax-code-{os.getpid()}-probe")
    try:
        os.mkdir(trial)
        os.rmdir(trial)
    except OSError as e:
        return f"{directory}: making a child cgroup failed ({e.strerror})"
    return None


@functools.cache
def delegated(proc: str = "/proc/self") -> tuple[str | None, str]:
    """(the cgroup v2 directory a run's cgroup is made in, or None; a line saying which, or why none)."""
    found = _hierarchy(proc)
    if found is None:
        return None, "no cgroup v2 hierarchy holds this process"
    here, point = found
    first = None
    while True:
        why = _usable(here)
        if why is None:
            return here, f"a memory cgroup per run under {here}"
        first = first or why
        if here == point or len(here) <= len(point):
            return None, f"no delegated memory cgroup: {first}"
        here = os.path.dirname(here)


def make(parent: str, memory_bytes: int, processes: int) -> str:
    """A new cgroup under `parent` for one run: memory.max `memory_bytes` (pages and kernel memory alike),
    no swap, and pids.max `processes` where the pids controller is enabled there. Returns its path."""
    path = os.path.join(parent, f"olmax-code-{os.getpid()}-{next(_RUNS)}")
    os.mkdir(path)
    try:
        for name, value in {"memory.max": memory_bytes, "memory.swap.max": 0, "pids.max": processes}.items():
            if name == "memory.max" or os.path.exists(f"{path}/{name}"):  # swap and pids where enabled
                with open(f"{path}/{name}", "r+") as f:  # r+: an interface file, never one made here
                    f.write(str(value))
    except OSError:
        remove(path)
        raise
    return path


def remove(path: str) -> None:
    """Delete a run's cgroup once its processes have left it (a warning when they have not in time)."""
    deadline = time.monotonic() + _REMOVE_SECONDS
    while True:
        try:
            os.rmdir(path)
            return
        except FileNotFoundError:
            return
        except OSError as e:
            if time.monotonic() > deadline:
                logger.warning("code sandbox: could not remove the run's cgroup %s (%s)", path, e.strerror)
                return
            time.sleep(0.01)
