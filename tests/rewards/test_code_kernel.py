"""Kernel resources a sandboxed program could hold past its memory bound, measured from outside the sandbox.

Each attack runs only inside the sandbox, through the verifier (`code.run_tests`, isolation namespaces,
memory_mb=64), while this test measures the host from outside, as the attacks were measured: the host-wide
count of AIO contexts (/proc/sys/fs/aio-nr) and an io_setup of this process's during the run (the control),
the kernel's slab caches of TCP sockets and of epoll watches (/proc/slabinfo, root only), the uid the
sandbox's processes run as (/proc/<pid>/status). On the sandbox before these bounds every attack got what
it asked for; now each gets nothing. Then the memory cgroup's detection, and the sandbox joining one.
"""

from __future__ import annotations

import ctypes
import os
import platform
import threading

import pytest

from olmax.rewards import code, code_cgroup, code_sandbox

sandboxed = pytest.mark.usefixtures("code_sandbox")

OS = "__import__('o' + 's')"
PRELUDE = f"import ctypes, struct, time\nos = {OS}\nlibc = ctypes.CDLL(None, use_errno=True)\nheld = 0\n"
CALLS = {"x86_64": {"io_setup": 206, "io_destroy": 207}, "aarch64": {"io_setup": 0, "io_destroy": 1}}
HOLD = 1.0  # seconds an attack holds what it got, while the test measures


def _during(run, measure) -> tuple:
    """(run()'s result, the largest measure() seen while it ran, sampled every 10 ms)."""
    done, peak, result = threading.Event(), [measure()], []
    thread = threading.Thread(target=lambda: (result.append(run()), done.set()))
    thread.start()
    while not done.wait(0.01):
        peak.append(measure())
    thread.join()
    return result[0], max(peak)


def _slab(*names: str) -> int:
    """Active objects of these slab caches (/proc/slabinfo), or a skip where it cannot be read."""
    try:
        with open("/proc/slabinfo") as f:
            lines = f.readlines()
    except OSError:
        pytest.skip("/proc/slabinfo is root's to read")
    found = {line.split()[0]: int(line.split()[1]) for line in lines[2:]}
    if not any(name in found for name in names):
        pytest.skip(f"no slab cache {names} here (merged with another)")
    return sum(found.get(name, 0) for name in names)


def _attack(body: str, goal: int) -> str:
    program = f"{PRELUDE}GOAL = {goal}\n{body}\ntime.sleep({HOLD})\n"
    return code.run_tests(program, ["assert held >= GOAL"], seconds=10.0, memory_mb=64)[0]


AIO = """
libc.syscall.restype = ctypes.c_long
while held < GOAL:
    ctx = ctypes.c_ulong(0)
    if libc.syscall({io_setup}, ctypes.c_long(1), ctypes.byref(ctx)) != 0:
        break
    held += 1
"""


@sandboxed
@pytest.mark.skipif(platform.machine() not in CALLS, reason="io_setup's number is known for x86_64 and aarch64")
def test_aio_contexts_are_refused():
    """io_setup(2) contexts are host-wide (fs.aio-max-nr, 65,536): one sandbox took them all, and another
    user's io_setup got EAGAIN while it lived. Here 512 are asked for; the host's count does not move, and
    this process's own io_setup works meanwhile."""
    calls = CALLS[platform.machine()]

    def aio_nr() -> int:
        with open("/proc/sys/fs/aio-nr") as f:
            return int(f.read())

    libc, controls = ctypes.CDLL(None, use_errno=True), []

    def measure() -> int:  # the host's count, and the control: an io_setup of this process's, out here
        ctx = ctypes.c_ulong(0)
        controls.append(libc.syscall(calls["io_setup"], 1, ctypes.byref(ctx)) == 0)
        libc.syscall(calls["io_destroy"], ctx)
        return aio_nr() - 1

    before = aio_nr()
    outcome, peak = _during(lambda: _attack(AIO.format(**calls), 512), measure)
    assert outcome == "fail" and peak - before < 64 and all(controls), (outcome, before, peak, controls)


# TCP sockets kept after close() by a read-only shared mapping (TCP zerocopy receive's mmap), each with MD5
# signature keys (TCP_MD5SIG, struct tcp_md5sig: a sockaddr_storage, flags, prefix length, key length,
# ifindex, an 80-byte key): kernel memory that neither RLIMIT_NOFILE nor RLIMIT_AS counts
SOCKETS = """
libc.mmap.restype = ctypes.c_void_p
while held < GOAL:
    fd = libc.socket(2, 1, 0)
    if fd < 0:
        break
    for k in range(8):
        key = struct.pack("=HH4s", 2, 0, bytes([10, 0, 0, k])) + bytes(120) + struct.pack("=BBHI", 0, 0, 80, 0)
        libc.setsockopt(fd, 6, 14, key + bytes(80), 216)
    kept = libc.mmap(None, 4096, 1, 1, fd, 0) not in (None, ctypes.c_void_p(-1).value)
    libc.close(fd)
    held += kept
"""


@sandboxed
def test_sockets_are_refused():
    """No socket opens in the sandbox: 1,000 TCP sockets kept past close() by mmap, with MD5 keys, held
    ~270 MiB of kernel memory before (with reuseport programs too). Here the host's TCP socket caches do
    not grow by the 512 asked for."""
    before = _slab("TCP", "TCPv6")
    outcome, peak = _during(lambda: _attack(SOCKETS, 512), lambda: _slab("TCP", "TCPv6"))
    assert outcome == "fail" and peak - before < 256, (outcome, before, peak)


# epoll watches: each is keyed by (file, descriptor number) and lives while its file does, whatever happens
# to the number: 16 epoll instances x 8 pipes x the free numbers each pipe is moved through
EPOLL = """
eps = [libc.epoll_create1(0) for _ in range(16)]
assert min(eps) >= 0
pipes, event = [os.pipe() for _ in range(8)], struct.pack("=IQ", 1, 0)
for r, w in pipes:
    os.close(w)
for number in range(max(eps + [r for r, _ in pipes]) + 1, 64):  # RLIMIT_NOFILE
    for pipe, _ in pipes:
        os.dup2(pipe, number)
        held += sum(libc.epoll_ctl(ep, 1, number, event) == 0 for ep in eps)
        os.close(number)
"""


@sandboxed
def test_epoll_watches_are_refused():
    """epoll watches are counted only against the uid's fs.epoll.max_user_watches (5.5 M here, ~1.1 GiB of
    kernel memory), shared with every process of that uid. Here the host's epoll watch cache does not grow
    by the 2,048 asked for."""
    before = _slab("eventpoll_epi")
    outcome, peak = _during(lambda: _attack(EPOLL, 2048), lambda: _slab("eventpoll_epi"))
    assert outcome == "fail" and peak - before < 1024, (outcome, before, peak)


AIO_POLL = """
libc.syscall.restype = ctypes.c_long
ctx = ctypes.c_ulong(0)
assert libc.syscall(IO_SETUP, ctypes.c_long(4096), ctypes.byref(ctx)) == 0
while held < GOAL:
    r, w = os.pipe()
    # struct iocb: data, key and rw_flags, lio_opcode (5: IOCB_CMD_POLL), reqprio, fildes, buf (the events:
    # POLLIN), nbytes, offset, reserved, flags, resfd. Each end polled for input, which neither gets: each
    # poll keeps its end's file, so neither end hangs up and both stay pending past close()
    for end in (r, w):
        iocb = ctypes.create_string_buffer(struct.pack("=QIIHhIQQqQII", 0, 0, 0, 5, 0, end, 1, 0, 0, 0, 0, 0), 64)
        pointer = ctypes.c_void_p(ctypes.addressof(iocb))
        held += libc.syscall(IO_SUBMIT, ctx, ctypes.c_long(1), ctypes.byref(pointer)) == 1
    os.close(r)
    os.close(w)
    if held % 2:
        break
"""


@sandboxed
@pytest.mark.skipif(platform.machine() != "x86_64", reason="io_submit's number is x86_64's here")
def test_pending_aio_polls_keep_no_pipes():
    """A pending IOCB_CMD_POLL holds its file: before, 4,000 pipes (87 MiB) stayed past close(). Refused with
    the rest of AIO."""
    program = AIO_POLL.replace("IO_SETUP", "206").replace("IO_SUBMIT", "209")
    assert _attack(program, 2000) == "fail"


MARKED = f"{PRELUDE}libc.prctl(15, NAME, 0, 0, 0)\ntime.sleep({HOLD})\n"  # PR_SET_NAME, then wait


@sandboxed
@pytest.mark.skipif(os.geteuid() != 0, reason="an unprivileged caller can map only its own uid")
def test_a_root_callers_sandbox_has_a_uid_of_its_own():
    """The kernel's per-user accounts (epoll watches, pipe buffers, locked memory) are keyed by uid: a root
    caller's sandbox ran as nobody, sharing them with every nobody process and every other sandbox. Seen
    from outside, its processes now run as a uid of their own, above code_sandbox.SANDBOX_UIDS."""
    mark = b"olmaxu%d" % (os.getpid() % 100000)

    def uids() -> set:
        found = set()
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{pid}/status") as f:
                    status = dict(line.split(":", 1) for line in f if ":" in line)
            except OSError:
                continue
            if status.get("Name", "").strip().encode() == mark:
                found.add(int(status["Uid"].split()[1]))  # the effective uid
        return found

    seen: set = set()
    run = lambda: code.run_tests(MARKED.replace("NAME", repr(mark)), ["assert held >= 0"], memory_mb=64)  # noqa: E731
    outcome, _ = _during(run, lambda: seen.update(uids()) or 0)
    assert outcome == ["pass"] and len(seen) == 1, seen
    (uid,) = seen
    assert uid not in (os.getuid(), code_sandbox.NOBODY) and code_sandbox.SANDBOX_UIDS < uid < 2**31, uid


def _tree(tmp_path, controllers: str, subtree: str) -> str:
    """A fake /proc/self (cgroup, mountinfo) and cgroup v2 mount for code_cgroup.delegated."""
    (tmp_path / "proc").mkdir()
    mount = tmp_path / "cgroup"
    (mount / "job").mkdir(parents=True)
    for where in (mount, mount / "job"):
        (where / "cgroup.controllers").write_text(controllers)
        (where / "cgroup.subtree_control").write_text(subtree)
        (where / "cgroup.procs").write_text("")
    (tmp_path / "proc" / "cgroup").write_text("0::/job\n")
    (tmp_path / "proc" / "mountinfo").write_text(f"30 24 0:26 / {mount} rw - cgroup2 cgroup2 rw\n")
    return str(tmp_path / "proc")


def test_a_delegated_memory_cgroup_is_found_or_named_missing(tmp_path):
    (tmp_path / "a").mkdir()
    proc = _tree(tmp_path / "a", "cpu memory pids", "memory pids")
    job = f"{tmp_path}/a/cgroup/job"
    assert code_cgroup.delegated(proc) == (job, f"a memory cgroup per run under {job}")
    (tmp_path / "b").mkdir()
    where, why = code_cgroup.delegated(_tree(tmp_path / "b", "cpu pids", "pids"))
    assert where is None and "job has no memory controller (cgroup.controllers: cpu pids)" in why
    (tmp_path / "c").mkdir()
    where, why = code_cgroup.delegated(_tree(tmp_path / "c", "cpu memory", "cpu"))
    assert where is None and "does not enable memory for its children" in why
    (tmp_path / "d" / "proc").mkdir(parents=True)
    (tmp_path / "d" / "proc" / "cgroup").write_text("4:memory:/x\n")  # cgroup v1 alone
    assert code_cgroup.delegated(str(tmp_path / "d" / "proc"))[1] == "no cgroup v2 hierarchy holds this process"
    # this host: its finding, in the line a run logs
    assert code_cgroup.delegated()[1] in code.describe(code.NAMESPACES)


@sandboxed
def test_the_sandbox_joins_its_runs_cgroup(tmp_path, monkeypatch):
    """Where a cgroup is delegated, each run gets one and the keeper moves itself in (writing "0" to its
    cgroup.procs) before entering the namespaces, so that every process of the run is charged there; the
    verifier removes it after. (The kernel's side, the charge and its bound, needs a delegated memory
    controller, which this host does not have.)"""
    group = tmp_path / "run"
    group.mkdir()
    (group / "cgroup.procs").write_text("")
    made, removed = [], []
    monkeypatch.setattr(code_cgroup, "delegated", lambda proc="/proc/self": (str(tmp_path), "a fake"))
    monkeypatch.setattr(code_cgroup, "make", lambda *args: made.append(args) or str(group))
    monkeypatch.setattr(code_cgroup, "remove", removed.append)
    assert code.run_tests("x = 1", ["assert x == 1"], memory_mb=64) == ["pass"]
    assert (group / "cgroup.procs").read_text() == "0" and removed == [str(group)]
    assert made == [(str(tmp_path), (2 * 64 << 20) + (64 << 20) + (64 << 20), code.PROCESSES + 3)]
