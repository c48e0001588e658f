"""The code verifier's cost per program with and without its namespace sandbox, measured in one run.

    .venv/bin/python benchmarks/code_sandbox.py [--programs 20 --rounds 3 --json out.json]

Each of `--programs` honest programs (a function, three assert tests, all passing) is verified by
`olmax.rewards.code.verify` in this process, with isolation none (a child Python, as before the
sandbox) and with isolation namespaces (the same child entering user, PID, network, IPC, UTS and mount
namespaces and a read-only root first), alternating so that both see the same load. `--rounds` passes
over the programs; the table gives each isolation's median and 90th percentile milliseconds per program
and the difference. The probe (once per process) is paid before the timing. Asserts that every program
scores 1.0; prints a table. The CPUs here are shared with other jobs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from olmax.rewards import code


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--programs", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args()
    if code.probe() is not None:
        raise SystemExit(f"no namespace sandbox here: {code.probe()}")
    times: dict[str, list[float]] = {code.NONE: [], code.NAMESPACES: []}
    for _ in range(args.rounds):
        for source, tests in programs(args.programs):
            for isolation in times:
                start = time.perf_counter()
                assert code.verify(source, tests, isolation=isolation) == 1.0, (isolation, source)
                times[isolation].append((time.perf_counter() - start) * 1e3)
    rows = {
        isolation: {
            "median_ms": statistics.median(ms),
            "p90_ms": statistics.quantiles(ms, n=10)[-1],
            "programs": len(ms),
        }
        for isolation, ms in times.items()
    }
    extra = rows[code.NAMESPACES]["median_ms"] - rows[code.NONE]["median_ms"]
    print(f"{'isolation':<12} {'programs':>8} {'median ms':>10} {'p90 ms':>8}")
    for isolation, row in rows.items():
        print(f"{isolation:<12} {row['programs']:>8} {row['median_ms']:>10.1f} {row['p90_ms']:>8.1f}")
    print(f"the sandbox adds {extra:.1f} ms per program (median)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "extra_median_ms": extra}, f, indent=1)


if __name__ == "__main__":
    main()
