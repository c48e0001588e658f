"""The code verifier's cost per program with and without its namespace sandbox, measured in one run.

    .venv/bin/python benchmarks/code_sandbox.py [--programs 20 --rounds 3 --before REF --json out.json]
    .venv/bin/python benchmarks/code_sandbox.py --corpus [--rounds 2 --before REF]
    .venv/bin/python benchmarks/code_sandbox.py --forgeries [--before REF]
    .venv/bin/python benchmarks/code_sandbox.py --timing [--rounds 16 --before REF]
    .venv/bin/python benchmarks/code_sandbox.py --kernel [--only NAMES --before REF]   (as root)

Each of `--programs` honest programs is verified by `olmax.rewards.code` in this process: a function with
three assert tests (`verify`, "code" rows) and a stdin/stdout program with three input/output tests
(`verify_stdio`, "stdio" rows), each with isolation none (a child Python, as before the sandbox) and with
isolation namespaces (the same child entering user, PID, network, IPC, UTS, cgroup and mount namespaces, a
read-only root and its system call filter first), alternating so that all see the same load. With `--before
REF` (a git revision of this repository, e.g. the commit a change branched from), the verifier as it was at
REF (every `olmax/rewards/code*.py` of REF, loaded as one package from a temporary directory, so that it
runs its own child and filter) is timed too, in the same alternation, as "REF ...": the cost of a change
to the verifier, measured under one load. `--rounds` passes over the programs; the table gives each row's
median and 90th percentile milliseconds per program and the sandbox's extra cost. The probes (once per
process and verifier) are paid before the timing. Asserts that every program scores 1.0; prints a table.
The CPUs here are shared with other jobs.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from olmax.rewards import code

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REWARDS = "src/olmax/rewards"


def programs(n: int) -> list[tuple[str, str, list]]:
    """`n` honest programs, each twice: (kind, response, tests) for a function with three assert tests and
    for a stdin/stdout program with three input/output tests (a different constant each, so none is
    cached)."""
    out = []
    for i in range(n):
        source = f"```python\ndef scale(xs):\n    return [x * {i + 2} for x in xs]\n```"
        tests = [
            f"assert scale([1]) == [{i + 2}]",
            "assert scale([]) == []",
            f"assert scale([0, 3]) == [0, {3 * (i + 2)}]",
        ]
        out.append(("code", source, tests))
        stdio = f"```python\nn = int(input())\nprint(n * {i + 2})\n```"
        out.append(("stdio", stdio, [{"input": f"{k}\n", "output": f"{k * (i + 2)}\n"} for k in (1, 5, 9)]))
    return out


def load_before(ref: str, into: str):
    """The code verifier module as it was at git revision `ref`: every `code*.py` of `olmax/rewards` at
    `ref`, written to a package of its own under `into` (their imports of each other pointed there) and
    imported from it, its child script beside it."""
    package = "olmax_code_at_" + "".join(c if c.isalnum() else "_" for c in ref)
    os.makedirs(os.path.join(into, package))
    open(os.path.join(into, package, "__init__.py"), "w").close()
    listed = subprocess.run(
        ["git", "-C", REPO, "ls-tree", "--name-only", f"{ref}:{REWARDS}"], capture_output=True, text=True, check=True
    )
    for name in listed.stdout.split():
        if name.startswith("code") and name.endswith(".py"):
            text = subprocess.run(["git", "-C", REPO, "show", f"{ref}:{REWARDS}/{name}"], capture_output=True,
                                  text=True, check=True).stdout  # fmt: skip
            # its imports, and the names its child gives its modules (the bootstrap's), pointed at the package
            text = text.replace("from olmax.rewards import ", f"from {package} import ")
            text = text.replace("olmax.rewards.", f"{package}.").replace('("olmax.rewards", ', f'("{package}", ')
            with open(os.path.join(into, package, name), "w") as f:
                f.write(text)
    sys.path.insert(0, into)
    return importlib.import_module(f"{package}.code")


# --kernel: the attacks a review made on kernel resources, full size, each run through the verifier (in the
# sandbox only, memory_mb=64 unless named) while this process measures the host from outside
PRELUDE = """import ctypes, mmap, struct, time
os = __import__('o' + 's')
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype, libc.mmap.restype = ctypes.c_long, ctypes.c_void_p
MAP_FAILED = ctypes.c_void_p(-1).value
def name():  # PR_SET_NAME: the measuring process finds the attack's processes by it
    libc.prctl(15, b"olmaxpt", 0, 0, 0)
def fan_out(n, work):  # n - 1 children (as many as the cap allows) and this process each do `work` and hold it
    for _ in range(n - 1):
        try:
            child = os.fork()
        except OSError:
            break
        if child == 0:
            work()
            time.sleep(30)
    work()
    time.sleep(HOLD)
"""
KERNEL_ATTACKS = {
    # io_setup(2) contexts, host-wide (fs.aio-max-nr): 8 processes take what they can
    "aio_contexts": """def work():
    while libc.syscall(206, ctypes.c_long(1), ctypes.byref(ctypes.c_ulong(0))) == 0:
        pass
fan_out(8, work)""",
    # TCP sockets kept past close() by mmap, each with a 4096-instruction reuseport cBPF program and MD5 keys
    "tcp_sockets": """code = (struct.pack("=HBBI", 0x00, 0, 0, 0) * 4095) + struct.pack("=HBBI", 0x16, 0, 0, 0)
prog = ctypes.create_string_buffer(code, len(code))
fprog = struct.pack("=HxxxxxxQ", 4096, ctypes.addressof(prog))
def work():
    for _ in range(1000):
        fd = libc.socket(2, 1, 0)
        if fd < 0:
            return
        libc.setsockopt(fd, 1, 15, struct.pack("=i", 1), 4)  # SO_REUSEPORT
        libc.setsockopt(fd, 1, 51, fprog, len(fprog))  # SO_ATTACH_REUSEPORT_CBPF
        for k in range(256):
            key = struct.pack("=HH4s", 2, 0, bytes([10, 0, k, 1])) + bytes(120) + struct.pack("=BBHI", 0, 0, 80, 0)
            if libc.setsockopt(fd, 6, 14, key + bytes(80), 216) != 0:  # TCP_MD5SIG, up to optmem_max
                break
        libc.mmap(None, 4096, 1, 1, fd, 0)
        libc.close(fd)
fan_out(1, work)""",
    # pending IOCB_CMD_POLL on pipes, which keep them past close()
    "aio_polled_pipes": """def work():
    ctx = ctypes.c_ulong(0)
    if libc.syscall(206, ctypes.c_long(4096), ctypes.byref(ctx)) != 0:
        return
    for _ in range(2000):  # a full pipe, each end polled for what it never gets: each poll keeps its end's file
        r, w = os.pipe()
        os.write(w, bytes(65536))
        for end, events in ((r, 2), (w, 1)):  # POLLPRI, POLLIN
            iocb = struct.pack("=QIIHhIQQqQII", 0, 0, 0, 5, 0, end, events, 0, 0, 0, 0, 0)
            iocb = ctypes.create_string_buffer(iocb, 64)
            pointer = ctypes.c_void_p(ctypes.addressof(iocb))
            if libc.syscall(209, ctx, ctypes.c_long(1), ctypes.byref(pointer)) != 1:
                return
        os.close(r)
        os.close(w)
fan_out(1, work)""",
    # epoll watches: 16 instances x 8 pipes x every free descriptor number, in 31 processes
    "epoll_watches": """def work():
    eps = [libc.epoll_create1(0) for _ in range(16)]
    if min(eps) < 0:
        return
    pipes, event = [os.pipe() for _ in range(8)], struct.pack("=IQ", 1, 0)
    for r, w in pipes:
        os.close(w)
    for number in range(max(eps + [r for r, _ in pipes]) + 1, 64):
        for pipe, _ in pipes:
            os.dup2(pipe, number)
            for ep in eps:
                libc.epoll_ctl(ep, 1, number, event)
            os.close(number)
fan_out(31, work)""",
    # page tables: one page touched every 2 MiB of an address space as large as RLIMIT_AS allows, 31 processes
    "page_tables": """def work():
    size = (MEMORY_MB - 48) << 20
    region = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    for at in range(0, size, 2 << 20):
        region[at] = 1
    KEEP.append(region)
KEEP = []
fan_out(31, work)""",
    # VMAs: one mapping per page, alternating protections so that none merge, up to vm.max_map_count
    # page tables of sparse mappings (what RLIMIT_AS does not count): one page touched at each of 65,000 address
    # hints a GiB apart; the same by address-free maps, unmapped but for one middle page each so that the next
    # lands below; one page at each 2 MiB of the process's memory window, by hints inside it (the most the
    # window leaves); and the control, as many pages contiguous
    "pt_hints": """def work():
    name()
    for i in range(65000):
        p = libc.mmap(ctypes.c_void_p((1 << 40) + i * (1 << 30)), 4096, 3, 0x22, -1, 0)
        if p in (None, MAP_FAILED):
            break
        ctypes.c_char.from_address(p).value = b'x'
fan_out(PROCESSES, work)""",
    "pt_fragments": """def work():
    name()
    size = (MEMORY_MB * 6 // 10) << 20
    for i in range(65000):
        p = libc.mmap(None, size, 3, 0x22, -1, 0)
        if p in (None, MAP_FAILED):
            break
        middle = p + size // 2
        ctypes.c_char.from_address(middle).value = b'x'
        if libc.munmap(ctypes.c_void_p(p), middle - p) or libc.munmap(ctypes.c_void_p(middle + 4096), size // 2 - 4096):
            break
fan_out(PROCESSES, work)""",
    "pt_window": """def work():
    name()
    low = min(int(line.split('-')[0], 16) for line in open('/proc/self/maps') if '/lib' in line)
    for at in range(low - (2 << 20), low - MEMORY_MB * (3 << 19), -(2 << 20)):
        p = libc.mmap(ctypes.c_void_p(at), 4096, 3, 0x100022, -1, 0)  # MAP_FIXED_NOREPLACE
        if p in (None, MAP_FAILED):
            continue
        ctypes.c_char.from_address(p).value = b'x'
fan_out(PROCESSES, work)""",
    "pt_control": """def work():
    name()
    p = libc.mmap(None, 65000 * 4096, 3, 0x22, -1, 0)
    for at in range(0, 65000 * 4096, 4096):
        ctypes.c_char.from_address(p + at).value = b'x'
fan_out(PROCESSES, work)""",
    "vmas": """def work():
    size = min((MEMORY_MB - 48) << 20, 65000 * 4096)
    base = libc.mmap(None, size, 3, 0x22, -1, 0)  # PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS
    for at in range(0, size, 8192):
        libc.mprotect(ctypes.c_void_p(base + at), 4096, 1)
fan_out(31, work)""",
}


def _host() -> dict:
    """What the attacks hold, read from outside: /proc/meminfo's unreclaimable slab, page tables and memory in
    use (total - available; KiB, the last noisy on a shared host), the host's AIO contexts, and slab objects of
    the caches the attacks fill (root only; 0 where unreadable)."""
    with open("/proc/meminfo") as f:
        meminfo = {line.split(":")[0]: int(line.split()[1]) for line in f}
    with open("/proc/sys/fs/aio-nr") as f:
        figures = {"SUnreclaim_kib": meminfo["SUnreclaim"], "PageTables_kib": meminfo["PageTables"],
                   "used_kib": meminfo["MemTotal"] - meminfo["MemAvailable"], "aio_nr": int(f.read())}  # fmt: skip
    try:
        with open("/proc/slabinfo") as f:
            slabs = {line.split()[0]: int(line.split()[1]) for line in f.readlines()[2:]}
    except OSError:
        slabs = {}
    for name in ("TCP", "eventpoll_epi", "vm_area_struct", "kioctx"):
        figures[name] = slabs.get(name, 0)
    figures["attackers_VmPTE_kib"] = figures["attacker_max_VmPTE_kib"] = 0
    for pid in filter(str.isdigit, os.listdir("/proc")):  # the attack's processes, by the name they took
        try:
            with open(f"/proc/{pid}/status") as f:
                status = dict(line.split(":", 1) for line in f if ":" in line)
        except OSError:
            continue
        if status.get("Name", "").strip() == "olmaxpt" and "VmPTE" in status:
            pte = int(status["VmPTE"].split()[0])
            figures["attackers_VmPTE_kib"] += pte
            figures["attacker_max_VmPTE_kib"] = max(figures["attacker_max_VmPTE_kib"], pte)
    return figures


def _control() -> bool:
    """An io_setup of this process's (outside the sandbox): does AIO still work for another user?"""
    import ctypes

    libc, ctx = ctypes.CDLL(None), ctypes.c_ulong(0)
    made = libc.syscall(206, 1, ctypes.byref(ctx)) == 0
    if made:
        libc.syscall(207, ctx)
    return made


def _measure(module, program: str, memory_mb: int) -> dict:
    """The largest rise of each host figure while `program` ran through `module`'s verifier (isolation
    namespaces), and whether this process's own io_setup failed meanwhile."""
    import threading

    before, peak, failed, done = _host(), _host(), [], threading.Event()

    def run() -> None:
        module.run_tests(program, ["assert HOLD > 0"], seconds=60.0, memory_mb=memory_mb, isolation=code.NAMESPACES)
        done.set()

    thread = threading.Thread(target=run)
    thread.start()
    while not done.wait(0.02):
        peak = {k: max(v, peak[k]) for k, v in _host().items()}
        failed.append(not _control())
    thread.join()
    return {k: peak[k] - before[k] for k in before} | {"control_io_setup_failed": any(failed)}


def kernel(verifiers: dict, memory_mbs: list[int], only: list[str]) -> dict:
    """Each attack (of `only`, when given) through each verifier, measured from outside (`_measure`);
    printed as it goes."""
    rows = {}
    for name, body in KERNEL_ATTACKS.items():
        if only and name not in only:
            continue
        sizes = [1024] if name.startswith("pt_") else memory_mbs if name in ("page_tables", "vmas") else memory_mbs[:1]
        for memory_mb in sizes:
            for processes in (1, 31) if name.startswith("pt_") and name != "pt_control" else (1,):
                hold = 8.0 if name in ("page_tables", "vmas") or processes > 1 else 2.0  # many processes' work
                program = f"HOLD = {hold}\nMEMORY_MB = {memory_mb}\nPROCESSES = {processes}\n{PRELUDE}{body}"
                for label, module in verifiers.items():
                    if label and name.startswith("pt_") and processes > 1:
                        continue  # 31 x 500 MiB of page tables: more than a shared host should give
                    key = f"{label}{name} (memory_mb={memory_mb}, processes={processes})"
                    rows[key] = row = _measure(module, program, memory_mb)
                    print(f"{key}: {row}", flush=True)
    return rows


def corpus(verifiers: dict, rounds: int) -> dict:
    """Each honest program of tests/fixtures/code/corpus.jsonl (HumanEval, MBPP, LeetCode, stdio, assert
    lists), verified `rounds` times under isolation namespaces by each verifier, alternating: the median and
    90th percentile ms per program, and how many scored 1.0."""
    with open(os.path.join(REPO, "tests/fixtures/code/corpus.jsonl")) as f:
        entries = [json.loads(line) for line in f]
    times: dict = {label: [] for label in verifiers}
    passed: dict = {label: 0 for label in verifiers}
    for _ in range(rounds):
        for entry in entries:
            for label, module in verifiers.items():
                verify = module.verify_stdio if entry["verifier"] == "code_stdio" else module.verify
                start = time.perf_counter()
                try:
                    score = verify(entry["honest"], entry["ground_truth"], isolation=code.NAMESPACES)
                except Exception:  # the verifier before refused a form, or timed out
                    score = 0.0
                times[label].append((time.perf_counter() - start) * 1e3)
                passed[label] += score == 1.0
    rows = {
        f"{label}corpus namespaces": {"median_ms": statistics.median(ms), "programs": len(ms),
                                      "p90_ms": statistics.quantiles(ms, n=10)[-1], "scored_1": passed[label]}
        for label, ms in times.items()
    }  # fmt: skip
    for name, row in rows.items():
        print(f"{name}: {row['programs']} programs, median {row['median_ms']:.1f} ms, p90 {row['p90_ms']:.1f} ms, "
              f"{row['scored_1']} scored 1.0")  # fmt: skip
    return rows


def forgeries(verifiers: dict) -> dict:
    """Each forgery of tests/rewards/test_code_forgeries.py (FORGERIES, REVIEWED, SECOND_REVIEW), scored by each
    verifier (isolation namespaces, 2 s a test, reward threshold as the RL loop's): which score 1.0, per table."""
    import importlib.util

    path = os.path.join(REPO, "tests/rewards/test_code_forgeries.py")
    spec = importlib.util.spec_from_file_location("code_forgeries", path)
    tables = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tables)
    rows = {}
    for table in ("FORGERIES", "REVIEWED", "SECOND_REVIEW"):
        for label, module in verifiers.items():
            forged = []
            for name, (program, tests) in sorted(getattr(tables, table).items()):
                try:
                    score = module.verify(f"```python\n{program}\n```", tests, seconds=2.0, isolation=code.NAMESPACES)
                except Exception:  # a timeout or a refused form: not forged
                    score = 0.0
                if score == 1.0:
                    forged.append(name)
            rows[f"{label}{table}"] = forged
            print(f"{label}{table}: {len(forged)} of {len(getattr(tables, table))} score 1.0: {' '.join(forged)}")
    return rows


# --timing: a program that ends its `square(n)` test at a clock phase encoding n, and reads n back from the clock
# in the next test (`root`), past the latency between two tests (DELAY)
TIMING = """import time
SLOT, PERIOD, DELAY = {slot}, {period}, 0.02
def square(n):
    while abs(time.time() % PERIOD - (n + 0.5) * SLOT) > SLOT / 5:
        time.sleep(SLOT / 50)
    return n * n
def root(m):
    return int((time.time() - DELAY) % PERIOD // SLOT)
"""


def timing(verifiers: dict, rounds: int) -> dict:
    """How often `root` reads the previous test's input from the clock phase `square` ended at, with 16 phases
    of 0.2 s and 8 of 40 ms, `rounds` rows each (a random input each), through each verifier, alternating."""
    import random

    rows: dict = {}
    for slot, period in ((0.2, 3.2), (0.04, 0.32)):
        phases = round(period / slot)
        for _ in range(rounds):
            n = random.randrange(phases)
            tests = [f"assert square({n}) == {n * n}", f"assert root({n * n}) == {n}"]
            for label, module in verifiers.items():
                program = TIMING.format(slot=slot, period=period)
                outcome = module.run_tests(program, tests, isolation=code.NAMESPACES)[1]
                key = f"{label}{phases} phases of {slot} s"
                rows[key] = rows.get(key, 0) + (outcome == "pass")
    for key, right in rows.items():
        print(f"{key}: read right {right} of {rounds} times")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--programs", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--before", help="also time the verifier as it was at this git revision")
    parser.add_argument("--json", help="also write the figures here")
    parser.add_argument("--kernel", action="store_true", help="measure the kernel-resource attacks instead (root)")
    parser.add_argument("--only", default="", help="with --kernel: these attacks alone (comma-separated)")
    parser.add_argument("--corpus", action="store_true", help="time the honest programs of the test corpus instead")
    parser.add_argument("--forgeries", action="store_true", help="score the forgery tests' programs instead")
    parser.add_argument("--timing", action="store_true", help="measure the timing channel between tests instead")
    args = parser.parse_args()
    verifiers = {"": code}
    with tempfile.TemporaryDirectory(prefix="olmax-code-before-") as into:
        if args.before:
            verifiers[f"{args.before} "] = load_before(args.before, into)
        for module in verifiers.values():
            if module.probe() is not None:
                raise SystemExit(f"no namespace sandbox here: {module.probe()}")
        if args.corpus or args.forgeries or args.timing:
            rows = (corpus(verifiers, args.rounds) if args.corpus else forgeries(verifiers) if args.forgeries
                    else timing(verifiers, args.rounds))  # fmt: skip
            if args.json:
                with open(args.json, "w") as f:
                    json.dump(rows, f, indent=1)
            return
        if args.kernel:
            rows = kernel(verifiers, [64, 1024], [name for name in args.only.split(",") if name])
            if args.json:
                with open(args.json, "w") as f:
                    json.dump(rows, f, indent=1)
            return
        times: dict[str, list[float]] = {
            f"{label}{kind} {isolation}": []
            for kind in ("code", "stdio")
            for label in verifiers
            for isolation in (code.NONE, code.NAMESPACES)
        }
        for _ in range(args.rounds):
            for kind, source, tests in programs(args.programs):
                for label, module in verifiers.items():
                    verify = module.verify if kind == "code" else module.verify_stdio
                    for isolation in (code.NONE, code.NAMESPACES):
                        start = time.perf_counter()
                        assert verify(source, tests, isolation=isolation) == 1.0, (label, isolation, source)
                        times[f"{label}{kind} {isolation}"].append((time.perf_counter() - start) * 1e3)
    rows = {
        name: {"median_ms": statistics.median(ms), "p90_ms": statistics.quantiles(ms, n=10)[-1], "programs": len(ms)}
        for name, ms in times.items()
    }
    extra = {
        f"{label}{kind}": rows[f"{label}{kind} {code.NAMESPACES}"]["median_ms"]
        - rows[f"{label}{kind} {code.NONE}"]["median_ms"]
        for kind in ("code", "stdio")
        for label in verifiers
    }
    width = max(len(name) for name in rows) + 2
    print(f"{'isolation':<{width}} {'programs':>8} {'median ms':>10} {'p90 ms':>8}")
    for name, row in rows.items():
        print(f"{name:<{width}} {row['programs']:>8} {row['median_ms']:>10.1f} {row['p90_ms']:>8.1f}")
    for label, ms in extra.items():
        print(f"the sandbox adds {ms:.1f} ms per {label} program (median)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "extra_median_ms": extra}, f, indent=1)


if __name__ == "__main__":
    main()
