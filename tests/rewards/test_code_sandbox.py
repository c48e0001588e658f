"""The code verifier's sandbox (olmax.rewards.code, olmax.rewards.code_sandbox) as a boundary.

Each attack is a program a policy could write, with an effect outside the verifier that this test can
see: a file of the caller's read, a file written outside, a TCP connection to a loopback server (through
ctypes, and through a re-imported socket module), another process of the same user killed, a daemon
(fork + setsid) that outlives the call, a fan-out of 64 processes, other processes listed in /proc. Each
runs with isolation "none" first, where it must have its effect (so the test can see the effect it
checks for), then with "namespaces", where it must have none. Honest programs, stdin/stdout tests and
timeouts score the same under both. Then the classes a review found (memory outside the address space,
output floods, the keyring, socket families, host information), whose attacks run only in the sandbox and
must fail there (the system call filter: tests/rewards/test_code_seccomp.py). The tests skip, naming what
the probe found, only where the namespace sandbox does not work (it does on Linux with unprivileged user
namespaces; CI runs them).
"""

from __future__ import annotations

import ctypes
import os
import platform
import signal
import socket
import subprocess
import sys
import time
import tracemalloc

import pytest

from olmax.rewards import code, code_records
from olmax.rewards import verifiers as rewards

sandboxed = pytest.mark.usefixtures("code_sandbox")  # skips, naming the probe's finding, where there is none

# upstream's guard refuses a program that says "import os", so the attacks reach the module another way
OS = "__import__('o' + 's')"
# a test's calls run in the program's process, its comparisons in the verifier's: what a test checks of the
# sandbox, the program reads (open() of the test's own path alone is not a call into the program)
READ = "def read(path):\n    return open(path).read()\n"


def _outcome(program: str, test: str, isolation: str, seconds: float = 2.0, memory_mb: int = code.MEMORY_MB) -> str:
    # `loaded`: a name of the program's for a test that checks only that the program loaded (a test that
    # names nothing of the program's is refused)
    program += "\nloaded = True"
    return code.run_tests(program, [test], seconds=seconds, memory_mb=memory_mb, isolation=isolation)[0]


def _marked(mark: str) -> list[int]:
    """Pids of the live processes on this machine whose name (comm) is `mark` (a zombie is not one)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                stat = f.read()  # "pid (comm) state ..."
            if stat[stat.index("(") + 1 : stat.rindex(")")] == mark and stat[stat.rindex(")") + 2] != "Z":
                found.append(int(pid))
        except OSError:  # gone meanwhile
            pass
    return found


def _count_marked(mark: str, want: int) -> int:
    """How many live processes are named `mark`, once `want` are or after 2 s (they name themselves
    after their fork, so the last may not have yet when the call returns)."""
    deadline = time.monotonic() + 2.0
    while len(_marked(mark)) < want and time.monotonic() < deadline:
        time.sleep(0.01)
    return len(_marked(mark))


def _name_self(mark: str) -> str:
    # the process renames itself (PR_SET_NAME), so that this test finds it among the machine's processes
    return f"__import__('ctypes').CDLL(None).prctl(15, {mark.encode()!r}, 0, 0, 0)"


@sandboxed
def test_files_of_the_caller_are_not_visible(tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("run directory secret")
    for path, text in ((secret, "run directory secret"), (__file__, open(__file__).read())):
        test = f"assert read({str(path)!r}) == {text!r}"
        assert _outcome(READ, test, "none") == "pass"
        assert _outcome(READ, test, "namespaces") == "fail"
    # what the program sees is Python's installation, the loader's libraries, three devices, /proc and
    # its scratch: beside the installation, not even the directory that holds it
    tops = {p.strip("/").split("/")[0] for p in (sys.prefix, sys.base_prefix)}
    allowed = sorted({"dev", "etc", "proc", "tmp", "scratch", "lib", "lib32", "lib64", "usr"} | tops)
    seen = (
        f"assert set(ls('/')) <= set({allowed!r}), ls('/')\n"
        "assert ls('/etc') == ['ld.so.cache'] and sorted(ls('/dev')) == ['null', 'urandom', 'zero']\n"
        f"assert ls({os.path.dirname(sys.prefix)!r}) == [{os.path.basename(sys.prefix)!r}]"
    )
    assert _outcome(f"ls = {OS}.listdir", seen, "namespaces") == "pass"


@sandboxed
def test_writes_stay_in_the_scratch(tmp_path):
    outside = tmp_path / "written.txt"
    write = f"open({str(outside)!r}, 'w').write('x')"
    assert _outcome(write, "assert loaded", "none") == "pass" and outside.exists()
    outside.unlink()
    assert _outcome(write, "assert loaded", "namespaces") == "fail" and not outside.exists()
    # Python's own files are read-only, even to a program that makes the file writable first
    into_prefix = os.path.join(sys.prefix, "olmax-sandbox-probe.txt")
    try:
        assert _outcome(f"open({into_prefix!r}, 'w').write('x')", "assert loaded", "namespaces") == "fail"
        assert not os.path.exists(into_prefix)
    finally:
        if os.path.exists(into_prefix):
            os.remove(into_prefix)
    # the scratch is writable: the working directory (/tmp, or /scratch where Python itself lies under
    # /tmp: code_sandbox._scratch)
    scratch = READ + "open('a', 'w').write('x'); open('b', 'w').write('y')"
    assert _outcome(scratch, "assert read('b') == 'y' and read('a') == 'x'", "namespaces") == "pass"


CTYPES_CONNECT = """
import ctypes, struct
libc = ctypes.CDLL(None, use_errno=True)
fd = libc.socket(2, 1, 0)  # AF_INET, SOCK_STREAM
address = struct.pack("=H", 2) + struct.pack("!H", PORT) + bytes([127, 0, 0, 1]) + bytes(8)
connected = fd >= 0 and libc.connect(fd, address, len(address)) == 0
"""

REIMPORTED_SOCKET = """
import importlib, sys
for name in ("socket", "_socket"):
    sys.modules.pop(name, None)
fresh = importlib.import_module("socket")
connection = fresh.create_connection(("127.0.0.1", PORT), timeout=1)
connected = True
"""


@sandboxed
@pytest.mark.parametrize("attack", [CTYPES_CONNECT, REIMPORTED_SOCKET], ids=["ctypes", "reimported_socket"])
def test_no_network(attack):
    with socket.create_server(("127.0.0.1", 0)) as server:
        server.settimeout(0.2)
        program = f"PORT = {server.getsockname()[1]}\n{attack}"
        assert _outcome(program, "assert connected", "none") == "pass"
        server.accept()[0].close()  # the connection made without the sandbox
        assert _outcome(program, "assert connected", "namespaces") == "fail"
        with pytest.raises(socket.timeout):
            server.accept()


@sandboxed
def test_other_processes_cannot_be_signalled():
    kill = "{os}.kill({pid}, 9)"
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        assert _outcome(kill.format(os=OS, pid=sleeper.pid), "assert loaded", "none") == "pass"
        assert sleeper.wait(timeout=2) == -signal.SIGKILL  # killed from the program without the sandbox
        sleeper = subprocess.Popen(["sleep", "30"])
        # with it the pid is not in the program's PID namespace: the kill raises, and the sleeper lives
        assert _outcome(kill.format(os=OS, pid=sleeper.pid), "assert loaded", "namespaces") == "fail"
        with pytest.raises(subprocess.TimeoutExpired):
            sleeper.wait(timeout=0.1)
    finally:
        sleeper.kill()
        sleeper.wait()


def _daemon(mark: str, path, delay: float) -> str:
    """A program leaving a grandchild in a new process session (setsid) that writes `path` after `delay` seconds."""
    return f"""
os = {OS}
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.closerange(0, 1024)  # as a daemon does: the verifier waits for no pipe of its
        {_name_self(mark)}
        __import__('time').sleep({delay})
        open({str(path)!r}, 'w').write('still here')
    os._exit(0)
"""


@sandboxed
def test_no_process_outlives_the_call(tmp_path):
    mark = f"olmaxd{os.getpid() % 100000}"
    left = tmp_path / "left.txt"
    try:
        _outcome(_daemon(mark, left, 5.0), "assert loaded", "none")  # killed below
        assert _count_marked(mark, 1) == 1  # without the sandbox the daemon is still there
    finally:
        for pid in _marked(mark):
            os.kill(pid, signal.SIGKILL)
    _outcome(_daemon(mark, left, 0.5), "assert loaded", "namespaces")
    assert _marked(mark) == []  # gone when the call returned, not later
    time.sleep(0.8)  # past the daemon's 0.5 s: had it lived, it would show, and so might its file
    assert _marked(mark) == [] and not left.exists()


FAN_OUT = """
os = {os}
def fan_out():
    made, (r, w) = 0, os.pipe()
    for _ in range(64):
        try:
            pid = os.fork()
        except OSError:
            break
        if pid == 0:
            os.setsid()
            os.write(w, b'x')  # out of the parent's process group (setsid): the fan-out returns once all are
            os.closerange(0, 1024)
            {name}
            __import__('time').sleep(30)
            os._exit(0)
        made += 1
    os.close(w)
    return len(b''.join(iter(lambda: os.read(r, 64), b'')))
"""


@sandboxed
def test_fan_out_is_capped_and_gone():
    mark = f"olmaxf{os.getpid() % 100000}"
    program = FAN_OUT.format(os=OS, name=_name_self(mark))
    try:
        assert _outcome(program, "assert fan_out() == 64", "none") == "pass"
        assert _count_marked(mark, 64) == 64
    finally:
        for pid in _marked(mark):
            os.kill(pid, signal.SIGKILL)
    # the cap stops the fan-out (run by the test, in the test's process)
    assert _outcome(program, f"assert 0 < fan_out() < {code.PROCESSES}", "namespaces") == "pass"
    assert _marked(mark) == []


@sandboxed
def test_proc_shows_only_the_sandbox():
    listing = f"def pids():\n    return sorted(int(p) for p in {OS}.listdir('/proc') if p.isdigit())"
    # the program's process alone, PID 1 of a PID namespace of its own (not the runner nor the tests' process)
    assert _outcome(listing, f"assert {os.getpid()} not in pids() and pids() == [1]", "namespaces") == "pass"
    assert _outcome(listing, f"assert {os.getpid()} in pids()", "none") == "pass"


@sandboxed
def test_the_program_holds_no_privilege():
    probe = (
        "import ctypes\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "status = open('/proc/self/status').read()\n"
        "made = [libc.unshare(flag) for flag in (0x10000000, 0x40000000, 0x20000)]  # user, net, mount\n"
        f"uid = {OS}.getuid()"
    )
    # no capability and none to win by exec, not root, and no namespace of its own to make
    test = (
        "assert 'CapEff:\\t0000000000000000' in status and 'CapPrm:\\t0000000000000000' in status\n"
        "assert 'NoNewPrivs:\\t1' in status and uid != 0\n"
        "assert made == [-1, -1, -1]"
    )
    assert _outcome(probe, test, "namespaces") == "pass"


HONEST = "```python\ndef add(a, b):\n    return a + b\n```"


@sandboxed
@pytest.mark.parametrize("isolation", ["none", "namespaces"])
def test_honest_programs_and_timeouts_score_as_before(isolation):
    tests = ["assert add(1, 2) == 3", "assert add(-1, 1) == 0", "assert add(2, 2) == 4"]
    assert code.verify(HONEST, tests, isolation=isolation) == 1.0
    assert code.verify(HONEST, tests[:2] + ["assert add(2, 2) == 5"], isolation=isolation) == 0.0
    doubles = "```python\nn = int(input())\nprint(n * 2)\n```"
    stdio = [{"input": "3\n", "output": "6\n"}, {"input": "5", "output": "10"}]
    assert code.verify_stdio(doubles, stdio, isolation=isolation) == 1.0
    assert code.verify_stdio(doubles, [{"input": "3", "output": "7"}], isolation=isolation) == 0.0
    # the standard library is importable (from the installation's read-only bind, under namespaces)
    imports = (
        "import bisect, collections, fractions, heapq, json, re\nx = sum(fractions.Fraction(1, 2) for _ in range(4))"
    )
    assert code.run_tests(imports, ["assert x == 2"], isolation=isolation) == ["pass"]
    start = time.perf_counter()
    loop = "```python\ndef add(a, b):\n    while True:\n        pass\n```"
    with pytest.raises(code.VerifierTimeout):
        code.verify(loop, ["assert add(1, 2) == 3"], seconds=0.3, isolation=isolation)
    assert time.perf_counter() - start < 3.0


def test_isolation_setting_and_refusal(monkeypatch):
    assert code.run_options("auto", ["math", "ifeval"]) == {}  # no code verifier: nothing to probe
    with pytest.raises(code.ConfigError, match="rewards.code.isolation='off' is not one of auto, namespaces, none"):
        code.isolation_in_force("off")
    monkeypatch.setattr(code, "probe", lambda: "unshare(0x7c000000): Operation not permitted")
    for isolation in ("auto", "namespaces"):
        with pytest.raises(code.SandboxUnavailable) as refused:
            code.run_options(isolation, ["math", "Code"])
        assert "unshare(0x7c000000): Operation not permitted" in str(refused.value)
        assert "rewards.code.isolation=none" in str(refused.value)
        with pytest.raises(code.SandboxUnavailable, match=r"unshare\(0x7c000000\).*rewards.code.isolation=none"):
            code.check_host(isolation)  # the RL loop's refusal to start, naming what is missing and the opt-out
        with pytest.raises(code.SandboxUnavailable):
            code.verify(HONEST, ["assert add(1, 2) == 3"], isolation=isolation)
    assert code.check_host("none") is None  # the opt-out needs none of it
    assert code.run_options("none", ["code_stdio"]) == {
        "code": {"isolation": "none"},
        "code_stdio": {"isolation": "none"},
    }
    assert code.verify(HONEST, ["assert add(1, 2) == 3"], isolation="none") == 1.0


def test_rewards_code_isolation_config():
    from olmax.config.experiment import ExperimentConfig
    from olmax.config.io import apply_overrides
    from olmax.errors import ConfigError

    assert ExperimentConfig().rewards.code.isolation == "auto"
    assert apply_overrides(ExperimentConfig(), ["rewards.code.isolation=none"]).rewards.code.isolation == "none"
    with pytest.raises(ConfigError, match="rewards.code.isolation='chroot' is not one of auto, namespaces, none"):
        apply_overrides(ExperimentConfig(), ["rewards.code.isolation=chroot"])


def test_the_rl_loop_refuses_code_rewards_without_their_sandbox(tmp_path, monkeypatch, capsys):
    """Where the probe fails, a GRPO run whose prompts use the code verifier stops before any sampling,
    naming what the probe found and the setting; with rewards.code.isolation=none it starts, saying so."""
    import json

    import jax
    from small_run import SMALL

    from olmax.config.io import apply_overrides
    from olmax.config.recipes import get_recipe
    from olmax.data.chat_corpus import read_rows
    from olmax.data.tokenizer import load_tokenizer
    from olmax.model.sharding import make_mesh
    from olmax.rollout.producer import RolloutProducer, prompt_set

    rows = tmp_path / "code.jsonl"
    tests = json.dumps(["assert True"])
    rows.write_text(
        "".join(json.dumps({**r, "dataset": "code", "ground_truth": tests}) + "\n" for r in read_rows("rl")[:8])
    )
    overrides = SMALL + [f"data.work_dir={tmp_path / 'cache'}", f"data.paths=[{rows}]", "data.seq_len=96"]
    overrides += ["grpo.max_prompt_len=64", "grpo.max_response_len=16", "grpo.prompts_per_step=4"]
    tok = load_tokenizer("dolma2")
    monkeypatch.setattr(code, "probe", lambda: "unshare(0x7c000000): Function not implemented")
    cfg = apply_overrides(get_recipe("tiny_grpo"), overrides)
    mesh = make_mesh(cfg.mesh, jax.devices()[:1])
    with pytest.raises(code.SandboxUnavailable, match="Function not implemented.*rewards.code.isolation=none"):
        RolloutProducer(cfg, mesh, prompt_set(cfg, tok), tok)
    cfg = apply_overrides(cfg, ["rewards.code.isolation=none"])
    loader = RolloutProducer(cfg, mesh, prompt_set(cfg, tok), tok)
    assert loader.verifier_options == {"code": {"isolation": "none"}, "code_stdio": {"isolation": "none"}}
    assert "code verifier isolation: none" in capsys.readouterr().out


# --- memory outside the limit, output floods, the keyring, socket families, host information (sandbox only)

LIBC = "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\nL = ctypes.c_long\n"
PRELUDE = f"import fcntl, mmap, struct, sys\nos = {OS}\n{LIBC}held, keep = 0, []\n"
# memory outside the address space, held in a loop until `held` reaches GOAL: 256 MiB (4 x memory_mb 64), or
# 65536 kernel objects (COUNTED, ~0.2-1 KiB each): memfd_create(2), svipc(7), mq_overview(7), shm_overview(7)
MEMORY = {
    "memfd_write": "fd = os.memfd_create('m'); keep.append(fd); held += os.write(fd, bytes(8 << 20))",
    "memfd_fallocate": "fd = os.memfd_create('m'); keep += [fd]; os.posix_fallocate(fd, 0, 8 << 20); held += 8 << 20",
    "memfd_mapped": "fd = libc.memfd_create(b'm', 0); assert fd >= 0; keep.append(fd); os.ftruncate(fd, 8 << 20)\n"
                    "m = mmap.mmap(fd, 8 << 20); m.write(bytes(8 << 20)); m.close(); held += 8 << 20",
    "sysv_shm": "libc.shmat.restype = ctypes.c_void_p; shm = libc.shmget(0, 8 << 20, 0o1600); assert shm >= 0\n"
                "at = libc.shmat(shm, None, 0); assert at not in (None, ctypes.c_void_p(-1).value)\n"
                "ctypes.memset(at, 1, 8 << 20); libc.shmdt(ctypes.c_void_p(at)); held += 8 << 20",
    "sysv_msg": "q = libc.msgget(0, 0o1600); assert q >= 0\n"
                "while held < GOAL and libc.msgsnd(q, b'\\x01' + bytes(8199), 8192, 0o4000) == 0: held += 8192",
    "posix_mqueue": "rt = ctypes.CDLL('librt.so.1'); attr = (L * 8)(0, 10, 8192)\n"
                    "q = rt.mq_open(b'/q%d' % len(keep), 0o4102, 0o600, attr); assert q >= 0; keep.append(q)\n"
                    "while held < GOAL and rt.mq_send(q, bytes(8192), 8192, 0) == 0: held += 8192",
    "dev_shm": "keep.append(open('/dev/shm/m%d' % len(keep), 'wb')); held += keep[-1].write(bytes(8 << 20))",
    "tmpfs_bytes": "held += open('b%d' % held, 'wb').write(bytes(8 << 20))",
    "tmpfs_inodes": "open('i%d' % held, 'w').close(); held += 1",
    "tmpfs_links": "open('t', 'a').close(); os.link('t', 'l%d' % held); held += 1",
    "tmpfs_xattrs": "open('t', 'a').close(); os.setxattr('t', 'user.x%d' % held, bytes(65536)); held += 65536",
    "shared_mmap": "m = mmap.mmap(-1, GOAL)\nfor at in range(0, GOAL, 4096): m[at] = 1\nheld = GOAL",
    # socket(7) SO_SNDBUF and pipe(7) F_SETPIPE_SZ buffers; fcntl(2) record locks (RLIMIT_LOCKS is not enforced)
    "unix_buffers": "pair = (ctypes.c_int * 2)(); assert libc.socketpair(1, 1 | 0o4000, 0, pair) == 0\n"
                    "while held < GOAL and (n := libc.write(pair[0], bytes(65536), 65536)) > 0: held += n",
    "pipe_buffers": "r, w = os.pipe(); os.set_blocking(w, False); libc.fcntl(w, 1031, 1 << 20)\n"
                    "while held < GOAL and (n := libc.write(w, bytes(65536), 65536)) > 0: held += n",
    "record_locks": "keep.append(open('k%d' % held, 'w'))\n"
                    "for at in range(0, 8192, 2): held += fcntl.lockf(keep[-1], 6, 1, at) or 1",  # LOCK_EX | LOCK_NB
    "posix_timers": "t = ctypes.c_void_p(); assert libc.timer_create(1, None, ctypes.byref(t)) == 0; held += 1",
}  # fmt: skip
COUNTED = {"tmpfs_inodes", "tmpfs_links", "record_locks", "posix_timers"}


@sandboxed
@pytest.mark.parametrize("attack", sorted(MEMORY))
def test_memory_outside_the_address_space_is_bounded(attack):
    body = "\n".join("    " + line for line in MEMORY[attack].split("\n"))
    program = f"GOAL = {65536 if attack in COUNTED else 256 << 20}\n{PRELUDE}while held < GOAL:\n{body}\n"
    assert _outcome(program, "assert held >= GOAL", "namespaces", seconds=10.0, memory_mb=64) == "fail"


# (program, test, stdio, outcome): the program's descriptors other than 0, 1 and 2 are its own channel to the
# tests' process, whatever their numbers: flooding one fails its own test and reaches nothing else;
# stdout and stderr are discarded (a stdio test's stdout is a file its test reads up to a bound)
FLOODS = {
    "descriptor_newlines": ("os.write(3, b'\\n' * (64 << 20))", "assert loaded", False, "fail"),
    "descriptor_bytes": ("os.write(4, b'x' * (64 << 20))", "assert loaded", False, "fail"),
    "descriptor_records": ("for fd in range(3, 16):\n    try:\n        os.write(fd, b'p 0 0\\n' * (1 << 16))\n"
                           "    except OSError:\n        pass", "assert loaded", False, "fail"),
    "from_the_test": ("def flood():\n    for fd in range(3, 16):\n        try:\n"
                      "            os.write(fd, b'\\n' * (8 << 20))\n        except OSError:\n            pass",
                      "assert flood() is None", False, "fail"),
    "forever": ("def flood():\n    while True:\n        os.write(4, b'x' * 65536)", "flood()", False, "fail"),
    "stdout": ("os.write(1, b'\\n' * 2**26)\nfor _ in range(64): print('x' * 2**20)", "assert loaded", False, "pass"),
    "stderr": ("os.write(2, b'\\n' * 2**26)\nfor _ in range(64): sys.stderr.write('x' * 2**20)", "assert loaded", False,
               "pass"),
    "stdio_output": ("print('\\n' * (64 << 20))", {"input": "", "output": "1"}, True, "fail"),
}  # fmt: skip


@sandboxed
@pytest.mark.parametrize("flood", sorted(FLOODS))
def test_output_floods_cost_the_caller_a_fixed_amount(flood):
    program, test, stdio, want = FLOODS[flood]
    tracemalloc.start()
    try:
        got = code.run_tests(PRELUDE + program + "\nloaded = True", [test], stdio=stdio, seconds=5.0,
                             isolation="namespaces")  # fmt: skip
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert got == [want] and peak < 1 << 20, (got, peak)  # the verifier reads a few hundred bytes a test


@sandboxed
def test_the_report_is_out_of_the_programs_reach(monkeypatch):
    """The runner alone holds the descriptor the verifier reads: the program's process holds 0, 1, 2 and
    its channel, and records it writes anywhere earn nothing. A stream that is not records (which only a
    broken runner could write) is an overflow: every test fails, and the call says why."""
    forge = ("for fd in range(3, 64):\n    try:\n        os.write(fd, b''.join(b'p %d 0\\n' % i for i in range(50)))\n"
             "    except OSError:\n        pass\ndef add(a, b):\n    return 0\n")  # fmt: skip
    tests = ["assert add(1, 2) == 3"] * 3
    assert code.run_tests(PRELUDE + forge, tests, isolation="namespaces") == ["fail"] * 3
    # 0, 1, 2, the channel's two ends, its mount namespace's (code_runner.hide_mounts) and listdir's own
    listing = PRELUDE + "fds = sorted(int(fd) for fd in os.listdir('/proc/self/fd'))"
    assert code.run_tests(listing, ["assert len(fds) == 7 and fds[:3] == [0, 1, 2], fds"]) == ["pass"]
    assert code.verify(HONEST, tests * 17, isolation="namespaces") == 1.0  # 51 records fit
    seen = []
    records = code_records.Records(2, lambda *record: seen.append(record))
    records.feed(b"p 0 0\np 1 4\nwhy?")
    assert seen == [("p", 0, b""), ("p", 1, b"why?")] and not records.bad
    for junk in (b"p 0 0\n", b"x 1 0\n", b"p 1 600\n", b"pass\n" * 20):  # a second record, a kind, a length, a line
        records.feed(junk)
        assert records.bad
        records.bad = ""
    monkeypatch.setattr(code, "run_tests", lambda *args, **kwargs: ["overflow"] * 3)
    with pytest.raises(code.VerifierOverflow, match="not records"):
        code.verify(HONEST, tests)
    assert rewards.call("code", HONEST, tests) == (0.0, rewards.ERROR)


# keyrings(7): a key in the caller's session keyring (-3) is not the program's to read, list, change or add to
KEY_CALLS = {"x86_64": (248, 249, 250), "aarch64": (217, 218, 219)}  # add_key, request_key, keyctl
KEY_ATTACKS = {
    "search_and_read": "n = kc(11, L(kc(10, L(-3), b'user', DESC, L(0))), buf, L(99)); got = buf.raw[:n] == PAYLOAD",
    "read_by_serial": "n = kc(11, L(SERIAL), buf, L(99)); got = n > 0 and buf.raw[:n] == PAYLOAD",
    "list_session": "n = kc(11, L(-3), buf, L(96)); got = SERIAL in struct.unpack('24i', buf.raw[:96])",
    "describe": "n = kc(6, L(SERIAL), buf, L(99)); got = n > 0 and DESC in buf.raw[:n]",
    "request_key": "got = libc.syscall(CALLS[1], b'user', DESC, None, L(0)) == SERIAL",
    "proc_keys": "got = DESC.decode() in open('/proc/keys').read()",
    "revoke": "got = kc(3, L(SERIAL)) == 0",
    "invalidate": "got = kc(21, L(SERIAL)) == 0",
    "update": "got = kc(2, L(SERIAL), b'forged', L(6)) == 0",
    "unlink": "got = kc(9, L(SERIAL), L(-3)) == 0",
    "set_permissions": "got = kc(5, L(SERIAL), L(0)) == 0",
    "add_key": "got = libc.syscall(CALLS[0], b'user', PLANTED, b'x', L(1), L(-3)) > 0",
}  # fmt: skip


@sandboxed
@pytest.mark.skipif(platform.machine() not in KEY_CALLS, reason="keyring system call numbers are for x86_64, aarch64")
@pytest.mark.parametrize("attack", sorted(KEY_ATTACKS))
def test_the_callers_keys_are_out_of_reach(attack):
    def _keyctl(*args) -> int:
        return ctypes.c_long(libc.syscall(*(ctypes.c_long(a) if isinstance(a, int) else a for a in args))).value

    (add_key, _, keyctl), buf, libc = KEY_CALLS[platform.machine()], ctypes.create_string_buffer(99), ctypes.CDLL(None)
    description, planted, payload = b"olmax-key-%d" % os.getpid(), b"olmax-mark-%d" % os.getpid(), os.urandom(9)
    serial = _keyctl(add_key, b"user", description, payload, len(payload), -3)
    if serial < 0:
        pytest.skip("no kernel keyring here: add_key failed")
    try:
        program = PRELUDE + (
            f"libc.syscall.restype = L\nbuf, CALLS = ctypes.create_string_buffer(99), {KEY_CALLS[platform.machine()]}\n"
            f"SERIAL, DESC, PAYLOAD, PLANTED = {serial}, {description!r}, {payload!r}, {planted!r}\n"
            f"def kc(*args):\n    return libc.syscall({keyctl}, *args)\n{KEY_ATTACKS[attack]}\n"
        )
        assert _outcome(program, "assert got", "namespaces") == "fail"
        # the caller's keyring as it was: its key found, readable, with its payload; nothing added
        assert _keyctl(keyctl, 10, -3, b"user", description, 0) == serial
        assert _keyctl(keyctl, 11, serial, buf, 99) == len(payload) and buf.raw[: len(payload)] == payload
        assert _keyctl(keyctl, 10, -3, b"user", planted, 0) < 0
    finally:
        for key in (serial, _keyctl(keyctl, 10, -3, b"user", planted, 0)):
            _keyctl(keyctl, 9, key, -3) if key > 0 else None  # KEYCTL_UNLINK


# address_families(7): none opens in the sandbox (AF_VSOCK reaches the host's ports and netlink the kernel's;
# AF_INET and AF_INET6 sockets are kernel memory the limits do not bound, and there is no network to reach)
SOCKETS = {
    "inet": [(2, 1, 0), (2, 2, 0), (2, 3, 1), (10, 1, 0), (10, 2, 0), (2, 1 | 0o4000, 0), (2, 5, 132)],
    "vsock": [(40, 1, 0), (40, 2, 0), (40, 5, 0)],
    "netlink": [(16, 3, 0), (16, 2, 0), (16, 3, 15), (16, 3, 9), (16, 3, 4), (16, 3, 16)],
    "packet": [(17, 3, 0), (17, 2, 0), (17, 10, 0)],
    "unix": [(1, 1, 0), (1, 2, 0), (1, 5, 0)],
    "others": [(38, 5, 0), (15, 3, 2), (44, 3, 0), (30, 2, 0), (21, 5, 0), (29, 3, 1), (31, 3, 0), (42, 2, 0),
               (43, 1, 0), (45, 2, 0), (3, 5, 0), (4, 2, 0), (5, 2, 0), (9, 5, 0), (46, 1, 0), (127, 1, 0)],
}  # fmt: skip


@sandboxed
@pytest.mark.parametrize("group", sorted(SOCKETS))
def test_socket_families_outside_the_namespace_are_refused(group):
    program = PRELUDE + (
        f"tried = {SOCKETS[group]!r}\nopened = [s for s in tried if libc.socket(*s) >= 0]\n"
        "pairs = [s for s in tried if libc.socketpair(*s, (ctypes.c_int * 2)()) == 0]\n"
        "for name in ('socket', '_socket'):\n    sys.modules.pop(name, None)\n"  # a fresh socket module
        "fresh, by_module = __import__('importlib').import_module('_socket'), []\n"
        "for s in tried:\n    try: by_module.append(fresh.socket(*s))\n    except OSError: pass\n"
    )
    assert _outcome(program, "assert opened == pairs == by_module == []", "namespaces") == "pass"


def _host_secrets() -> list[str]:  # the kernel's command line, its mounts' sources, cgroups, the verifier's path
    with open("/proc/cmdline") as f, open("/proc/self/mountinfo") as g, open("/proc/self/cgroup") as h:
        secrets = [os.path.dirname(os.path.abspath(code.__file__)), f.read().strip()]
        secrets += sorted({line.split(" - ")[1].split()[1] for line in g if " - " in line})
        secrets += sorted({line.strip().split(":", 2)[2] for line in h})
    return [s for s in secrets if len(s) >= 4 and (s.startswith("/") or " " in s)]


# no /proc/cmdline, no mount listed (mountstats is its owner's alone: unreadable counts as hidden), a hostname
# of the sandbox's, and nothing under /proc (all a program may read there) that holds a secret of the host's
HOST = """
def read(path):
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        return os.read(fd, 1 << 16).decode(errors='replace') + ('' if os.close(fd) else '')
    except OSError: return ''
cmdline, node = os.path.exists('/proc/cmdline'), os.uname().nodename
mounts = [read(f'/proc/{p}/{f}') for p in ('self', '1', 'thread-self') for f in ('mountinfo', 'mounts', 'mountstats')]
found = [(top + '/' + name, secret) for top, _, files in os.walk('/proc') for name in files
         if os.path.isfile(top + '/' + name) for secret in SECRETS if secret in read(top + '/' + name)]
"""


@sandboxed
def test_host_information_is_hidden():
    program = f"{PRELUDE}SECRETS = {_host_secrets()!r}\n{HOST}"
    test = f"assert not cmdline and mounts == [''] * 9 and node != {os.uname().nodename!r} and found == [], found"
    assert _outcome(program, test, "namespaces", seconds=10.0) == "pass"
