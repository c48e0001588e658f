"""The code verifier's child process, and the namespace sandbox it enters.

olmax.rewards.code starts `python -I -c <BOOTSTRAP>`: the bootstrap reads, on stdin, this module and the
others the child needs (code_values, code_program, code_harness, code_runner, code_seccomp: compiled
by the verifier, marshalled, made modules here), then the job as JSON: the program, the number of tests and
the limits. The tests themselves are in a file the verifier opened for it (the job names its descriptor),
which only each test's own process reads (olmax.rewards.code_runner). No path of the caller's shows in the
sandbox's /proc/<pid>/cmdline, and nothing of the files the child came from is in view once it is inside.
It writes one record per test to its stdout (code_runner `record`), which the verifier reads
(olmax.rewards.code_records).

Isolation none: the runner (code_runner `run`) is this process.

Isolation namespaces (Linux): two processes, then each test's own.
- The keeper (this process): enters new user, PID, network, IPC, UTS and cgroup namespaces (unshare(2);
  the cgroup namespace shows the program its cgroups as "/", not the host's paths: cgroup_namespaces(7)),
  maps only its own uid and gid into the user namespace, forks the init and waits for it, killing it at
  the job's bound. It stays outside the PID namespace, where nothing of the program can address it.
- The init (PID 1 of the new PID namespace): builds the root (below) in a mount namespace of its own,
  pivots into it, moves itself into a copy of that namespace while its root stays in the original (so
  that /proc/<pid>/mountinfo lists no mount: `_enter_root`), names the UTS namespace "sandbox" (it
  starts with the host's name), and is the runner: for each test it forks the tests' process and the
  program's, which drop every capability and confine themselves (code_runner), and after the test kills
  every other process of the namespace (kill(2) of -1 by its init). When it exits, the kernel kills
  every process left in the namespace and waits for them (kernel/pid_namespace.c `zap_pid_ns_processes`)
  before the keeper's wait returns, so nothing the program started outlives the call, whatever it did with
  sessions and process groups. It keeps its capabilities and is not dumpable, so the program can neither
  trace nor signal it (PID 1 ignores signals from its namespace), nor read its memory or descriptors.

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

import json
import os
import signal
import sys

from olmax.rewards import code_runner
from olmax.rewards.code_runner import SetupError, call

# <linux/sched.h>, <linux/mount.h>, <linux/prctl.h>
CLONE_NEWNS, CLONE_NEWCGROUP, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x02000000, 0x04000000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT = 1, 2, 4, 8, 32
MS_NOATIME, MS_NODIRATIME, MS_BIND, MS_REC, MS_PRIVATE, MS_RELATIME = 1024, 2048, 4096, 16384, 1 << 18, 1 << 21
MNT_DETACH = 2
PR_SET_PDEATHSIG, PR_SET_DUMPABLE = 1, 4
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
    call("unshare", CLONE_NEWNS)
    call("mount", None, b"/", None, MS_REC | MS_PRIVATE, None)
    call("mount", b"tmpfs", STAGE.encode(), b"tmpfs", MS_NOSUID | MS_NODEV, b"mode=0755,size=1m")
    os.mkdir(f"{STAGE}/old")
    call("pivot_root", STAGE.encode(), f"{STAGE}/old".encode())
    os.chdir("/")
    os.mkdir("/new")
    call("mount", b"tmpfs", b"/new", b"tmpfs", MS_NOSUID | MS_NODEV, b"mode=0755,size=1m")
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
        call("mount", f"/old{path}".encode(), target.encode(), None, MS_BIND | MS_REC, None)
    for name in ("/proc", scratch):
        os.mkdir(f"/new{name}")
    for target in ["/new"] + _mounts_under(["/new" + p for p in binds if p not in DEVICES]):
        flags = MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV
        have = os.statvfs(target).f_flag
        flags |= sum(ms for st, ms in LOCKED if have & st)
        call("mount", None, target.encode(), None, flags, None)


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
    call("prctl", PR_SET_DUMPABLE, 1, 0, 0, 0)  # the uid change made it 0: /proc/self/uid_map would be root's


def _unescape(field: str) -> str:
    # mountinfo writes space, tab, newline and backslash as octal escapes (proc(5))
    head, *rest = field.split("\\")
    return head + "".join(chr(int(part[:3], 8)) + part[3:] for part in rest)


def _enter_root(job: dict, scratch: str) -> int:
    """In the init, in a mount namespace of its own: /proc of the PID namespace and the scratch tmpfs
    (owned by the sandbox's uid), then /new becomes the root and the caller's is detached. Returns a
    descriptor of that mount namespace, which the init keeps open (the runner closes its copy)."""
    call("unshare", CLONE_NEWNS)
    # pivot_root refuses a new root locked by a less privileged copy of the namespace (root stages it
    # in the caller's user namespace); a bind of it onto itself is this namespace's own (fs/namespace.c
    # `__do_loopback` unlocks the top), its read-only flag still locked
    call("mount", b"/new", b"/new", None, MS_BIND | MS_REC, None)
    flags = MS_NOSUID | MS_NODEV | MS_NOEXEC
    call("mount", b"proc", b"/new/proc", b"proc", flags, None)
    # no user namespace below this one: without it the program, holding no capability here, cannot
    # make a mount or network namespace of its own either (less of the kernel within its reach)
    _write("/new/proc/sys/user/max_user_namespaces", "0")
    # the program's /proc holds the processes' directories alone (proc(5) "subset=pid", Linux 5.8): not
    # the host's files at its top (cmdline, config.gz, kallsyms, keys, partitions, sysvipc, sys, ...)
    call("umount2", b"/new/proc", 0)
    call("mount", b"proc", b"/new/proc", b"proc", flags, b"subset=pid", what="/proc subset=pid (Linux 5.8)")
    # nr_inodes: an inode (and a link, which tmpfs counts as one) is kernel memory the size does not count
    size = f"mode=0700,size={job['scratch_bytes']},nr_inodes={job['scratch_inodes']}".encode()
    call("mount", b"tmpfs", f"/new{scratch}".encode(), b"tmpfs", MS_NOSUID | MS_NODEV, size)
    os.chdir("/new")
    call("pivot_root", b".", b".")
    call("umount2", b".", MNT_DETACH)
    # the sandbox's processes live in a copy of this namespace while their root stays in this one, so that
    # /proc/<pid>/mountinfo lists none of its mounts (code_runner.hide_mounts). The descriptor keeps this
    # namespace (and its mounts) while the init lives; each program's process makes its own from it.
    keep = code_runner.hide_mounts()
    os.chdir(scratch)
    return keep


def enter(job: dict, report: int) -> int:
    """Enter the sandbox (module docstring). Returns in the init, the runner, a descriptor of the sandbox's
    mount namespace (`_enter_root`); the keeper exits here. A failed step is reported as an "error" record
    naming it, and ends the process."""
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
        call("unshare", spaces, what="namespaces (user, PID, network, IPC, UTS, cgroup)")
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
        call("prctl", PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if not staged:
            _stage(scratch)
        mounts = _enter_root(job, scratch)
        call("sethostname", HOSTNAME, len(HOSTNAME))
        call("prctl", PR_SET_DUMPABLE, 0, 0, 0, 0)
    except OSError as e:
        _fail(report, e)
    os.environ.update(HOME=scratch, TMPDIR=scratch)
    job["scratch"] = scratch
    return mounts


def _fail(report: int, error: OSError) -> None:
    code_runner.record(report, "error", 0, str(error.strerror or error).encode())
    os._exit(1)


def main(stream) -> None:
    """The child's work, after the bootstrap made its modules: the job from `stream`, then its tests."""
    job = json.loads(stream.read())
    report = os.dup(1)
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.close(null)
    mounts = enter(job, report) if job["isolation"] == "namespaces" else None
    code_runner.run(job, report, job["tests_fd"], mounts)
