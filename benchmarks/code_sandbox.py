"""The code verifier's cost per program with and without its namespace sandbox, measured in one run.

    .venv/bin/python benchmarks/code_sandbox.py [--programs 20 --rounds 3 --before REF --json out.json]

Each of `--programs` honest programs (a function, three assert tests, all passing) is verified by
`olmax.rewards.code.verify` in this process, with isolation none (a child Python, as before the
sandbox) and with isolation namespaces (the same child entering user, PID, network, IPC, UTS, cgroup
and mount namespaces, a read-only root and its system call filter first), alternating so that all see
the same load. With `--before REF` (a git revision of this repository, e.g. the commit a change branched
from), the verifier as it was at REF (its `olmax/rewards/code.py` and the files beside it, loaded from a
temporary directory) is timed too, in the same alternation, as "REF none" and "REF namespaces": the cost
of a change to the sandbox, measured under one load. `--rounds` passes over the programs; the table gives
each row's median and 90th percentile milliseconds per program and the sandbox's extra cost. The probes
(once per process and verifier) are paid before the timing. Asserts that every program scores 1.0;
prints a table. The CPUs here are shared with other jobs.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import tempfile
import time

from olmax.rewards import code

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REWARDS = "src/olmax/rewards"


def programs(n: int) -> list[tuple[str, list[str]]]:
    """`n` honest programs with their three tests (a different constant each, so none is cached)."""
    out = []
    for i in range(n):
        source = f"```python\ndef scale(xs):\n    return [x * {i + 2} for x in xs]\n```"
        tests = [
            f"assert scale([1]) == [{i + 2}]",
            "assert scale([]) == []",
            f"assert scale([0, 3]) == [0, {3 * (i + 2)}]",
        ]
        out.append((source, tests))
    return out


def load_before(ref: str, into: str):
    """The code verifier module as it was at git revision `ref`, loaded from `into` (its child script
    beside it, where the module finds it)."""
    listed = subprocess.run(
        ["git", "-C", REPO, "ls-tree", "--name-only", f"{ref}:{REWARDS}"], capture_output=True, text=True, check=True
    )
    for name in listed.stdout.split():
        if name.startswith("code") and name.endswith(".py"):
            text = subprocess.run(
                ["git", "-C", REPO, "show", f"{ref}:{REWARDS}/{name}"], capture_output=True, check=True
            )
            with open(os.path.join(into, name), "wb") as f:
                f.write(text.stdout)
    spec = importlib.util.spec_from_file_location(f"olmax_code_at_{ref}", os.path.join(into, "code.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--programs", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--before", help="also time the verifier as it was at this git revision")
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args()
    verifiers = {"": code}
    with tempfile.TemporaryDirectory(prefix="olmax-code-before-") as into:
        if args.before:
            verifiers[f"{args.before} "] = load_before(args.before, into)
        for module in verifiers.values():
            if module.probe() is not None:
                raise SystemExit(f"no namespace sandbox here: {module.probe()}")
        times: dict[str, list[float]] = {
            f"{label}{isolation}": [] for label in verifiers for isolation in (code.NONE, code.NAMESPACES)
        }
        for _ in range(args.rounds):
            for source, tests in programs(args.programs):
                for label, module in verifiers.items():
                    for isolation in (code.NONE, code.NAMESPACES):
                        start = time.perf_counter()
                        assert module.verify(source, tests, isolation=isolation) == 1.0, (label, isolation, source)
                        times[f"{label}{isolation}"].append((time.perf_counter() - start) * 1e3)
    rows = {
        name: {"median_ms": statistics.median(ms), "p90_ms": statistics.quantiles(ms, n=10)[-1], "programs": len(ms)}
        for name, ms in times.items()
    }
    extra = {
        label: rows[f"{label}{code.NAMESPACES}"]["median_ms"] - rows[f"{label}{code.NONE}"]["median_ms"]
        for label in verifiers
    }
    width = max(len(name) for name in rows) + 2
    print(f"{'isolation':<{width}} {'programs':>8} {'median ms':>10} {'p90 ms':>8}")
    for name, row in rows.items():
        print(f"{name:<{width}} {row['programs']:>8} {row['median_ms']:>10.1f} {row['p90_ms']:>8.1f}")
    for label, ms in extra.items():
        print(f"the sandbox {'at ' + label.strip() + ' ' if label else ''}adds {ms:.1f} ms per program (median)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "extra_median_ms": extra}, f, indent=1)


if __name__ == "__main__":
    main()
