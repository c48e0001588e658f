"""The code sandbox's system call filter: a seccomp(2) program (classic BPF, SECCOMP_MODE_FILTER) that the
sandbox's runner installs last, after its own setup and just before the untrusted program runs
(olmax.rewards.code_sandbox `run_job`; the bytes come from here through the job, so that the child, which
imports nothing of olmax, only installs them).

The namespaces bound what a program can name (files, processes, the network); the filter bounds what it may
ask the kernel for. It is a deny list under a ceiling rather than an allow list: Python and its standard
library make a wide set of calls that changes with the C library, and an allow list that missed one would
fail honest programs, while every call it denies is one no honest program of the verifier makes (the
guard already disables Python's sockets, subprocess and threads for them). What it refuses, and why:

- memory that the address-space limit (RLIMIT_AS, the per-process bound) does not count: files in memory
  (memfd_create(2), memfd_secret(2)), System V shared memory, message queues and semaphores (svipc(7): a
  segment outlives its attachment, a queue holds what was sent), POSIX message queues (mq_overview(7)),
  pages pinned in a pipe after they were unmapped (vmsplice(2)), io_uring's registered buffers, BPF maps,
  perf ring buffers, userfaultfd and inotify/fanotify watches: each holds kernel or page memory of its own;
- the kernel keyring (keyrings(7)): the sandbox inherits the caller's session keyring, and the caller's keys
  are the possessor's to read, list, revoke or change (add_key(2), request_key(2), keyctl(2));
- sockets, all of them (socket(2), socketpair(2)): the sandbox has no network to reach (its namespace's
  loopback is down, and the guard already refuses Python's socket API), and a socket is kernel memory the
  process limits do not bound: a TCP socket mapped with mmap (TCP zerocopy receive) outlives its close(),
  with a reuseport cBPF program and TCP_MD5SIG keys attached (a review held ~270 MiB of kernel memory so,
  1,000 sockets under memory_mb=64 and RLIMIT_NOFILE 64); AF_VSOCK reaches the host's port space
  (vsock(7)), netlink the kernel's, AF_UNIX buffers are memory outside the address space (socket(7)
  SO_SNDBUF) and carry descriptors in flight. Without socket(2) no socket exists in the sandbox (nothing
  passes one in: no AF_UNIX, no pidfd_getfd, no io_uring), so setsockopt(2) and mmap of one need no rule;
- kernel objects that no process limit counts and that outlive the descriptors bounding the rest: Linux
  AIO contexts (io_setup(2) and the calls on them: the host-wide fs.aio-max-nr, 65,536, taken whole by one
  sandbox, so that another user's io_setup got EAGAIN; a pending IOCB_CMD_POLL keeps its file, a pipe's
  64 KiB, past close(), 4,000 of them 87 MiB), and epoll (epoll_create(2), epoll_ctl(2): each watch is
  kernel memory, counted only against the user's fs.epoll.max_user_watches, 5.5 M here, +1.1 GiB; a
  program at the sandbox's uid spent it for every process of that uid, which then got ENOSPC). Python's
  asyncio and selectors need neither here (asyncio's self-pipe is a socketpair, already refused);
- pipe buffers grown past their default (fcntl(2) F_SETPIPE_SZ): with RLIMIT_NOFILE that keeps every pipe at
  64 KiB; and POSIX and open-file-description record locks (fcntl(2) F_SETLK, F_SETLKW, F_OFD_SETLK,
  F_OFD_SETLKW): each lock on a byte range is kernel memory, any number of them per file (RLIMIT_LOCKS has
  not been enforced since Linux 2.4.25: getrlimit(2)); flock(2), one lock per open file, stays. EPERM
  rather than ENOLCK, which SQLite takes for a busy lock and retries until its timeout (5 s in Python's
  sqlite3): a file database fails at once (":memory:" ones need no lock);
- namespaces and mounts (unshare(2), setns(2), clone(2) with a CLONE_NEW* flag, mount(2) and the new mount
  API, statmount/listmount, which show the mounts' sources): the sandbox's own setup is done;
- other processes' memory (ptrace(2), process_vm_readv(2), pidfd_getfd(2)): within the sandbox, the runner
  that reports the outcomes;
- administration calls (modules, kexec, reboot, swap, clocks, quotas, file handles, x86 port I/O): each
  needs a capability the program does not hold, refused so that a kernel bug behind one is out of reach;
- page tables spread over the address space: a mapping, an unmapping or a move (mmap(2) with an address,
  munmap(2), mremap(2) with MREMAP_FIXED) anywhere but in the process's memory window (`Window`: from its
  lowest mapping of libraries and anonymous memory, less room to grow by 1.5 times its address-space
  limit, up to its highest one), or of more than that limit at once; and remap_file_pages(2), outright.
  RLIMIT_AS counts the pages mapped, not the page tables the kernel makes for them: one page touched at
  each of 65,000 addresses a GiB apart (by address hints, or by unmapping all but one page of each
  mapping so that the next lands further down) held ~8 KiB of page tables each, +509 MiB in one process.
  Inside the window, at most one 4 KiB table per 2 MiB of it. mmap(2) without an address is allowed
  (the kernel places it just below what the process holds);
- clone3(2) with ENOSYS: its flags are in memory, which a filter cannot read (seccomp(2) "Caveats"); the C
  library falls back to clone(2), whose flags the filter checks;
- every number at or past CEILING (ENOSYS): a call added to a later kernel is refused until it is judged
  here; on x86_64 that includes the x32 ABI's numbers (bit 30 set: arch/x86/include/uapi/asm/unistd.h).

Before all of that the filter checks the architecture of the call (seccomp_data.arch) and kills the process
on any other: system call numbers differ between architectures, so a filter that reads one table must not
judge calls of another (seccomp(2), on the arch field; x86's 32-bit int 0x80 calls come with
AUDIT_ARCH_I386, arm64's 32-bit ones with AUDIT_ARCH_ARM). A machine without a table here has no filter:
`program` raises, and the sandbox refuses to run (fail closed). `decide` runs the filter on a call without a
kernel (the tests read both machines' filters through it).
"""

from __future__ import annotations

import struct

# <linux/audit.h>: AUDIT_ARCH_X86_64 (EM_X86_64 | 64BIT | LE), AUDIT_ARCH_AARCH64 (EM_AARCH64 | 64BIT | LE)
AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
CEILING = 470  # past file_setattr (469, Linux 6.17), the newest call judged here; both tables share 424 on
# <linux/seccomp.h> return values, and the errnos they carry (errno-base.h, errno.h)
RET_KILL_PROCESS, RET_ERRNO, RET_ALLOW = 0x80000000, 0x00050000, 0x7FFF0000
EPERM, ENOSYS = 1, 38
# <linux/bpf_common.h>: BPF_LD|BPF_W|BPF_ABS, BPF_JMP|BPF_JEQ|BPF_K, BPF_JMP|BPF_JGE|BPF_K, BPF_JMP|BPF_JSET|BPF_K,
# BPF_RET|BPF_K
LD, JEQ, JGT, JGE, JSET, RET = 0x20, 0x15, 0x25, 0x35, 0x45, 0x06
# struct seccomp_data {int nr; __u32 arch; __u64 instruction_pointer; __u64 args[6];}: the low half of args[i]
# is at 16 + 8 i on a little-endian machine (both here; a big-endian arm64 reports another arch and is killed)
NR, ARCH = 0, 4
# fcntl(2) commands refused: <linux/fcntl.h> F_SETPIPE_SZ (F_LINUX_SPECIFIC_BASE + 7), <asm-generic/fcntl.h>
# F_SETLK, F_SETLKW, F_OFD_SETLK, F_OFD_SETLKW
FCNTL_DENIED = (1031, 6, 7, 37, 38)
MREMAP_FIXED = 2  # <linux/mman.h>
# <linux/sched.h>: CLONE_NEWNS, CLONE_NEWCGROUP, CLONE_NEWUTS, CLONE_NEWIPC, CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET
CLONE_NEW = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000

# the calls named below, by number: from 424 on one table for every architecture (scripts/syscall.tbl);
# before it x86_64's arch/x86/entry/syscalls/syscall_64.tbl and, for aarch64, the generic
# include/uapi/asm-generic/unistd.h (tests/test_code_sandbox.py checks both against the installed headers)
_SHARED = {
    "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427, "open_tree": 428, "move_mount": 429,
    "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433, "clone3": 435, "pidfd_getfd": 438,
    "process_madvise": 440, "mount_setattr": 442, "quotactl_fd": 443, "memfd_secret": 447, "process_mrelease": 448,
    "statmount": 457, "listmount": 458, "open_tree_attr": 467,
}  # fmt: skip
# the calls whose addresses the memory window bounds, and the one refused for it
_MEMORY = {"x86_64": {"mmap": 9, "munmap": 11, "mremap": 25, "remap_file_pages": 216},
           "aarch64": {"mmap": 222, "munmap": 215, "mremap": 216, "remap_file_pages": 234}}  # fmt: skip
NUMBERS = {
    "x86_64": {
        **_SHARED,
        "shmget": 29, "shmat": 30, "shmctl": 31, "socket": 41, "socketpair": 53, "clone": 56, "semget": 64,
        "io_setup": 206, "io_destroy": 207, "io_getevents": 208, "io_submit": 209, "io_cancel": 210,
        "epoll_create": 213, "epoll_ctl": 233, "epoll_create1": 291, "io_pgetevents": 333,
        "semop": 65, "semctl": 66, "shmdt": 67, "msgget": 68, "msgsnd": 69, "msgrcv": 70, "msgctl": 71,
        "fcntl": 72, "ptrace": 101, "syslog": 103, "uselib": 134, "ustat": 136, "sysfs": 139, "vhangup": 153,
        "modify_ldt": 154, "pivot_root": 155, "_sysctl": 156, "adjtimex": 159, "chroot": 161, "acct": 163,
        "settimeofday": 164, "mount": 165, "umount2": 166, "swapon": 167, "swapoff": 168, "reboot": 169,
        "iopl": 172, "ioperm": 173, "init_module": 175, "delete_module": 176, "quotactl": 179, "nfsservctl": 180,
        "lookup_dcookie": 212, "semtimedop": 220, "clock_settime": 227, "mq_open": 240, "mq_unlink": 241,
        "mq_timedsend": 242, "mq_timedreceive": 243, "mq_notify": 244, "mq_getsetattr": 245, "kexec_load": 246,
        "add_key": 248, "request_key": 249, "keyctl": 250, "inotify_init": 253, "unshare": 272, "vmsplice": 278,
        "inotify_init1": 294, "perf_event_open": 298, "fanotify_init": 300, "name_to_handle_at": 303,
        "open_by_handle_at": 304, "clock_adjtime": 305, "setns": 308, "process_vm_readv": 310,
        "process_vm_writev": 311, "finit_module": 313, "memfd_create": 319, "kexec_file_load": 320, "bpf": 321,
        "userfaultfd": 323, **_MEMORY["x86_64"],
    },
    "aarch64": {
        **_SHARED,
        "io_setup": 0, "io_destroy": 1, "io_submit": 2, "io_cancel": 3, "io_getevents": 4, "epoll_create1": 20,
        "epoll_ctl": 21, "io_pgetevents": 292,
        "lookup_dcookie": 18, "fcntl": 25, "inotify_init1": 26, "umount2": 39, "mount": 40, "pivot_root": 41,
        "nfsservctl": 42, "chroot": 51, "vhangup": 58, "quotactl": 60, "vmsplice": 75, "acct": 89, "unshare": 97,
        "kexec_load": 104, "init_module": 105, "delete_module": 106, "clock_settime": 112, "syslog": 116,
        "ptrace": 117, "reboot": 142, "settimeofday": 170, "adjtimex": 171, "mq_open": 180, "mq_unlink": 181,
        "mq_timedsend": 182, "mq_timedreceive": 183, "mq_notify": 184, "mq_getsetattr": 185, "msgget": 186,
        "msgctl": 187, "msgrcv": 188, "msgsnd": 189, "semget": 190, "semctl": 191, "semtimedop": 192,
        "semop": 193, "shmget": 194, "shmctl": 195, "shmat": 196, "shmdt": 197, "socket": 198, "socketpair": 199,
        "add_key": 217, "request_key": 218, "keyctl": 219, "clone": 220, "swapon": 224, "swapoff": 225,
        "perf_event_open": 241, "fanotify_init": 262, "name_to_handle_at": 264, "open_by_handle_at": 265,
        "clock_adjtime": 266, "setns": 268, "process_vm_readv": 270, "process_vm_writev": 271,
        "finit_module": 273, "memfd_create": 279, "bpf": 280, "userfaultfd": 282, "kexec_file_load": 294,
        **_MEMORY["aarch64"],
    },
}  # fmt: skip

# refused outright with EPERM, by reason (the module docstring); a name an architecture lacks is skipped
DENIED = {
    "memory outside the address space": (
        "memfd_create", "memfd_secret", "shmget", "shmat", "shmctl", "shmdt", "msgget", "msgsnd", "msgrcv",
        "msgctl", "semget", "semop", "semtimedop", "semctl", "mq_open", "mq_unlink", "mq_timedsend",
        "mq_timedreceive", "mq_notify", "mq_getsetattr", "vmsplice", "userfaultfd", "io_uring_setup",
        "io_uring_enter", "io_uring_register", "bpf", "perf_event_open", "inotify_init", "inotify_init1",
        "fanotify_init",
    ),
    "kernel objects past the process limits": (
        "io_setup", "io_destroy", "io_submit", "io_cancel", "io_getevents", "io_pgetevents", "epoll_create",
        "epoll_create1", "epoll_ctl",
    ),
    "page tables outside the memory window": ("remap_file_pages",),
    "sockets": ("socket", "socketpair"),
    "the kernel keyring": ("add_key", "request_key", "keyctl"),
    "namespaces and mounts": (
        "unshare", "setns", "mount", "umount2", "pivot_root", "chroot", "open_tree", "move_mount", "fsopen",
        "fsconfig", "fsmount", "fspick", "mount_setattr", "open_tree_attr", "statmount", "listmount",
    ),
    "other processes": (
        "ptrace", "process_vm_readv", "process_vm_writev", "pidfd_getfd", "process_madvise", "process_mrelease",
    ),
    "administration": (
        "init_module", "finit_module", "delete_module", "kexec_load", "kexec_file_load", "reboot", "swapon",
        "swapoff", "acct", "syslog", "quotactl", "quotactl_fd", "settimeofday", "clock_settime", "clock_adjtime",
        "adjtimex", "lookup_dcookie", "name_to_handle_at", "open_by_handle_at", "vhangup", "nfsservctl", "iopl",
        "ioperm", "modify_ldt", "uselib", "ustat", "sysfs", "_sysctl",
    ),
}  # fmt: skip


class Unsupported(OSError):
    """No filter for this machine's system calls: the sandbox does not run without one."""


class Window:
    """The addresses [low, high) a process may map at (mmap with an address), unmap or move, and the most
    bytes one such call may cover (`length`): code_runner.memory_window makes one from the process's maps."""

    __slots__ = ("low", "high", "length")

    def __init__(self, low: int, high: int, length: int):
        if not 0 < low < high < 1 << 64 or not 0 < length < 1 << 64:
            raise ValueError(f"not a memory window: {low:#x}-{high:#x}, {length} bytes")
        self.low, self.high, self.length = low, high, length


def _insn(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    # struct sock_filter {__u16 code; __u8 jt; __u8 jf; __u32 k;} (<linux/filter.h>), native byte order
    return struct.pack("=HBBI", code, jt, jf, k)


def _arg(i: int, high: bool = False) -> int:
    return 16 + 8 * i + (4 if high else 0)  # the low (or high) 32 bits of seccomp_data.args[i]


def _assemble(items: list) -> list:
    """Instructions from (code, k, jt, jf) with jumps given as label names (or 0: the next one), and
    ("label", name) marks; classic BPF jumps forward only, at most 255 instructions."""
    places, at = {}, 0
    for item in items:
        if item[0] == "label":
            places[item[1]] = at
        else:
            at += 1
    out, at = [], 0
    for item in items:
        if item[0] == "label":
            continue
        code, k, jt, jf = item
        jt, jf = (places[j] - at - 1 if isinstance(j, str) else j for j in (jt, jf))
        assert 0 <= jt < 256 and 0 <= jf < 256, (jt, jf)
        out.append(_insn(code, k, jt, jf))
        at += 1
    return out


def _within(i: int, window: Window, tag: str) -> list:
    """Continue when args[i] (64 bits) is in [window.low, window.high), else jump to "deny"."""
    low, high = (window.low >> 32, window.low & 0xFFFFFFFF), (window.high >> 32, window.high & 0xFFFFFFFF)
    return [(LD, _arg(i, True), 0, 0), (JGT, low[0], f"{tag}up", 0), (JEQ, low[0], 0, "deny"),
            (LD, _arg(i), 0, 0), (JGE, low[1], f"{tag}up", "deny"), ("label", f"{tag}up"),
            (LD, _arg(i, True), 0, 0), (JGT, high[0], "deny", 0), (JEQ, high[0], 0, f"{tag}in"),
            (LD, _arg(i), 0, 0), (JGE, high[1], "deny", f"{tag}in"), ("label", f"{tag}in")]  # fmt: skip


def _at_most(i: int, limit: int, tag: str) -> list:
    """Continue when args[i] (64 bits) is at most `limit`, else jump to "deny"."""
    return [(LD, _arg(i, True), 0, 0), (JGT, limit >> 32, "deny", 0), (JEQ, limit >> 32, 0, f"{tag}ok"),
            (LD, _arg(i), 0, 0), (JGT, limit & 0xFFFFFFFF, "deny", f"{tag}ok"), ("label", f"{tag}ok")]  # fmt: skip


def _memory(nr: dict, window: Window) -> list:
    """The blocks for mmap, munmap and mremap (module docstring: page tables): each starts by comparing
    the call's number, which stays in the accumulator for the next block where it does not match."""
    blocks = {
        # an address of 0 lets the kernel choose, below what the process holds
        "mmap": [(LD, _arg(0, True), 0, 0), (JEQ, 0, 0, "hinted"), (LD, _arg(0), 0, 0), (JEQ, 0, "allow", 0),
                 ("label", "hinted"), *_within(0, window, "a"), *_at_most(1, window.length, "b")],
        "munmap": [*_within(0, window, "a"), *_at_most(1, window.length, "b")],
        "mremap": [*_within(0, window, "a"), *_at_most(1, window.length, "b"), (LD, _arg(3), 0, 0),
                   (JSET, MREMAP_FIXED, 0, "allow"), *_within(4, window, "c")],
    }  # fmt: skip
    out = []
    for name, body in blocks.items():
        code = _assemble([*body, (RET, RET_ALLOW, 0, 0), ("label", "deny"), (RET, RET_ERRNO | EPERM, 0, 0),
                          ("label", "allow"), (RET, RET_ALLOW, 0, 0)])  # fmt: skip
        out += [_insn(JEQ, nr[name], 0, len(code)), *code]
    return out


def check_machine(machine: str) -> None:
    """Raise Unsupported naming `machine` where there is no filter for it (the sandbox fails closed)."""
    if machine not in NUMBERS:
        raise Unsupported(f"seccomp: no system call filter for {machine} here (there is one for x86_64 and aarch64)")


def program(machine: str, window: Window) -> bytes:
    """The filter for `machine` (platform.machine()) and a process's memory `window`, as the bytes of its
    struct sock_filter array (8 bytes an instruction). Raises Unsupported naming the machine where there
    is no table for it."""
    check_machine(machine)
    nr = NUMBERS[machine]
    out = [
        _insn(LD, ARCH),
        _insn(JEQ, AUDIT_ARCH[machine], 1, 0),
        _insn(RET, RET_KILL_PROCESS),
        _insn(LD, NR),
        _insn(JGE, CEILING, 0, 1),
        _insn(RET, RET_ERRNO | ENOSYS),
        _insn(JEQ, nr["clone3"], 0, 1),
        _insn(RET, RET_ERRNO | ENOSYS),
    ]
    for name in sorted({name for names in DENIED.values() for name in names if name in nr}):
        out += [_insn(JEQ, nr[name], 0, 1), _insn(RET, RET_ERRNO | EPERM)]
    # the calls allowed for some arguments: each block loads an argument and returns, so the number stays
    # in the accumulator for the checks after a block that did not match
    # clone's flags: the kernel reads their low 32 bits (kernel/fork.c: lower_32_bits(clone_flags))
    out += [_insn(JEQ, nr["clone"], 0, 4), _insn(LD, _arg(0)), _insn(JSET, CLONE_NEW, 0, 1)]
    out += [_insn(RET, RET_ERRNO | EPERM), _insn(RET, RET_ALLOW)]
    # fcntl's command (unsigned int): each of FCNTL_DENIED jumps to the EPERM after the last
    checks = [_insn(JEQ, cmd, len(FCNTL_DENIED) - 1 - i, 0) for i, cmd in enumerate(FCNTL_DENIED[:-1])]
    checks.append(_insn(JEQ, FCNTL_DENIED[-1], 0, 1))
    out += [_insn(JEQ, nr["fcntl"], 0, 1 + len(checks) + 2), _insn(LD, _arg(1)), *checks]
    out += [_insn(RET, RET_ERRNO | EPERM), _insn(RET, RET_ALLOW)]
    out += _memory(nr, window)
    out.append(_insn(RET, RET_ALLOW))
    return b"".join(out)


def denied_names(machine: str) -> list[str]:
    """The calls `program(machine)` refuses whatever their arguments (EPERM), sorted."""
    return sorted({name for names in DENIED.values() for name in names if name in NUMBERS[machine]})


def decide(program: bytes, arch: int, nr: int, *args: int) -> int:
    """What the filter `program` returns for the call `nr`(*args) of architecture `arch` (a SECCOMP_RET_*
    value, with its errno): the filter run by a classic BPF interpreter of the instructions `program`
    uses, for tests and for reading the filter without a kernel."""
    data = struct.pack("=IIQ6Q", nr & 0xFFFFFFFF, arch, 0, *(list(args) + [0] * 6)[:6])
    acc, pc = 0, 0
    while True:
        code, jt, jf, k = struct.unpack_from("=HBBI", program, 8 * pc)
        if code == RET:
            return k
        if code == LD:
            acc, pc = struct.unpack_from("=I", data, k)[0], pc + 1
            continue
        taken = {JEQ: acc == k, JGT: acc > k, JGE: acc >= k, JSET: bool(acc & k)}[code]
        pc += 1 + (jt if taken else jf)
