"""The code sandbox's system call filter (olmax.rewards.code_seccomp): its decisions for every call number
of each architecture through its own BPF interpreter, checked against the kernel's numbering where the
headers are installed; then, in the sandbox, every refused call failing with EPERM, a 32-bit call
killing the program, and an honest program's standard library still running. The sandbox's other
boundaries are tests/rewards/test_code_sandbox.py's, its kernel resources tests/rewards/test_code_kernel.py's.
"""

from __future__ import annotations

import functools
import os
import platform
import re

import pytest

from olmax.rewards import code
from olmax.rewards import code_seccomp as sc

sandboxed = pytest.mark.usefixtures("code_sandbox")  # skips, naming the probe's finding, where there is none

# upstream's guard refuses a program that says "import os": the module is reached another way
PRELUDE = (
    "import ctypes, fcntl, mmap, struct, sys\nos = __import__('o' + 's')\n"
    "libc = ctypes.CDLL(None, use_errno=True)\nL = ctypes.c_long\n"
)


def _outcome(program: str, test: str) -> str:
    return code.run_tests(program, [test], seconds=2.0, memory_mb=code.MEMORY_MB, isolation="namespaces")[0]


# a memory window (code_seccomp.Window) as code_runner.memory_window makes one: 1 GiB of room below libraries
WINDOW = sc.Window(0x7F0000000000, 0x7F0080000000, 1 << 30)


@pytest.mark.parametrize("machine", ["aarch64", "x86_64"])
def test_the_memory_window_bounds_where_mappings_go(machine):
    """mmap with an address, munmap and mremap's addresses inside the window only, and no more than its
    length at once; mmap without an address anywhere (the kernel places it below what the process holds)."""
    program, nr = sc.program(machine, WINDOW), sc.NUMBERS[machine]
    decide = functools.partial(sc.decide, program, sc.AUDIT_ARCH[machine])
    eperm, inside, page = sc.RET_ERRNO | sc.EPERM, WINDOW.low + (123 << 12), 4096
    for addr in (0, WINDOW.low, inside, WINDOW.high - page):
        assert decide(nr["mmap"], addr, page, 3, 0x22) == sc.RET_ALLOW, hex(addr)
    for addr in (1 << 16, WINDOW.low - page, WINDOW.high, 1 << 40, (1 << 47) - page, WINDOW.low + (1 << 32)):
        assert decide(nr["mmap"], addr, page, 3, 0x32) == decide(nr["munmap"], addr, page) == eperm, hex(addr)
        assert decide(nr["mremap"], addr, page, 2 * page, 1) == eperm, hex(addr)
    for length in (WINDOW.length + 1, 1 << 32, (1 << 32) + page):
        assert decide(nr["munmap"], inside, length) == decide(nr["mmap"], inside, length, 3, 0x32) == eperm
    assert decide(nr["munmap"], inside, WINDOW.length) == decide(nr["munmap"], WINDOW.low, page) == sc.RET_ALLOW
    assert decide(nr["mremap"], inside, page, 2 * page, 1) == sc.RET_ALLOW  # MREMAP_MAYMOVE: the kernel chooses
    assert decide(nr["mremap"], inside, page, 2 * page, 3, inside + (1 << 20)) == sc.RET_ALLOW  # MREMAP_FIXED
    assert decide(nr["mremap"], inside, page, 2 * page, 3, 1 << 40) == eperm
    assert decide(nr["remap_file_pages"], inside, page) == eperm


@pytest.mark.parametrize("machine", ["aarch64", "x86_64"])
def test_the_filter_judges_each_call(machine):  # olmax.rewards.code_seccomp, through its BPF interpreter
    program, nr, arch = sc.program(machine, WINDOW), sc.NUMBERS[machine], sc.AUDIT_ARCH[machine]
    decide = functools.partial(sc.decide, program, arch)
    eperm, enosys = (sc.RET_ERRNO | e for e in (sc.EPERM, sc.ENOSYS))
    # another architecture's calls, and 32-bit ones (AUDIT_ARCH_I386, AUDIT_ARCH_ARM), kill the process
    for other in (0x40000003, 0x40000028, *(a for m, a in sc.AUDIT_ARCH.items() if m != machine)):
        assert sc.decide(program, other, nr["socket"], 2, 1, 0) == sc.RET_KILL_PROCESS
    denied, special = set(sc.denied_names(machine)), {nr[n] for n in ("clone", "fcntl", "mmap", "munmap", "mremap")}
    assert set("memfd_create shmget msgget keyctl add_key request_key unshare io_uring_setup".split()) <= denied
    assert set("socket socketpair io_setup io_submit io_pgetevents epoll_create1 epoll_ctl".split()) <= denied
    by_number = {number: name for name, number in nr.items()}
    for number in set(range(sc.CEILING)) - special - {nr["clone3"]}:
        assert decide(number) == (eperm if by_number.get(number) in denied else sc.RET_ALLOW), number
    for number in (sc.CEILING, 0x40000000 | 41, 0xFFFFFFFF, nr["clone3"]):  # unknown, x32, -1, clone3
        assert decide(number) == enosys
    for name, family in ((name, family) for name in ("socket", "socketpair") for family in range(64)):
        assert decide(nr[name], family, 1, 0) == decide(nr[name], family | 1 << 32) == eperm  # every family
    assert decide(nr["clone"], 0x11) == decide(nr["clone"], 0x3D0F00) == sc.RET_ALLOW  # fork, a thread
    for flag in (0x20000, 0x2000000, 0x4000000, 0x8000000, 0x10000000, 0x20000000, 0x40000000):  # CLONE_NEW*
        assert decide(nr["clone"], flag | 0x11) == eperm
    assert all(decide(nr["fcntl"], 3, cmd, 1 << 20) == eperm for cmd in (1031, 6, 7, 37, 38))  # F_SETPIPE_SZ, locks
    assert all(decide(nr["fcntl"], 3, cmd) == sc.RET_ALLOW for cmd in (0, 1, 2, 3, 4, 5, 36, 1032))
    assert "remap_file_pages" in denied
    with pytest.raises(sc.Unsupported, match="no system call filter for riscv64"):
        sc.program("riscv64", WINDOW)
    # the kernel's own numbering where its headers are installed (x86_64's table; the generic one is arm64's)
    header = f"/usr/include/{'x86_64-linux-gnu/asm/unistd_64.h' if machine == 'x86_64' else 'asm-generic/unistd.h'}"
    if not os.path.exists(header):
        pytest.skip(f"no {header} here to check the numbers against")
    with open(header) as f:
        kernel = {m[1]: int(m[2]) for m in re.finditer(r"#define __NR(?:3264)?_(\w+)\s+(\d+)", f.read())}
    checked = {name: number for name, number in nr.items() if name in kernel}
    assert checked == {name: kernel[name] for name in checked} and len(checked) >= len(nr) - 4  # - the newest


# an honest program's standard library: threads, a temporary file (upstream's guard disables os.getcwd, which
# gettempdir uses), sqlite, flock, pipes, memory, deep recursion
STDLIB = """
import decimal, hashlib, random, sqlite3, tempfile, time; from concurrent.futures import ThreadPoolExecutor
sys.setrecursionlimit(10000); depth = lambda n: 0 if n == 0 else 1 + depth(n - 1)
with ThreadPoolExecutor(4) as pool: squares = list(pool.map(lambda x: x * x, range(100)))
with tempfile.TemporaryFile(dir='.') as f, sqlite3.connect(':memory:') as db:
    size = f.write(bytes(1 << 20)) + (fcntl.flock(f, fcntl.LOCK_EX) or 0)
    db.execute('create table t (x)').executemany('insert into t values (?)', [(i,) for i in range(100)])
    total = db.execute('select sum(x) from t').fetchone()[0]
pipes, buf, _ = [os.pipe() for _ in range(8)], bytearray(64 << 20), random.seed(1) or time.sleep(0.01)
result = (depth(5000), sum(squares), size, total, len(buf),
          hashlib.sha256(b'x').hexdigest()[:8], str(decimal.Decimal(1) / 8))
"""
# x86_64: push rbx; eax = 359 (i386 socket); ebx = 40 (AF_VSOCK); ecx = 1; edx = 0; int 0x80; pop rbx; ret
INT80 = """page = mmap.mmap(-1, 4096, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, prot=7)
page.write(bytes.fromhex('53b867010000bb28000000b90100000031d2cd805bc3'))
opened = ctypes.CFUNCTYPE(ctypes.c_int)(ctypes.addressof(ctypes.c_char.from_buffer(page)))() >= 0"""


@sandboxed
def test_the_filter_is_in_force_and_honest_programs_run(monkeypatch):
    # each call the filter refuses fails with EPERM in the sandbox, whatever the (zero) arguments
    numbers = {name: sc.NUMBERS[platform.machine()][name] for name in sc.denied_names(platform.machine())}
    program = PRELUDE + (
        f"libc.syscall.restype = L\nrefused = []\nfor name, nr in {numbers!r}.items():\n    ctypes.set_errno(0)\n"
        "    if libc.syscall(nr, 0, 0, 0, 0, 0, 0) == -1 and ctypes.get_errno() == 1:\n        refused.append(name)\n"
        "status = open('/proc/self/status').read()"
    )
    test = f"assert 'Seccomp:\\t2' in status and sorted(refused) == {sorted(numbers)!r}"
    assert _outcome(program, test) == "pass"
    want = (5000, 328350, 1 << 20, 4950, 64 << 20, "2d711642", "0.125")
    assert _outcome(PRELUDE + STDLIB, f"assert result == {want!r}, result") == "pass"
    if platform.machine() == "x86_64":  # a 32-bit call (another table's numbers) kills; an x32 one is refused
        assert _outcome(PRELUDE + INT80, "assert opened") != "pass"
        x32 = PRELUDE + "opened = libc.syscall(0x40000000 + 41, 40, 1, 0) >= 0"  # x32's socket(AF_VSOCK, ...)
        assert _outcome(x32, "assert not opened") == "pass"
    assert code.check_host("namespaces") is None  # this host has every mechanism; a machine without a filter
    monkeypatch.setattr(code.platform, "machine", lambda: "riscv64")  # has none, and the sandbox fails closed
    monkeypatch.setattr(code, "probe", functools.cache(code.probe.__wrapped__))  # a probe of its own
    with pytest.raises(code.SandboxUnavailable, match="seccomp: no system call filter for riscv64.*=none"):
        code.check_host("auto")
