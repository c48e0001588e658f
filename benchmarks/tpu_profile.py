"""Where a step's device time goes, from a JAX profiler trace: the `.xplane.pb` that jax.profiler.trace
writes (tpu_throughput.py --profile) or MaxText's trainer with `profiler=xplane` (tpu_maxtext.py
--profile), read with jax.profiler.ProfileData. The first device plane's "XLA Ops" line holds one event
per HLO op the chip executed (a loop's event spans its body's ops: each op keeps only its own time),
named as in the compiled program; with that program's text (the compiled step's as_text(), or XLA's
after-optimizations dump) each op gets its opcode and the JAX operation it came from (its metadata's
op_name: dot_general, pallas_call, ...). Summed per op and per kind (the op_name's last part, else
the opcode) and divided by the profiled steps, they say what a step spends its time on, for two
frameworks side by side.

    python benchmarks/tpu_profile.py TRACE_DIR --steps 3 [--hlo after_optimizations.txt --top 15]
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import defaultdict
from pathlib import Path

PROFILE_STEPS = 3  # steps traced after the timed ones (tpu_throughput.py, tpu_maxtext.py --profile)
OPS_LINE = "XLA Ops"  # the device plane's line of executed HLO ops (xprof's trace viewer shows the same)


def newest_trace(folder: str | Path) -> Path:
    found = sorted(Path(folder).rglob("*.xplane.pb"), key=lambda p: p.stat().st_mtime)
    if not found:
        raise FileNotFoundError(f"no *.xplane.pb under {folder} (was the profiler on?)")
    return found[-1]


HLO_OP = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+) = .*?\s([a-z][\w\-]*)\(")
OP_NAME = re.compile(r'op_name="([^"]+)"')


def hlo_ops(text: str) -> dict[str, tuple[str, str]]:
    """HLO instruction name -> (opcode, the JAX op_name of its metadata or "") from a module's text."""
    found = {}
    for line in text.splitlines():
        m = HLO_OP.match(line)
        if m:
            name = OP_NAME.search(line)
            found[m.group(1)] = (m.group(2), name.group(1) if name else "")
    return found


def kind_of(op: str, hlo: dict[str, tuple[str, str]]) -> str:
    opcode, op_name = hlo.get(op, ("", ""))
    if op_name:  # jit(train_step)/jvp(...)/while/body/.../dot_general -> dot_general
        return op_name.rstrip("/").rsplit("/", 1)[-1]
    return opcode or re.sub(r"[.\d]+$", "", op)


def op_name(event_name: str) -> str:
    """The HLO instruction's name: a trace may name an op by its whole line (`%fusion.12 = bf16[...]
    fusion(...)`) or by the name alone."""
    return event_name.split(" = ", 1)[0].strip().lstrip("%")


def self_times(events) -> list[list]:
    """(op, ns) per event less the events it encloses: a while loop's event on the ops line spans its
    body's ops, which have their own events, so each nanosecond is counted once, by the innermost op."""
    spans = sorted(((e.start_ns, -e.duration_ns, op_name(e.name)) for e in events))
    out: list[list] = []  # [op, ns] per event
    open_: list[tuple[float, int]] = []  # (end, index into out) of the events enclosing this one
    for start, neg, name in spans:
        while open_ and open_[-1][0] <= start:
            open_.pop()
        if open_:
            out[open_[-1][1]][1] += neg  # the innermost enclosing event loses this one's time
        out.append([name, -neg])
        open_.append((start - neg, len(out) - 1))
    return out


def op_times(space, steps: int, hlo: dict[str, tuple[str, str]] | None = None) -> dict:
    """ms per step by op and by kind on the first device plane with an "XLA Ops" line of a
    jax.profiler.ProfileData; hlo: hlo_ops of the profiled program, to name what each op does."""
    hlo = hlo or {}
    for plane in space.planes:
        ops = [line for line in plane.lines if line.name == OPS_LINE]
        if plane.name.startswith("/device:") and ops:
            break
    else:
        names = ", ".join(p.name for p in space.planes)
        raise ValueError(f"no device plane with an '{OPS_LINE}' line in the trace (planes: {names})")
    by_op: dict[str, float] = defaultdict(float)
    by_kind: dict[str, float] = defaultdict(float)
    for name, ns in self_times(ops[0].events):
        by_op[name] += ns / 1e6 / steps
    for name, ms in by_op.items():
        by_kind[kind_of(name, hlo)] += ms
    top = sorted(by_op.items(), key=lambda kv: -kv[1])[:40]
    described = lambda op: " ".join(x for x in hlo.get(op, ("", ""))).strip()[-160:]
    return {
        "device_plane": plane.name,
        "named_ops": sum(op in hlo for op in by_op) / max(len(by_op), 1),  # how much the HLO text explained
        "ms_per_step": sum(by_op.values()),
        "by_kind": dict(sorted(by_kind.items(), key=lambda kv: -kv[1])),
        "top_ops": [{"op": op, "ms": ms, "what": described(op)} for op, ms in top],
    }


def read(folder: str | Path, steps: int, hlo_text: str = "") -> dict:
    """op_times of the newest trace under folder, or {"error": why} where there is none or it holds no
    device's ops (a CPU's trace), so that a profiled row keeps its timing."""
    from jax.profiler import ProfileData

    try:
        path = newest_trace(folder)
        return {"trace": str(path), **op_times(ProfileData.from_file(str(path)), steps, hlo_ops(hlo_text))}
    except (OSError, ValueError) as e:
        return {"error": str(e)}


def side_by_side(profiles: dict[str, dict], top: int = 12) -> str:
    """One table of ms/step per op kind, a column per framework (profiles: name -> op_times)."""
    names = list(profiles)
    kinds = sorted(
        {k for p in profiles.values() for k in p["by_kind"]},
        key=lambda k: -max(p["by_kind"].get(k, 0.0) for p in profiles.values()),
    )
    lines = [f"{'op kind (ms/step)':32s}" + "".join(f"{n:>10s}" for n in names)]
    for kind in kinds[:top]:
        lines.append(f"{kind[:32]:32s}" + "".join(f"{profiles[n]['by_kind'].get(kind, 0.0):10.2f}" for n in names))
    rest = kinds[top:]
    if rest:
        lines.append(
            f"{'(the other kinds)':32s}"
            + "".join(f"{sum(profiles[n]['by_kind'].get(k, 0.0) for k in rest):10.2f}" for n in names)
        )
    lines.append(f"{'device ops in all':32s}" + "".join(f"{profiles[n]['ms_per_step']:10.2f}" for n in names))
    # an op the program's text did not name falls back to its opcode: a low share makes kinds incomparable
    lines.append(
        f"{'ops named by the program text':32s}"
        + "".join(f"{100 * profiles[n].get('named_ops', 0.0):9.0f}%" for n in names)
    )
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("trace_dir", help="a folder holding a *.xplane.pb (the newest is read)")
    p.add_argument("--steps", type=int, default=1, help="steps the trace covers (figures are per step)")
    p.add_argument("--hlo", help="the profiled program's HLO text (XLA's after-optimizations dump)")
    p.add_argument("--top", type=int, default=15, help="ops to list")
    args = p.parse_args(argv)
    prof = read(args.trace_dir, args.steps, Path(args.hlo).read_text() if args.hlo else "")
    if "error" in prof:
        print(prof["error"], file=sys.stderr)
        return 1
    print(f"{prof['trace']}: {prof['device_plane']}, {prof['ms_per_step']:.2f} ms of device ops per step")
    print(side_by_side({"ms": prof}))
    for op in prof["top_ops"][: args.top]:
        print(f"{op['ms']:9.3f} ms  {op['op']:28s} {op['what']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
