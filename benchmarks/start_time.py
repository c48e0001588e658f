"""Time to the first step of `olmax train`, cold and warm: how much of a run's start the persistent
compilation cache (olmax.fit.compile_cache) and the remat search's shared record save. Each row is a
fresh `olmax train` process in a new run directory:

- off:  OLMAX_COMPILE_CACHE=off (every program compiled, model.remat=auto searches);
- cold: an empty compilation cache (compiled, and kept);
- warm: the same cache again (the programs, and auto's choice, read back).

`olmax data order` first fills the data cache (the tokenized corpus, the data order: nothing
compiled), so no row pays for it. "first step" is the seconds from the process's start to step 1's
row in metrics.jsonl; "total" the whole process (the last checkpoint included); then where the first
step's time went, from the `start/...` figures `olmax train` logs with its first row (olmax.trainer.run):
process (imports, the CLI and the config, before train()), mesh (the devices' runtime starts), fit
(model.remat=auto: the record or the search), state (the init or a checkpoint), data (the loader), loop
(the step's program compiled or read back, and steps 1-2 run until step 1's row). Prints a table;
asserts nothing.

    python benchmarks/start_time.py                                   # the tiny recipe on this host (CPU)
    python benchmarks/start_time.py --recipe olmo3_7b --set KEY=VALUE ... --rows cold,warm --runs 1
                                                  # a recipe's shape on a TPU: benchmarks/tpu.sh's `start` step
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from shapes import SHAPE_1B, SHAPE_190M

ROOT = Path(__file__).resolve().parents[1]
SHAPES = {"190m": SHAPE_190M, "1b": SHAPE_1B}


def run(args, run_dir: Path, env: dict) -> dict:
    """One `olmax train` process: seconds to step 1's metrics row and in all."""
    cmd = [sys.executable, "-m", "olmax.cli", "train", "--recipe", args.recipe, "--run-dir", str(run_dir)]
    cmd += [f"trainer.max_steps={args.steps}", "eval.every=0", *args.set]
    metrics = run_dir / "metrics.jsonl"
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    first = None
    while proc.poll() is None:
        if first is None and metrics.exists() and metrics.read_text().strip():
            first = time.perf_counter() - t0
        time.sleep(0.05)
    total = time.perf_counter() - t0
    output = proc.stdout.read()
    if proc.returncode:
        raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}:\n{output[-3000:]}")
    if first is None and metrics.exists():  # the row was written as the process ended
        first = total
    row = json.loads(metrics.read_text().splitlines()[0])
    phases = {k.removeprefix("start/").removesuffix("_s"): v for k, v in row.items() if k.startswith("start/")}
    return {"first_step_s": first, "total_s": total, **phases}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", default="tiny")
    parser.add_argument("--set", action="append", default=[], help="a dotted override (repeatable)")
    parser.add_argument("--shape", choices=sorted(SHAPES), help="a model shape of benchmarks/shapes.py, before --set")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--runs", type=int, default=2, help="processes per row (the table shows their median)")
    parser.add_argument("--rows", default="off,cold,warm", help="which rows, comma-separated (off, cold, warm)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    args.set = [*SHAPES.get(args.shape, []), *args.set]
    work = Path(tempfile.mkdtemp(prefix="olmax-start-"))
    base = {k: v for k, v in os.environ.items() if k not in ("JAX_COMPILATION_CACHE_DIR",)}
    base["OLMAX_CACHE"] = str(work / "olmax-cache")  # the data cache, shared by every row
    base["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), *filter(None, [os.environ.get("PYTHONPATH")])])
    fill = [sys.executable, "-m", "olmax.cli", "data", "order", "--recipe", args.recipe, "--steps", "1:2", *args.set]
    subprocess.run(fill, env=base, check=True, stdout=subprocess.DEVNULL)  # the tokenized corpus, the data order
    rows = {}
    wanted = args.rows.split(",")
    if "warm" in wanted and "cold" not in wanted:
        parser.error("--rows: warm reads what cold writes")
    for name in [r for r in ("off", "cold", "warm") if r in wanted]:
        times = []
        for i in range(args.runs):
            cache = work / f"compile-cache-{i}"
            env = {**base, "OLMAX_COMPILE_CACHE": "off" if name == "off" else str(cache)}
            times.append(run(args, work / f"{name}-{i}", env))
        rows[name] = {k: statistics.median(t[k] for t in times) for k in times[0]}
    print(f"olmax train --recipe {args.recipe} {' '.join(args.set)}: seconds, median of {args.runs}", flush=True)
    phases = [k for k in ("process", "mesh", "fit", "state", "data", "loop") if all(k in r for r in rows.values())]
    print(f"{'compile cache':<14} {'first step':>10} {'total':>8} " + " ".join(f"{p:>8}" for p in phases))
    for name, r in rows.items():
        cells = " ".join(f"{r[p]:>8.1f}" for p in phases)
        print(f"{name:<14} {r['first_step_s']:>10.1f} {r['total_s']:>8.1f} {cells}", flush=True)
    if "warm" in rows:
        print(f"warm / cold first step: {rows['warm']['first_step_s'] / rows['cold']['first_step_s']:.2f}")
    if args.json:
        args.json.write_text(json.dumps({"recipe": args.recipe, "set": args.set, "rows": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
