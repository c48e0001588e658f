"""The code sandbox's runner: each test run by the tests' process against a program's process of its own.

The runner (under isolation namespaces, the sandbox's init, PID 1 of its PID namespace:
olmax.rewards.code_sandbox) holds the program and the job's limits, and never runs the program, a test or
anything either sends. It applies once what every process it forks inherits (`guard`), starts the tests'
process (one for the run: `_Tests`; it reads each test from the tests' file, which the verifier wrote and
no process of the program's holds, and runs it: olmax.rewards.code_harness), and for each test, in order
(`one`):

1. for a `code` test it makes the channel (a pipe each way), forks the program's process with its ends
   (`_start`: under namespaces PID 1 of a PID namespace of its own, which makes a mount namespace, a
   scratch tmpfs and a /proc of its own: `own_namespaces`), and hands the tests' process the test's index
   and the other ends over a socket made before any filter (SCM_RIGHTS); for a stdio test the tests'
   process hands it the input as a file, the program's process gets it as descriptor 0 and an empty file
   as descriptor 1, and the runner hands that file back once the program ended (its status with it);
2. it waits for the tests' verdict, up to the test's limit and SLACK (then kills the tests' process, "t",
   and starts another for the next test), and kills every other process of the test: under namespaces
   every process of the PID namespace but itself and the tests' process, else the program's process group
   (whose scratch directory it then empties);
3. it writes the test's record for the verifier (`record`): "<kind> <index> <length>\\n<reason>", in one
   write(2) of at most PIPE_BUF bytes, so that a record is whole or absent even if the runner is killed.
   Kinds: "p" passed, "f" failed, "r" refused (the test used no name of the program's), "t" out of time;
   "error" when the sandbox could not be entered;
4. it waits a random time before the next test (`pause`), which blurs a clock phase one test's program
   ends at for the next test's program to read.

A program that fails to load (raises, or runs out of time before the tests' process gets its names) fails
every test: the rest are recorded with the same verdict without running.

Confinement, in both kinds of process: `guard` (Python's socket API refused; upstream's reliability guard,
as upstream applies it to the process that runs the program and its tests); rlimits (address space
`memory_mb`, CPU seconds, file size, descriptors, pending signals, no POSIX message queue, no core file);
under namespaces, no capability (capset to empty, no_new_privs) and the system call filter
(olmax.rewards.code_seccomp) for the run's memory window (`memory_window`), last. Neither the runner nor
the tests' process is dumpable, so that no process of the sandbox's user reads their memory or descriptors
through /proc.

Standard library only (this module runs inside the sandbox).
"""

from __future__ import annotations

import _socket
import functools
import gc
import json
import os
import platform
import resource
import select
import signal
import socket
import struct
import sys
import time

from olmax.rewards import code_channel, code_harness, code_program, code_seccomp

SLACK = 1.0  # seconds past a test's limit before the runner kills its processes
PAUSE = 2.0  # the most seconds the runner waits between two tests (`pause`)
_QUICK = 0.05  # seconds of a test taken as the run's quickest before one ran quicker (`pause`)
# what the runner (and a program's process, before the program runs) uses of the calls `guard` disables
_KILLPG, _UNLINK, _RMDIR, _SOCKETPAIR = os.killpg, os.unlink, os.rmdir, _socket.socketpair
_CHDIR, _FCHDIR = os.chdir, os.fchdir
OUTPUT_BYTES = 16 << 20  # what a stdio program's output is read up to (RLIMIT_FSIZE stops it there too)
STDIO_MARGIN = 0.25  # the tests' process waits this much longer than the program's side for a stdio output
_INDEX = struct.Struct("<Q")  # the tests' file: count, count + 1 offsets, then each test's JSON
# <linux/prctl.h>, <linux/seccomp.h>, <linux/capability.h>
PR_SET_DUMPABLE, PR_SET_SECCOMP, PR_SET_NO_NEW_PRIVS = 4, 22, 38
CLONE_NEWNS, CLONE_NEWPID = 0x00020000, 0x20000000  # <linux/sched.h>
MS_NOSUID, MS_NODEV, MS_NOEXEC = 2, 4, 8  # <linux/mount.h>
SECCOMP_MODE_FILTER = 2
CAPABILITY_VERSION_3 = 0x20080522
_MAPS_APART = ("[heap]", "[stack]", "[vdso]", "[vvar]", "[vvar_vclock]", "[vsyscall]")


class SetupError(OSError):
    """A step of entering or confining the sandbox that failed; its message names the step and the errno."""


@functools.cache
def _libc():
    import ctypes  # here, not above: isolation none does not pay for its import

    return ctypes.CDLL(None, use_errno=True)


def call(name: str, *args, what: str = "") -> None:
    """libc's `name`(*args), raising SetupError on failure; `what` names the mechanism the call stands for,
    for the steps a host may lack (the probe's finding, and the refusal to start, name it)."""
    import ctypes

    if getattr(_libc(), name)(*args) != 0:
        errno = ctypes.get_errno()
        shown = ", ".join(a.decode() if isinstance(a, bytes) else hex(a) if isinstance(a, int) else
                          "NULL" if a is None else "..." for a in args)  # fmt: skip
        raise SetupError(errno, f"{what + ': ' if what else ''}{name}({shown}): {os.strerror(errno)}")


def drop_capabilities() -> None:
    call("prctl", PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    # struct __user_cap_header_struct {version, pid = 0: this thread}, then effective, permitted and
    # inheritable sets (low and high words): all empty
    call("capset", struct.pack("Ii", CAPABILITY_VERSION_3, 0), bytes(24))


def install_filter(program: bytes) -> None:
    """seccomp(2) SECCOMP_MODE_FILTER with `program` (struct sock_filter entries, 8 bytes each): from here on,
    in this process and every process it forks, each system call is judged by it. Needs no_new_privs."""
    import ctypes

    # <linux/filter.h> struct sock_fprog {unsigned short len; struct sock_filter *filter;}
    fprog = struct.pack("HxxxxxxP", len(program) // 8, ctypes.cast(ctypes.c_char_p(program), ctypes.c_void_p).value)
    call("prctl", PR_SET_SECCOMP, ctypes.c_ulong(SECCOMP_MODE_FILTER), fprog, 0, 0, what="seccomp")


def hide_mounts() -> int:
    """Move into a copy of this mount namespace while the root stays in this one. /proc/<pid>/mountinfo
    (and mounts, mountstats) lists the mounts of a process's mount namespace that its root reaches, with
    their sources: the host's devices, the host paths of the binds and their options (proc(5);
    fs/proc_namespace.c `show_mountinfo` skips a mount its root does not reach). The copy's mounts are all
    out of the root's reach, so none is listed, while paths resolve through this namespace's as before.
    Returns a descriptor of this namespace, which the caller keeps open: a namespace no process is in and
    no descriptor holds is taken down, its mounts with it (the root would be left bare)."""
    keep = os.open("/proc/self/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
    root = os.open("/", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    call("unshare", CLONE_NEWNS, what="mount namespaces")
    _FCHDIR(root)
    call("chroot", b".")
    os.close(root)
    return keep


class Place:
    """Where a run's processes are confined under isolation namespaces: the system call filter, and
    descriptors of the sandbox's mount namespace (`mounts`, the one its root lies in), of its root
    directory (`root`) and of the runner's PID namespace (`pids`), from which each program's process gets
    namespaces of its own (`own_namespaces`). All None under isolation none."""

    __slots__ = ("filter", "mounts", "root", "pids")

    def __init__(self, filter_program: bytes | None = None, mounts: int | None = None, pids: int | None = None):
        self.filter, self.mounts, self.pids = filter_program, mounts, pids
        self.root = os.open("/", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC) if mounts is not None else None


def own_namespaces(job: dict, place: Place) -> None:
    """In a program's process, PID 1 of a PID namespace of its own and still holding its capabilities there:
    a mount namespace of its own, copied from the sandbox's, with a fresh scratch tmpfs and a /proc of its
    PID namespace alone, its mounts hidden (`hide_mounts`). Nothing one test's program leaves (a file, the
    inode and process numbers it used up) is there for the next, and no other process of the sandbox (the
    runner, the tests' process) is in its view or within reach of its signals."""
    # into the sandbox's mount namespace, at its root (setns(2) leaves the namespace's first root, not the
    # one the init pivoted to), then a copy of it of its own
    call("setns", place.mounts, CLONE_NEWNS, what="mount namespaces")
    _FCHDIR(place.root)
    call("chroot", b".")
    os.close(place.mounts)
    os.close(place.root)
    call("unshare", CLONE_NEWNS, what="mount namespaces")
    size = f"mode=0700,size={job['scratch_bytes']},nr_inodes={job['scratch_inodes']}".encode()
    call("mount", b"tmpfs", job["scratch"].encode(), b"tmpfs", MS_NOSUID | MS_NODEV, size)
    call("mount", b"proc", b"/proc", b"proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, b"subset=pid")
    hide_mounts()  # (its descriptor stays open for the process's life; setns(2) is refused by the filter)
    _CHDIR(job["scratch"])


def memory_window(memory_bytes: int) -> code_seccomp.Window:
    """This process's memory window (code_seccomp): from its lowest mapping of libraries and anonymous
    memory, less 1.5 x `memory_bytes` (room for what an address space of that limit maps below it), to its
    highest; the executable, its heap and the stack lie apart. Its children, forked after, share it."""
    exe = os.readlink("/proc/self/exe")
    low, high = None, 0
    with open("/proc/self/maps") as f:
        for line in f:
            fields = line.split(None, 5)
            path = fields[5].strip() if len(fields) > 5 else ""
            if path in _MAPS_APART or path == exe:
                continue
            start, end = (int(part, 16) for part in fields[0].split("-"))
            low, high = start if low is None else min(low, start), max(high, end)
    return code_seccomp.Window(max(low - memory_bytes * 3 // 2, 1 << 16), high, memory_bytes)


def _limit(kind: int, value: int) -> None:
    hard = resource.getrlimit(kind)[1]  # an unprivileged process may not raise its hard limit
    value = value if hard == resource.RLIM_INFINITY else min(value, hard)
    resource.setrlimit(kind, (value, value))


def _no_network(*args, **kwargs):
    raise PermissionError("network access is disabled in the olmax code sandbox")


class _NoSocket:
    def __new__(cls, *args, **kwargs):
        _no_network()


def confine(job: dict, filter_program: bytes | None, cpu_seconds: float) -> None:
    """The limits of a process of the tests' or the program's (module docstring), the filter last (the
    runner has applied `guard` to what they inherit)."""
    if filter_program is not None:  # isolation namespaces
        drop_capabilities()
    mem = job["memory_mb"] << 20
    resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
    resource.setrlimit(resource.RLIMIT_FSIZE, (job["file_bytes"], job["file_bytes"]))
    cpu = int(cpu_seconds) + 1
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    # what a process may hold beside its address space, bounded by count (getrlimit(2)): descriptors (pipe
    # buffers are per descriptor), queued signals and POSIX timers, POSIX message queues, and no core file
    _limit(resource.RLIMIT_NOFILE, job["open_files"])
    _limit(resource.RLIMIT_SIGPENDING, job["pending_signals"])
    _limit(resource.RLIMIT_MSGQUEUE, 0)
    _limit(resource.RLIMIT_CORE, 0)
    if filter_program is not None:
        install_filter(filter_program)


def guard() -> None:
    """What the runner's forks inherit, applied once in the runner: Python's socket API refused, and
    upstream's `reliability_guard` (human-eval's, as open-instruct's code_utils.py applies it to the
    process that runs the program and its tests): destructive os, shutil and subprocess calls, exit() and a
    few modules disabled, so that programs behave (and fail) as they did in AI2's runs. The runner itself
    keeps its own references to what it uses of them (_KILLPG, _UNLINK, _RMDIR, _SOCKETPAIR)."""
    import builtins
    import shutil
    import subprocess

    for module in (socket, _socket):
        for name in ("socket", "SocketType", "socketpair", "fromfd", "create_connection", "create_server",
                     "getaddrinfo", "gethostbyname", "gethostbyname_ex", "gethostbyaddr", "getnameinfo"):  # fmt: skip
            if hasattr(module, name):
                setattr(module, name, _NoSocket if name in ("socket", "SocketType") else _no_network)

    builtins.exit = builtins.quit = None
    for name in ("system", "putenv", "remove", "removedirs", "rmdir", "fchdir", "setuid", "forkpty", "killpg",
                 "rename", "renames", "truncate", "replace", "unlink", "fchmod", "fchown", "chmod", "chown",
                 "chroot", "lchflags", "lchmod", "lchown", "getcwd", "chdir"):  # fmt: skip
        setattr(os, name, None)
    shutil.rmtree = shutil.move = shutil.chown = None
    subprocess.Popen = None
    for name in ("ipdb", "joblib", "resource", "psutil", "tkinter"):
        sys.modules[name] = None


def record(report: int, kind: str, index: int, payload: bytes = b"") -> None:
    """One record for the verifier, in one write (module docstring)."""
    data = f"{kind} {index} {len(payload)}\n".encode() + payload
    while data:
        data = data[os.write(report, data) :]


def read_spec(fd: int, index: int) -> dict:
    """Test `index` of the tests' file (the verifier's `code.tests_file`)."""
    count = _INDEX.unpack(os.pread(fd, 8, 0))[0]
    if index >= count:
        raise ValueError(f"no test {index} of {count}")
    start, end = struct.unpack("<2Q", os.pread(fd, 16, 8 + 8 * index))
    return json.loads(os.pread(fd, end - start, start))


def _keep_only(needed: set) -> None:
    """Close every descriptor from 3 on but `needed` (what the runner holds for others)."""
    for fd in sorted(int(n) for n in os.listdir("/proc/self/fd") if n.isdigit()):
        if fd > 2 and fd not in needed:
            try:
                os.close(fd)
            except OSError:
                pass


def _tests(job: dict, tests_fd: int, control, place: Place) -> None:
    """The tests' process: confined once, then each test the runner hands it (its index, and the channel's
    two ends for it, over `control`), its verdict sent back there, until the runner closes `control`."""
    seconds = job["seconds"] + (STDIO_MARGIN if job["stdio"] else 0.0)
    # the program's processes share its user and PID namespace: the signals it could send to interrupt a
    # test midway are ignored (SIGSTOP and SIGKILL end in the runner's kill: a timeout, or a lost verdict)
    for number in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2,
                   signal.SIGTSTP, signal.SIGTTIN, signal.SIGTTOU):  # fmt: skip
        signal.signal(number, signal.SIG_IGN)
    confine(job, place.filter, (seconds + SLACK) * job["tests"])
    while True:
        message, fds, _, _ = socket.recv_fds(control, 64, 2)
        if not message:
            return
        try:
            spec = read_spec(tests_fd, _INDEX.unpack(message)[0])
            if job["stdio"]:
                verdict = code_harness.run(spec, seconds, exchange=lambda data: _exchange(control, data),
                                           output_bytes=OUTPUT_BYTES)  # fmt: skip
            else:
                verdict = code_harness.run(spec, seconds, channel=tuple(fds))
            control.sendall(verdict)
        finally:
            for fd in fds:
                os.close(fd)


def _exchange(control, data: bytes) -> tuple[int, bytes]:
    """The tests' process's side of a stdio test: the input as an unnamed file in the scratch directory,
    handed to the runner; the program's status and its output file back (read here, up to OUTPUT_BYTES + 1)."""
    fd = os.open(".", os.O_TMPFILE | os.O_RDWR, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.lseek(fd, 0, os.SEEK_SET)
        socket.send_fds(control, [b"I"], [fd])
    finally:
        os.close(fd)
    message, fds, _, _ = socket.recv_fds(control, 8, 1)
    if len(message) != 1 or len(fds) != 1:
        raise code_harness.Spoiled("the runner sent no output")
    try:
        size = os.fstat(fds[0]).st_size
        return message[0], os.pread(fds[0], min(size, OUTPUT_BYTES + 1), 0)
    finally:
        os.close(fds[0])


def _program(job: dict, channel: tuple, place: Place) -> None:
    """The program's process: `channel` its two descriptors, or for stdio its input and output files."""
    try:
        if place.mounts is not None:
            own_namespaces(job, place)
        else:
            os.setpgid(0, 0)
    except OSError as e:  # said on the channel, as a program that failed to load (the test names the step)
        if not job["stdio"]:
            code_channel.send(channel[1], b"L", f"the program's process could not be set up: {e}".encode()[:1000])
        os._exit(1)
    if job["stdio"]:
        os.dup2(channel[0], 0)
        os.dup2(channel[1], 1)
        for fd in channel:
            os.close(fd)
    confine(job, place.filter, job["seconds"])
    if job["stdio"]:
        os._exit(code_program.run_stdio(job["program"]))
    code_program.serve(job["program"], *channel)


def _fork(work, needed: set) -> int:
    pid = os.fork()
    if pid == 0:
        try:
            signal.signal(signal.SIGALRM, signal.SIG_DFL)
            _keep_only(needed)
            work()
        finally:
            os._exit(0)
    return pid


def _clear(scratch: str) -> None:
    """Remove what a test's program left in the scratch directory (by the runner's own references: `guard`
    disabled os.unlink and shutil.rmtree)."""
    for entry in list(os.scandir(scratch)):
        try:
            if entry.is_dir(follow_symlinks=False):
                _clear(entry.path)
                _RMDIR(entry.path)
            else:
                _UNLINK(entry.path)
        except OSError:
            pass


class _Tests:
    """The tests' process of the run, started when needed (and again after one was killed)."""

    def __init__(self, job: dict, tests_fd: int, place: Place):
        # made here, before any filter: the tests' process receives each test's channel on it (SCM_RIGHTS)
        self.control, theirs = _SOCKETPAIR(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.pid = _fork(lambda: _tests(job, tests_fd, theirs, place), {tests_fd, theirs.fileno()})
        theirs.close()

    def stop(self) -> None:
        self.control.close()
        try:
            os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)
        except (OSError, ChildProcessError):
            pass


def _end(program: int, tests: _Tests | None, namespaces: bool) -> bool:
    """Kill every process of the test but the runner and the tests' process, and reap them; False when the
    tests' process is gone too."""
    alive = tests is not None
    if namespaces:  # every other process of the PID namespace, as many times as it takes (they may fork)
        if program is not None:
            try:
                os.kill(program, signal.SIGKILL)
                os.waitpid(program, 0)
            except (ProcessLookupError, ChildProcessError):  # (wait_child reaped it)
                pass
        while True:
            others = [int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) not in (1, tests and tests.pid)]
            if not others:
                return alive
            for pid in others:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            while (reaped := _reap()) is not None:
                alive = alive and reaped != tests.pid
            time.sleep(0.0002)
    if program is not None:
        try:
            _KILLPG(program, signal.SIGKILL)
        except OSError:
            pass
        try:
            os.waitpid(program, 0)
        except ChildProcessError:  # (wait_child reaped it)
            pass
    return alive


def wait_child(pid: int, seconds: float) -> int | None:
    """The exit status of child `pid`, or None past `seconds` (then it is killed and reaped)."""
    deadline = time.monotonic() + seconds
    try:
        handle = os.pidfd_open(pid)
    except (AttributeError, OSError):
        handle = None
    try:
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                return status
            left = deadline - time.monotonic()
            if left <= 0:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                return None
            if handle is not None:
                select.select([handle], [], [], left)
            else:
                time.sleep(min(left, 0.002))
    finally:
        if handle is not None:
            os.close(handle)


def _reap() -> int | None:
    try:
        pid, _ = os.waitpid(-1, os.WNOHANG)
    except ChildProcessError:
        return None
    return pid or None


def _receive(tests: _Tests, deadline: float, fds: int = 0):
    """(message, descriptors) from the tests' process by `deadline`: None past it, b"" when it is gone."""
    while time.monotonic() < deadline:
        if select.select([tests.control], [], [], max(0.0, deadline - time.monotonic()))[0]:
            try:
                message, received, _, _ = socket.recv_fds(tests.control, code_harness.REASON_CHARS + 8, fds)
            except OSError:
                return b"", []
            return message, received
    return None, []


def _start(job: dict, files: tuple, place: Place) -> int:
    """The program's process of a test, under namespaces PID 1 of a PID namespace of its own (the runner's
    next child goes there, after which the runner's children are its own namespace's again: setns(2) to
    its own resets that, and so allows the next unshare)."""
    if place.pids is None:
        program = _fork(lambda: _program(job, files, place), set(files))
        try:
            os.setpgid(program, program)
        except OSError:  # it has already done so, or is gone
            pass
        return program
    call("unshare", CLONE_NEWPID, what="PID namespaces")
    try:
        return _fork(lambda: _program(job, files, place), {*files, place.mounts, place.root})
    finally:
        call("setns", place.pids, CLONE_NEWPID, what="PID namespaces")


def one(job: dict, index: int, tests: _Tests, place: Place) -> tuple[str, bytes, bool]:
    """Test `index` (module docstring): its verdict's kind and reason ("L" in the kind where the program
    failed to load), and whether the tests' process is still there for the next."""
    deadline = time.monotonic() + job["seconds"] + STDIO_MARGIN + SLACK
    program = None
    try:
        if job["stdio"]:  # the input file from the tests' process, the program run on it, its output back
            socket.send_fds(tests.control, [_INDEX.pack(index)], [])
            said, received = _receive(tests, deadline, 1)
            if said == b"I" and len(received) == 1:
                output = os.open(".", os.O_TMPFILE | os.O_RDWR, 0o600)
                program = _start(job, (received[0], output), place)
                status = wait_child(program, job["seconds"])
                code = 2 if status is None else 0 if os.waitstatus_to_exitcode(status) == 0 else 1
                socket.send_fds(tests.control, [bytes([code])], [output])
                os.close(output)
                said, _ = _receive(tests, deadline)
            for fd in received:
                os.close(fd)
        else:  # the channel: a pipe each way, the program's ends to its process, the others to the tests'
            to_program, to_tests = os.pipe(), os.pipe()
            program = _start(job, (to_program[0], to_tests[1]), place)
            socket.send_fds(tests.control, [_INDEX.pack(index)], [to_tests[0], to_program[1]])
            for fd in (*to_program, *to_tests):
                os.close(fd)
            said, _ = _receive(tests, deadline)
    except OSError:
        said = b""
    alive = bool(said)
    if not alive:
        tests.stop()
    alive = _end(program, tests if alive else None, job["isolation"] == "namespaces") and alive
    if place.mounts is None:  # (under namespaces each program's process had a scratch of its own)
        _clear(".")
    if said is None:
        return "t", b"past the time limit (killed)", alive
    kind, _, reason = said.partition(b" ")
    if kind not in (b"p", b"f", b"r", b"t", b"fL", b"tL"):
        return "f", b"the tests' process ended without a verdict", alive
    return kind.decode(), reason, alive


def pause(took: float, quickest: float) -> float:
    """The wait before a row's next test: random, up to twice what the test before took past the run's
    quickest (at most PAUSE). A program that ends its test at a clock phase of its choosing (a test's input,
    encoded) would have the next test's program read it back; waiting for that phase lengthens its test, and
    the wait blurs the phase by more than that, while honest tests, which take about as long as each other,
    wait next to nothing (a test that ran out of time ended when its timer chose: `run` does not wait after it).
    From the kernel's generator: a program's process is a fork of this one, and would know the state of
    Python's `random` here (docs/rewards-code.md: what remains of the channel)."""
    return min(2 * max(0.0, took - quickest), PAUSE) * int.from_bytes(os.urandom(4), "little") / (1 << 32)


def run(job: dict, report: int, tests_fd: int, mounts: int | None = None) -> None:
    """Every test of the job (module docstring), its record written as it ends; `mounts`, under isolation
    namespaces, a descriptor of the sandbox's mount namespace (code_sandbox `enter`)."""
    for name in job["preload"]:  # modules the program or the tests import, once here rather than per test
        try:
            __import__(name)
        except BaseException:  # noqa: BLE001 (the program's or test's import fails there, as it would)
            pass
    namespaces = job["isolation"] == "namespaces"
    place = Place()
    if namespaces:
        window = memory_window(job["memory_mb"] << 20)
        pids = os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
        place = Place(code_seccomp.program(platform.machine(), window), mounts, pids)
        resource.setrlimit(resource.RLIMIT_NPROC, (job["processes"], job["processes"]))
    elif sys.platform == "linux":
        call("prctl", PR_SET_DUMPABLE, 0, 0, 0, 0)
    guard()
    # what the runner holds stays out of the collector's reach: a collection in a fork would touch (and so
    # copy) every page of it
    gc.freeze()
    failed, tests, took, quickest = None, None, 0.0, _QUICK
    for index in range(job["tests"]):
        if failed is not None:
            record(report, failed, index, b"the program failed to load (an earlier test)")
            continue
        tests = tests or _Tests(job, tests_fd, place)
        time.sleep(pause(took, quickest))
        start = time.monotonic()
        kind, reason, alive = one(job, index, tests, place)
        took = time.monotonic() - start if kind[0] != "t" else 0.0
        quickest = min(quickest, took) if took else quickest
        if not alive:
            tests = None
        if kind.endswith("L"):
            kind = failed = kind[0]
        record(report, kind, index, reason)
