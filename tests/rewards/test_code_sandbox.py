"""The code verifier's sandbox (olmax.rewards.code, olmax.rewards.code_sandbox) as a boundary.

Each attack is a program a policy could write, with an effect outside the verifier that this test can
see: a file of the caller's read, a file written outside, a TCP connection to a loopback server (through
ctypes, and through a re-imported socket module), another process of the same user killed, a daemon
(fork + setsid) that outlives the call, a fan-out of 64 processes, other processes listed in /proc. Each
runs with isolation "none" first, where it must have its effect (so the test can see the effect it
checks for), then with "namespaces", where it must have none. Honest programs, stdin/stdout tests and
timeouts score the same under both. The tests skip, naming what the probe found, only where the namespace
sandbox does not work (it does on Linux with unprivileged user namespaces; CI runs them).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from olmax.rewards import code

sandboxed = pytest.mark.usefixtures("code_sandbox")  # skips, naming the probe's finding, where there is none

# upstream's guard refuses a program that says "import os", so the attacks reach the module another way
OS = "__import__('o' + 's')"


def _outcome(program: str, test: str, isolation: str, seconds: float = 2.0) -> str:
    return code.run_tests(program, [test], seconds=seconds, isolation=isolation)[0]


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
        test = f"assert open({str(path)!r}).read() == {text!r}"
        assert _outcome("", test, "none") == "pass"
        assert _outcome("", test, "namespaces") == "fail"
    # what the program sees is Python's installation, the loader's libraries, three devices, /proc and
    # its scratch: beside the installation, not even the directory that holds it
    tops = {p.strip("/").split("/")[0] for p in (sys.prefix, sys.base_prefix)}
    allowed = sorted({"dev", "etc", "proc", "tmp", "scratch", "lib", "lib32", "lib64", "usr"} | tops)
    seen = (
        f"ls = {OS}.listdir\n"
        f"assert set(ls('/')) <= set({allowed!r}), ls('/')\n"
        "assert ls('/etc') == ['ld.so.cache'] and sorted(ls('/dev')) == ['null', 'urandom', 'zero']\n"
        f"assert ls({os.path.dirname(sys.prefix)!r}) == [{os.path.basename(sys.prefix)!r}]"
    )
    assert _outcome("", seen, "namespaces") == "pass"


@sandboxed
def test_writes_stay_in_the_scratch(tmp_path):
    outside = tmp_path / "written.txt"
    write = f"open({str(outside)!r}, 'w').write('x')"
    assert _outcome(write, "assert True", "none") == "pass" and outside.exists()
    outside.unlink()
    assert _outcome(write, "assert True", "namespaces") == "fail" and not outside.exists()
    # Python's own files are read-only, even to a program that makes the file writable first
    into_prefix = os.path.join(sys.prefix, "olmax-sandbox-probe.txt")
    try:
        assert _outcome(f"open({into_prefix!r}, 'w').write('x')", "assert True", "namespaces") == "fail"
        assert not os.path.exists(into_prefix)
    finally:
        if os.path.exists(into_prefix):
            os.remove(into_prefix)
    # the scratch is writable: the working directory (/tmp, or /scratch where Python itself lies under
    # /tmp: code_sandbox._scratch)
    scratch = "open('a', 'w').write('x'); open('b', 'w').write('y')"
    assert _outcome(scratch, "assert open('b').read() == 'y' and open('a').read() == 'x'", "namespaces") == "pass"


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
        assert _outcome(kill.format(os=OS, pid=sleeper.pid), "assert True", "none") == "pass"
        assert sleeper.wait(timeout=2) == -signal.SIGKILL  # killed from the program without the sandbox
        sleeper = subprocess.Popen(["sleep", "30"])
        # with it the pid is not in the program's PID namespace: the kill raises, and the sleeper lives
        assert _outcome(kill.format(os=OS, pid=sleeper.pid), "assert True", "namespaces") == "fail"
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
        _outcome(_daemon(mark, left, 5.0), "assert True", "none")  # killed below
        assert _count_marked(mark, 1) == 1  # without the sandbox the daemon is still there
    finally:
        for pid in _marked(mark):
            os.kill(pid, signal.SIGKILL)
    _outcome(_daemon(mark, left, 0.5), "assert True", "namespaces")
    assert _marked(mark) == []  # gone when the call returned, not later
    time.sleep(0.8)  # past the daemon's 0.5 s: had it lived, it would show, and so might its file
    assert _marked(mark) == [] and not left.exists()


FAN_OUT = """
os = {os}
made = 0
for _ in range(64):
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        os.setsid()
        os.closerange(0, 1024)
        {name}
        __import__('time').sleep(30)
        os._exit(0)
    made += 1
"""


@sandboxed
def test_fan_out_is_capped_and_gone():
    mark = f"olmaxf{os.getpid() % 100000}"
    program = FAN_OUT.format(os=OS, name=_name_self(mark))
    try:
        assert _outcome("", program + "assert made == 64", "none") == "pass"
        assert _count_marked(mark, 64) == 64
    finally:
        for pid in _marked(mark):
            os.kill(pid, signal.SIGKILL)
    # the cap stops the fan-out (run by the test, so that its assert runs after it)
    assert _outcome("", program + f"assert 0 < made < {code.PROCESSES}", "namespaces") == "pass"
    assert _marked(mark) == []


@sandboxed
def test_proc_shows_only_the_sandbox():
    listing = f"pids = sorted(int(p) for p in {OS}.listdir('/proc') if p.isdigit())\n"
    # the sandbox's init, its runner and the process this test runs in
    assert _outcome("", listing + f"assert {os.getpid()} not in pids and pids == [1, 2, 3]", "namespaces") == "pass"
    assert _outcome("", listing + f"assert {os.getpid()} in pids", "none") == "pass"


@sandboxed
def test_the_program_holds_no_privilege():
    probe = (
        "import ctypes\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "status = open('/proc/self/status').read()\n"
        "made = [libc.unshare(flag) for flag in (0x10000000, 0x40000000, 0x20000)]  # user, net, mount\n"
    )
    # no capability and none to win by exec, not root, and no namespace of its own to make
    test = (
        "assert 'CapEff:\\t0000000000000000' in status and 'CapPrm:\\t0000000000000000' in status\n"
        "assert 'NoNewPrivs:\\t1' in status and __import__('o' + 's').getuid() != 0\n"
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
        with pytest.raises(code.SandboxUnavailable):
            code.verify(HONEST, ["assert add(1, 2) == 3"], isolation=isolation)
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
    from olmax.rollout.batches import RolloutBatches, prompt_set

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
        RolloutBatches(cfg, mesh, prompt_set(cfg, tok), tok)
    cfg = apply_overrides(cfg, ["rewards.code.isolation=none"])
    loader = RolloutBatches(cfg, mesh, prompt_set(cfg, tok), tok)
    assert loader.verifier_options == {"code": {"isolation": "none"}, "code_stdio": {"isolation": "none"}}
    assert "code verifier isolation: none" in capsys.readouterr().out
