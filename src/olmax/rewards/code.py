"""The code verifier: the program in the response run against the ground truth's tests.

What AI2 ran for OLMo 3's RL (allenai/open-instruct `open_instruct/ground_truth_utils.py`, class
`CodeVerifier`, identical at 42aa63c (Think RL) and 9ade62d (Instruct RL); the execution behind its HTTP
API is `open_instruct/code_utils/code_utils.py` at the same commits), re-written to run locally:

- the program is the content of the last ``` block (```python or bare), stripped; the whole response
  when there is none;
- `code` tests are Python statements (asserts) that upstream runs after the program; `code_stdio` tests are
  `{"input": ..., "output": ...}` pairs: the program runs with the input on stdin and passes when its
  output matches as upstream's LiveCodeBench grader (`code_utils/testing_util.py`) compares: the same
  number of lines, each stripped, equal as text or as lists of Decimals;
- the verdicts are never the program's process's (upstream let the test run in the program's process and
  took its exit status): each test runs as written in a process of its own (olmax.rewards.code_harness),
  and the program in another that holds the program alone (olmax.rewards.code_program), re-run for each
  test as upstream re-runs it. Every use the test makes of a name the program defined is a request on
  one channel between the two (olmax.rewards.code_channel, code_values, code_remote): arguments and
  results cross as data (builtin values and containers, the standard library's data types, numpy arrays,
  instances of the tests' own classes rebuilt by those classes), arguments the program mutated are
  written back into the test's objects after each call, and any other object of the program's stays
  there as a handle that has no truth value, order or hash and equals only itself; a use the tests'
  process refuses fails the test whatever it caught. Names the test uses as modules, and well-known
  names beside the program's, are the tests' process's own (code_tests). No expected value, other test's
  input or test code reaches the program's process (but the description of a constructor that only
  stores its arguments); the tests' process alone says pass or fail, and a stdio program's output is
  compared there too. A program that fails to load fails every test; a test that uses no name of the
  program's is refused (code_tests counts those it can tell at load);
- each test has `seconds` (OLMo 3's scripts: `--code_max_execution_time 6`) for the program's load and
  its own run;
- a program containing `threading`, `multiprocess`, `import os`, `from os`, `shutil`, `import torch`,
  `from torch`, `import sklearn` or `from sklearn` is not run and fails every test (upstream's
  `should_execute`); a program that runs meets upstream's `reliability_guard` (`exit()`, destructive
  `os`/`shutil` calls, `subprocess.Popen` and a few modules disabled), so programs fail as they did there;
- reward = pass rate when it is at least `threshold` (OLMo 3's scripts:
  `--code_pass_rate_reward_threshold 0.99`), else 0; upstream's optional runtime penalty was off.

Isolation (`isolation`, the setting `rewards.code.isolation`; docs/rewards-code-sandbox.md). Either way the
program and the tests run in a child Python (`-I`: no PYTHON* variables, no user site, not the caller's
directory on the path) with an environment of PATH and the BLAS thread counts alone, their stdout and
stderr discarded, each test's two processes under these limits: address space `memory_mb` per process
(RLIMIT_AS; an allocation past it is a MemoryError), CPU seconds (RLIMIT_CPU), written file size
(RLIMIT_FSIZE, 16 MiB), open files (RLIMIT_NOFILE, 64), queued signals and POSIX timers
(RLIMIT_SIGPENDING, 64), no POSIX message queue or core file, and a wall-clock bound per test and for the
whole run; Python's socket constructors and resolvers raise PermissionError. The child reports one record
per test (olmax.rewards.code_records), written by its runner alone.

- namespaces (and auto, the default, where the probe finds them): a boundary, on Linux with
  unprivileged user namespaces. The program runs in its own user, PID, network, IPC, UTS, cgroup and
  mount namespaces (olmax.rewards.code_sandbox), with no capability, not as root, under a seccomp filter
  (olmax.rewards.code_seccomp); it sees a root holding only Python's installation and the loader's
  libraries, read-only; each test's program process is PID 1 of a PID namespace of its own, with a /proc
  of its own processes alone (no /proc/cmdline, no mounts listed in /proc/self/mountinfo) and a 64 MiB,
  4096-inode tmpfs at /tmp of its own, under a hostname of the sandbox's; it has no network
  but a loopback of its own that is down, and opens no socket; the sandbox holds at most PROCESSES processes
  (RLIMIT_NPROC in its user namespace); a root caller's runs as a uid of its own (code_sandbox
  `sandbox_uid`), so that the kernel's per-user accounts are not the caller's; and every process it started
  is gone when `run_tests` returns (the PID namespace's init exits and the kernel kills the rest). Memory:
  the filter refuses what holds memory outside an address space or past the process limits (memfd, System
  V and POSIX IPC, sockets, grown pipes, record locks, io_uring, Linux AIO, epoll, BPF, keys, ...;
  code_seccomp), and keeps each process's mappings in a window of its address space, so that its page
  tables are bounded too: a run holds at most PROCESSES times `memory_mb` of address space and the page
  tables of that window, the scratch (size and inodes), pipes of 64 KiB per pair of descriptors and the
  kernel's own per-process memory (VMAs); where the host delegates a cgroup v2 subtree with the memory
  controller, each run also gets a memory cgroup bounding all of it (code_cgroup;
  docs/rewards-code-sandbox.md has the figures). Not covered: the kernel itself (the calls the filter
  allows are most of them, so a kernel bug in one is within reach), what the host shows a process anyway
  (kernel version, CPUs, total memory and load, the sizes of the filesystems holding Python). The probe
  (`probe`, once per process, ~0.2 s) runs a trivial program in the sandbox; where it fails (gVisor's runsc
  answers unshare(2) with ENOSYS, as on the TPU hosts this project borrows; a container without user
  namespaces, EPERM; a kernel before 5.8, which has no /proc subset=pid; a machine without a filter table),
  auto and namespaces raise SandboxUnavailable naming what it found, and the RL loop refuses to start
  (`check_host`).
- none: no boundary. A fresh temporary directory and its own process session (setsid; its process
  group is killed at the end); the program runs as the caller's user with the caller's files, processes,
  network and session keyring, and code that reaches the OS some other way (ctypes, os.exec*, re-loading a
  disabled module) reads and writes files, opens sockets, signals processes, holds memory and leaves
  daemons behind. Only for a machine (or a container without network) that may lose what it runs, as
  upstream ran its code API in a container.
"""

from __future__ import annotations

import ast
import functools
import json
import logging
import marshal
import os
import platform
import re
import signal
import struct
import subprocess
import sys
import tempfile
import time

from olmax.config.grpo import CODE_ISOLATIONS
from olmax.errors import ConfigError
from olmax.rewards import code_cgroup, code_records, code_runner, code_seccomp, code_tests
from olmax.rewards.code_records import report_bytes

logger = logging.getLogger(__name__)

NAME = "code"
STDIO_NAME = "code_stdio"
SECONDS = 6.0  # per test
THRESHOLD = 0.99
MEMORY_MB = 1024
_FILE_BYTES = 16 << 20
_STARTUP_SECONDS = 5.0  # slack for the child's interpreter start and imports, on top of the tests' own bounds
_TEARDOWN_SECONDS = 2.0  # past the child's own bound, for it to kill its namespace and exit
# each test: its limit, the stdio margin, the runner's slack before it kills the test's processes, and its pause
# before the next
_PER_TEST = code_runner.STDIO_MARGIN + code_runner.SLACK + code_runner.PAUSE
_SCRATCH_BYTES = 64 << 20  # the namespace sandbox's writable /tmp
_SCRATCH_INODES = 4096  # files, directories and links in it (tmpfs nr_inodes: ~1 KiB of kernel memory each)
PROCESSES = 16  # processes the namespace sandbox may hold at once (RLIMIT_NPROC in its user namespace): each
# may hold up to vm.max_map_count VMAs and its memory window's page tables, which only a cgroup would bound
_OPEN_FILES = 64  # descriptors per process (RLIMIT_NOFILE): pipes of 64 KiB at most behind each pair
_PENDING_SIGNALS = 64  # queued signals and POSIX timers per user (RLIMIT_SIGPENDING)
# a run's memory cgroup, where one is delegated: a test's two processes at `memory_mb` each (the runner's
# pages are shared with their forks until written), the scratch, and the interpreters' and the kernel's own
_CGROUP_SLACK = 64 << 20
ISOLATIONS = CODE_ISOLATIONS  # rewards.code.isolation's values, as the config checks them
AUTO, NAMESPACES, NONE = ISOLATIONS
_KILL_SECONDS = 5.0  # the wait for the child's process group to die after the run
# the child's modules, in the order the bootstrap makes them (each imports only those before it)
_CHILD_MODULES = ("code_channel", "code_datatypes", "code_values", "code_seccomp", "code_program", "code_stdio",
                  "code_handles", "code_remote", "code_harness", "code_runner", "code_sandbox")  # fmt: skip
# what the child runs first: its modules from stdin (a length line, then their marshalled code), then main
_BOOTSTRAP = (
    "import marshal, sys, types\n"
    "stream = sys.stdin.buffer\n"
    "for name, code in marshal.loads(stream.read(int(stream.readline()))):\n"
    "    module = sys.modules[name] = types.ModuleType(name)\n"
    "    parent, _, leaf = name.rpartition('.')\n"
    "    if parent:\n"
    "        setattr(sys.modules[parent], leaf, module)\n"
    "    exec(code, module.__dict__)\n"
    "sys.modules['olmax.rewards.code_sandbox'].main(stream)\n"
)
# modules the child imports once before the tests where the program or a test imports them: the standard
# library's but those that act on import or load a GUI, and the packages tests commonly use
_NOT_PRELOADED = frozenset(("antigravity", "this", "idlelib", "tkinter", "turtle", "turtledemo", "__hello__",
                            "__phello__", "webbrowser", "pydoc", "pdb", "ensurepip", "venv", "lib2to3"))  # fmt: skip
_PRELOADED_PACKAGES = frozenset(("numpy", "pytest"))
# the child's environment: one BLAS thread (numpy's OpenBLAS would start one per core, each counted against
# PROCESSES), and OPENBLAS_MAIN_FREE set, which numpy (2.x `_core/__init__.py`) otherwise sets with
# os.putenv on import, a call upstream's guard disables
_ENVIRONMENT = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
                "OPENBLAS_MAIN_FREE": "1"}  # fmt: skip

# upstream refuses to run a program containing any of these (code_utils.py `should_execute`)
REFUSED = ("threading", "multiprocess", "import os", "from os", "shutil", "import torch", "from torch",
           "import sklearn", "from sklearn")  # fmt: skip

_BLOCK = re.compile(r"```(?:python)?(.*?)```", re.DOTALL)


# the probe's program: a fan-out until refused (the children wait to be killed with the namespace), checked
# against the cap (counted in the sandbox's user namespace alone: before Linux 5.14 it counted every process
# of the uid, so that a busy user would be refused every fork); what /proc, the network, the filter and the
# host show
_PROBE_PROGRAM = f"""
import os, signal
def forks():
    made = 0
    for _ in range({PROCESSES} + 8):
        try:
            pid = os.fork()
        except OSError:
            break
        if pid == 0:
            while True:
                signal.pause()
        made += 1
    return made
def processes():
    return len([p for p in os.listdir("/proc") if p.isdigit()])
def interfaces():
    return [line.split(":")[0].strip() for line in open("/proc/self/net/dev").readlines()[2:]]
def filtered():
    try:
        os.memfd_create("probe")
    except PermissionError:
        return "Seccomp:\\t2" in open("/proc/self/status").read()
    return False
def hidden():
    return os.path.exists("/proc/cmdline"), open("/proc/self/mountinfo").read(), os.uname().nodename
"""
_PROBES = (
    (f"assert {PROCESSES // 2} <= forks() < {PROCESSES} and processes() <= {PROCESSES} and interfaces() == ['lo']",
     f"the process cap (RLIMIT_NPROC, {PROCESSES}) does not hold per user namespace here, /proc shows other "
     "processes, or the network has more than loopback"),
    ("assert filtered()", "the system call filter (seccomp) is not in force"),
    ("assert hidden() == (False, '', 'sandbox')", "the host shows through: /proc/cmdline (/proc subset=pid), the "
     "mounts in /proc/self/mountinfo or the hostname (UTS namespace)"),
)  # fmt: skip


class SandboxError(RuntimeError):
    """A step of entering the namespace sandbox failed in the child (the message names it)."""


class SandboxUnavailable(ConfigError):
    """Isolation auto or namespaces asked for where the namespace sandbox does not work."""


class VerifierTimeout(TimeoutError):
    """A program that ran past its time limit; `olmax.rewards.verifiers.score` counts it as "timeout"."""


class VerifierOverflow(RuntimeError):
    """A child whose report was not records, or past what the verifier reads (`report_bytes`): killed,
    every test "overflow", reward 0; `olmax.rewards.verifiers.score` counts it as "error". Only the
    sandbox's runner writes the report (no process of the program's holds it)."""


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


def refused(program: str) -> bool:
    """Whether upstream would not run the program at all (`should_execute` in code_utils.py: any of these
    substrings anywhere in it), scoring every test as failed."""
    return any(word in program for word in REFUSED)


@functools.cache
def probe() -> str | None:
    """None when the namespace sandbox works on this machine, else what the probe found: the step that
    failed, naming the mechanism where the host may lack it ("namespaces (user, ...): unshare(...): Operation
    not permitted", "/proc subset=pid (Linux 5.8): mount(...)", "seccomp: ..."), with its errno, or the check
    that did not hold. Run once per process (~0.15 s): a trivial program in the sandbox whose tests fan out past
    PROCESSES and read their own /proc and network, check that the system call filter is in force, and that
    the host's command line, mounts and hostname are out of sight."""
    if sys.platform != "linux":
        return f"namespaces are Linux's, this is {sys.platform}"
    try:
        tests = [test for test, _ in _PROBES]
        outcomes = _run_child(_PROBE_PROGRAM, tests, False, 5.0, MEMORY_MB, NAMESPACES)
    except SandboxError as e:
        return str(e)
    for (outcome, reason), (_, why) in zip(outcomes, _PROBES):
        if outcome != "pass":
            return f"the probe's test came back {outcome!r} ({reason}): {why}"
    return None


def check_host(isolation: str = AUTO) -> None:
    """Refuse to start RL with code rewards on a host that lacks a mechanism `isolation` needs: raises
    SandboxUnavailable (a ConfigError) whose message names what is missing, as the probe found it (user
    namespaces, /proc subset=pid, seccomp or its filter for this machine, ...), and the opt-out,
    rewards.code.isolation=none; an isolation that is not one of ISOLATIONS is a ConfigError too. Returns
    for none (no mechanism needed) and where the sandbox works. For the start of a run whose prompts name
    code or code_stdio, before any sampling (`run_options` makes the same check)."""
    isolation_in_force(isolation)


def isolation_in_force(isolation: str = AUTO) -> str:
    """NAMESPACES or NONE: what the setting `rewards.code.isolation` means on this machine. auto (the
    default) takes the strongest isolation the machine has and refuses where it has none; today the
    namespace sandbox is the only one, so auto and namespaces both raise SandboxUnavailable, naming what
    the probe found, where it does not work."""
    if isolation not in ISOLATIONS:
        raise ConfigError(f"rewards.code.isolation={isolation!r} is not one of {', '.join(ISOLATIONS)}")
    if isolation == NONE:
        return NONE
    why = probe()
    if why is not None:
        raise SandboxUnavailable(
            f"the code verifier cannot isolate programs here ({why}); run generated code without a sandbox "
            "only on a machine that may lose what it runs, with rewards.code.isolation=none"
        )
    return NAMESPACES


def describe(isolation: str) -> str:
    """One line for a run's log: the isolation in force (what `isolation_in_force` returned)."""
    if isolation == NONE:
        return "code verifier isolation: none (rewards.code.isolation=none: generated programs run as this user)"
    return (
        "code verifier isolation: namespaces (user, PID, network, IPC, UTS, cgroup and mount; a read-only root of "
        f"Python alone, a {_SCRATCH_BYTES >> 20} MiB scratch tmpfs, at most {PROCESSES} processes; a seccomp filter; "
        f"{code_cgroup.delegated()[1]})"
    )


def run_options(isolation: str, names) -> dict:
    """The options (`olmax.rewards.verifiers.reward`'s) for a run whose rows name the verifiers `names`: the
    isolation in force for code and code_stdio, {} when neither is named. Raises SandboxUnavailable,
    before anything runs, where `isolation` asks for a sandbox this machine cannot make."""
    if not {NAME, STDIO_NAME} & {name.lower() for name in names}:
        return {}
    mode = isolation_in_force(isolation)
    return {NAME: {"isolation": mode}, STDIO_NAME: {"isolation": mode}}


def run_tests(
    program: str,
    tests: list,
    *,
    stdio: bool = False,
    seconds: float = SECONDS,
    memory_mb: int = MEMORY_MB,
    isolation: str = AUTO,
) -> list[str]:
    """Each test's outcome, "pass", "fail", "timeout" or "overflow", running `program` and each test in
    processes of their own in the sandbox (module docstring) under `isolation` (`isolation_in_force`):
    `judge`'s outcomes."""
    return [outcome for outcome, _ in judge(program, tests, stdio=stdio, seconds=seconds, memory_mb=memory_mb,
                                            isolation=isolation)]  # fmt: skip


def judge(
    program: str,
    tests: list,
    *,
    stdio: bool = False,
    seconds: float = SECONDS,
    memory_mb: int = MEMORY_MB,
    isolation: str = AUTO,
) -> list[tuple[str, str]]:
    """Each test's (outcome, reason): the outcome "pass", "fail", "timeout" or "overflow"; the reason what
    the tests' process said of a test that did not pass (an assert that failed and its line, what the test
    raised, a use of a program object it refused, the program's failure to load, ...). A test refused at
    load (code_tests) fails without running; one the child never reported is "timeout" when the run
    reached its overall bound, else "fail"; every test is "overflow" when the child's output stopped being
    records (olmax.rewards.code_records: it was killed then). Raises ValueError naming a test that is not
    one (a `code` test that is not a string or HumanEval object, a `code_stdio` one without input and
    output)."""
    mode = isolation_in_force(isolation)
    if not tests:
        return []
    code_tests.check(tests, stdio)
    if refused(program):
        return [("fail", "upstream does not run a program that names " + next(w for w in REFUSED if w in program))
                ] * len(tests)  # fmt: skip
    return _run_child(program, tests, stdio, seconds, memory_mb, mode)


def _specs(tests: list, stdio: bool) -> tuple[list, list, set]:
    """(what the tests' processes read of each test to run, indices of the tests that run, the modules the
    tests import)."""
    if stdio:
        return [{"input": str(t["input"]), "output": str(t["output"])} for t in tests], list(range(len(tests))), set()
    plans = [code_tests.plan(test) for test in tests]
    runs = [i for i, p in enumerate(plans) if p.form == code_tests.RUN]
    return [plans[i].spec() for i in runs], runs, {name for i in runs for name in plans[i].imports}


def tests_file(specs: list):
    """A file holding `specs` for the child (code_runner `read_spec`): their count, their offsets, then
    each as JSON. Unnamed; the child gets its descriptor, and only each test's own process reads it."""
    blobs = [json.dumps(spec).encode() for spec in specs]
    offsets, at = [], 8 * (len(blobs) + 2)
    for blob in blobs:
        offsets.append(at)
        at += len(blob)
    handle = tempfile.TemporaryFile()
    handle.write(struct.pack(f"<{len(blobs) + 2}Q", len(blobs), *offsets, at) + b"".join(blobs))
    handle.flush()
    return handle


def _preload(program: str, imports: set) -> list:
    """The modules the child imports before the tests (_PRELOADED_PACKAGES, the standard library's but
    _NOT_PRELOADED) that the program or the tests import."""
    try:
        imports = imports | code_tests.imported(ast.parse(program))
    except (SyntaxError, ValueError, RecursionError):
        pass
    allowed = (set(sys.stdlib_module_names) - _NOT_PRELOADED) | _PRELOADED_PACKAGES
    return sorted(name for name in imports if name in allowed and not name.startswith("_"))


@functools.cache
def _payload() -> bytes:
    """The child's modules, compiled here once and marshalled (the bootstrap makes them modules)."""
    here = os.path.dirname(os.path.abspath(__file__))
    modules = [("olmax", compile("", "<olmax>", "exec")), ("olmax.rewards", compile("", "<olmax.rewards>", "exec"))]
    for name in _CHILD_MODULES:
        with open(os.path.join(here, f"{name}.py")) as f:
            # a name of the module's own, not its path: nothing of the caller's files shows in the sandbox
            modules.append((f"olmax.rewards.{name}", compile(f.read(), f"<olmax {name}>", "exec", dont_inherit=True)))
    blob = marshal.dumps(modules)
    return f"{len(blob)}\n".encode() + blob


def _cgroup(isolation: str, memory_mb: int) -> str:
    """A memory cgroup for a run under isolation namespaces where the host delegates one
    (olmax.rewards.code_cgroup), else "" (and a warning if making it failed)."""
    parent = code_cgroup.delegated()[0] if isolation == NAMESPACES else None
    if parent is None:
        return ""
    try:
        return code_cgroup.make(parent, (2 * memory_mb << 20) + _SCRATCH_BYTES + _CGROUP_SLACK, PROCESSES + 3)
    except OSError as e:
        logger.warning("code sandbox: no memory cgroup for this run under %s (%s)", parent, e.strerror)
        return ""


_OUTCOMES = {"p": "pass", "f": "fail", "r": "fail", "t": "timeout"}


@functools.lru_cache(maxsize=4096)
def _log_refusal(reason: str, test: str) -> None:
    # once per (reason, test): the RL loop verifies each prompt's tests once per sample
    logger.warning("code test refused (never passes): %s: %.200r", reason, test)


def _run_child(program: str, tests: list, stdio: bool, seconds: float, memory_mb: int, isolation: str) -> list[str]:
    if isolation == NAMESPACES:
        try:
            code_seccomp.check_machine(platform.machine())
        except code_seccomp.Unsupported as e:
            raise SandboxError(str(e)) from None
    specs, runs, imports = _specs(tests, stdio)
    outcomes: list = [("fail", code_tests.plan(test).why) for test in tests] if not stdio else [None] * len(tests)
    if not runs:
        return outcomes
    for index in runs:
        outcomes[index] = None

    def on_record(kind: str, index: int, payload: bytes) -> None:
        if kind == "error":
            raise SandboxError(payload.decode(errors="replace"))
        reason = payload.decode(errors="replace")
        outcomes[runs[index]] = (_OUTCOMES[kind], reason)
        if kind == "r":
            _log_refusal(reason, code_tests.source_of(tests[runs[index]]))

    job = {
        "program": program,
        "stdio": stdio,
        "tests": len(specs),
        "seconds": seconds,
        "memory_mb": memory_mb,
        "file_bytes": _FILE_BYTES,
        "scratch_bytes": _SCRATCH_BYTES,
        "scratch_inodes": _SCRATCH_INODES,
        "processes": PROCESSES,
        "open_files": _OPEN_FILES,
        "pending_signals": _PENDING_SIGNALS,
        "preload": _preload(program, imports),
        "bound": _run_bound(len(specs), seconds),
        "isolation": isolation,
        "cgroup": _cgroup(isolation, memory_mb),
    }
    # without namespaces the program's files go to a fresh directory of the caller's (deleted after)
    scratch = tempfile.TemporaryDirectory(prefix="olmax-code-") if isolation == NONE else None
    cwd = scratch.name if scratch else "/"
    env = {"PATH": os.defpath, **_ENVIRONMENT, **({"HOME": cwd, "TMPDIR": cwd} if scratch else {})}
    with tests_file(specs) as held:
        job["tests_fd"] = held.fileno()
        child = subprocess.Popen(
            [sys.executable, "-I", "-c", _BOOTSTRAP],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            cwd=cwd,
            env=env,
            start_new_session=True,
            pass_fds=(held.fileno(),),
        )
    # a sandbox's keeper kills its namespace at the bound itself; past it, this is for one that cannot
    bound = job["bound"] + (_TEARDOWN_SECONDS if scratch is None else 0.0)
    try:
        state = code_records.exchange(
            child, _payload() + json.dumps(job).encode(), code_records.Records(len(specs), on_record), bound
        )
    finally:
        _kill_group(child)
        if scratch:
            scratch.cleanup()
        if job["cgroup"]:
            code_cgroup.remove(job["cgroup"])
    if state == "overflow":
        return [("overflow", "the child's output is not records")] * len(tests)
    missing = ("timeout", "the run reached its bound") if state == "timeout" else ("fail", "the child ended first")
    return [outcome or missing for outcome in outcomes]


def _run_bound(tests: int, seconds: float) -> float:
    # each test, `seconds` and the runner's margins, after the child's start
    return (seconds + _PER_TEST) * tests + _STARTUP_SECONDS


def time_bound(ground_truth, *, seconds: float = SECONDS, **_) -> float:
    """The longest a verify call on `ground_truth` may legitimately run: the sandbox's bound on the
    whole run, a sandbox's teardown and the kill after it. `olmax.rewards.verifiers.score` bounds the call by no
    less, so a correct program with many tests is not cut off while its tests still run within their
    limits."""
    return _run_bound(len(parse_tests(ground_truth)), seconds) + _TEARDOWN_SECONDS + _KILL_SECONDS


def _kill_group(child: subprocess.Popen) -> None:
    # the child's session holds every process the program started (forks included): end them all
    try:
        os.killpg(child.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    deadline = time.monotonic() + _KILL_SECONDS
    while child.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    for pipe in (child.stdin, child.stdout):
        if pipe is not None and not pipe.closed:
            pipe.close()


def reward(outcomes: list[str], threshold: float = THRESHOLD) -> float:
    """The pass rate when it reaches `threshold`, else 0 (no tests: 0, as upstream)."""
    rate = outcomes.count("pass") / len(outcomes) if outcomes else 0.0
    return rate if rate >= threshold else 0.0


def _verify(response, ground_truth, stdio, seconds, memory_mb, threshold, isolation) -> float:
    program, tests = extract_program(response), parse_tests(ground_truth)
    outcomes = run_tests(program, tests, stdio=stdio, seconds=seconds, memory_mb=memory_mb, isolation=isolation)
    if "overflow" in outcomes:
        raise VerifierOverflow(
            "the sandbox's report to the verifier was not records (more than "
            f"{report_bytes(len(tests))} bytes, or what is no record): killed, reward 0"
        )
    score = reward(outcomes, threshold)
    if score == 0.0 and "timeout" in outcomes:
        # still reward 0, but the RL loop counts programs that hang apart from wrong ones
        raise VerifierTimeout(f"{outcomes.count('timeout')} of {len(outcomes)} tests ran past {seconds} s")
    return score


def verify(
    response: str,
    ground_truth,
    *,
    seconds: float = SECONDS,
    memory_mb: int = MEMORY_MB,
    threshold: float = THRESHOLD,
    isolation: str = AUTO,
) -> float:
    """The reward of the program in `response` on assert-statement tests (`code`)."""
    return _verify(response, ground_truth, False, seconds, memory_mb, threshold, isolation)


def verify_stdio(
    response: str,
    ground_truth,
    *,
    seconds: float = SECONDS,
    memory_mb: int = MEMORY_MB,
    threshold: float = THRESHOLD,
    isolation: str = AUTO,
) -> float:
    """The reward of the program in `response` on input/output tests (`code_stdio`)."""
    return _verify(response, ground_truth, True, seconds, memory_mb, threshold, isolation)
