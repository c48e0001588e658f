"""Time to lower and compile the 7B train step (scan over layer groups) on fake CPU devices, and
what its per-device temporaries are made of; or, with --topology / --table, the TPU compiler's
figures for the recipes on TPU slices (docs/performance.md, "TPU compile-check").

    .venv/bin/python benchmarks/compile.py --table [--rows 0,2] [--json rows.jsonl]

--table compiles the recipes x topologies of ROWS one at a time, each in its own process (a 128- or
512-device 7B compile holds several GiB and takes many minutes on 2 cores), with the recipes' own
settings, and prints the markdown table docs/performance.md shows. One row:

    .venv/bin/python benchmarks/compile.py --recipe olmo3_7b_stage1 --topology tpu7x:4x4x4 --set ''

    .venv/bin/python benchmarks/compile.py [--recipe olmo3_7b_stage1 --devices 8 --set KEY=VALUE ...
                                            --buffers 12 --fused-attention-memory --json out.json]

Runs olmax.compile_check.compile_report (the real step, abstract arrays: nothing of the model's size
is allocated) with the overrides the 7B needs to fit a device: one instance per micro-batch, the
output layer in chunks of 1024 positions, each block rematerialised. With --buffers N it also dumps
XLA's buffer assignment and lists the N largest temporary allocations with the HLO value that
owns each, which is how docs/performance.md attributes the temporaries. Goal: compile under 3 minutes.

XLA:CPU can only compile the `xla` attention backend, whose score blocks a GPU or TPU never holds
(cuDNN and splash attention keep their tiles on chip). --fused-attention-memory swaps the attention
for a stand-in with a fused kernel's memory behaviour and none of its arithmetic, so XLA's
temporaries are what the rest of the step needs: the figure to expect on a GPU or TPU (plus the
kernel's own small workspace). The step it compiles computes nonsense; it is for memory only.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

DEFAULT_SET = ["trainer.micro_batch_size=1", "trainer.loss_chunk=1024", "model.remat=full"]
GOAL_S = 180.0

# (recipe, topology, slices, overrides): the figures docs/performance.md reports for the TPU slices.
ROWS = [
    ("olmo3_7b_stage1", "tpu7x:4x4x4", 1, ()),
    ("olmo3_7b_stage1", "v5p:4x4x4", 1, ()),
    ("olmo3_7b_stage1", "v5p:8x8x8", 1, ()),
    ("olmo3_7b_hd256", "tpu7x:4x4x4", 1, ()),
    ("olmo3_32b_stage1", "v5p:8x8x8", 1, ()),
    ("olmo3_7b_stage2", "tpu7x:4x4x4", 1, ()),
    ("olmo3_7b_stage3", "tpu7x:4x4x4", 1, ()),
    ("olmo3_7b_stage1", "v6e:16x16", 1, ()),
    ("olmo3_7b_stage1", "v6e:16x16", 1, ("trainer.micro_batch_size=1",)),
    ("olmo3_32b_stage2", "v5p:8x8x8", 1, ()),
    ("olmo3_32b_stage3", "v5p:8x8x8", 1, ()),
]


def table_row(r: dict) -> str:
    d = r["per_device"]
    hlo = r["hlo_flops_per_device"]
    context = f", context {r['mesh']['context']}" if r["mesh"].get("context", 1) > 1 else ""
    return (
        f"| {r['recipe']} | {r['topology']} x{r['num_slices']} | {r['devices']} | {r['mesh']['data']}x"
        f"{r['mesh']['fsdp']}x{r['mesh']['tensor']}{context} | {r['remat']} | "
        f"{r['per_device_batch']}/{r['micro_batch']} | "
        f"{r['attention']} ({r['attention_kernel_calls']}) | {d['peak_gib']:.1f} | {d['total_gib']:.1f} | "
        f"{r['hbm_limit_gib']:.2f} | {'yes' if r['fits'] else 'NO'} | {r['compile_s']:.0f} | "
        f"{'n/a' if hlo is None else f'{hlo / 1e12:.0f}'} / {r['model_flops_per_device'] / 1e12:.0f} |"
    )


TABLE_HEAD = (
    "| recipe | topology | devices | mesh d x f x t | remat | per-device / micro batch | attention (Mosaic calls) "
    "| peak GiB | XLA total GiB | HBM limit GiB | fits | compile s | TFLOP/device: HLO / model |\n" + "|---" * 13 + "|"
)


def run_table(rows: list[int], json_path) -> None:
    """Each row in its own process (python -m olmax.cli compile-check), one at a time."""
    print(TABLE_HEAD)
    for i in rows:
        recipe, topology, slices, overrides = ROWS[i]
        out = Path(tempfile.mkdtemp(prefix="olmax-cc-")) / "row.json"
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "olmax.cli",
                "compile-check",
                "--recipe",
                recipe,
                "--topology",
                topology,
                "--num-slices",
                str(slices),
                "--json",
                str(out),
                *overrides,
            ],
            capture_output=True,
            text=True,
        )
        if not out.exists():
            print(f"| {recipe} | {topology} x{slices} | failed: {proc.stderr.strip().splitlines()[-1][:200]} |")
            continue
        report = json.loads(out.read_text())
        print(table_row(report), flush=True)
        if json_path:
            with open(json_path, "a") as f:
                f.write(json.dumps(report) + "\n")


def largest_temporaries(dump_dir: Path, n: int) -> list[dict]:
    """The n largest HLO values placed in the step's temporary allocations (XLA packs temporaries
    into one preallocated block whose slices are reused by values with disjoint lifetimes, so the
    values can add up to more than the block)."""
    files = sorted(dump_dir.glob("*buffer-assignment.txt"))
    if not files:
        return []
    text = max(files, key=lambda p: p.stat().st_size).read_text()
    values = []
    for block in re.split(r"\n(?=allocation \d+:)", text):
        head = re.match(r"allocation \d+: size \d+(.*)", block)
        if head and "preallocated-temp" in head.group(1):
            values += re.findall(r"value: <\d+ ([^ >]+)[^>]*> \(size=(\d+)[^)]*\): (\S+)", block)
    values.sort(key=lambda v: -int(v[1]))
    return [{"bytes": int(size), "value": name, "shape": shape} for name, size, shape in values[:n]]


def fused_attention_stand_in(q, k, v, window):
    """Memory model of a fused (flash) attention kernel, for --fused-attention-memory: q, k, v in,
    an output of q's shape out, and for the backward pass exactly what cuDNN's and splash's kernels
    keep: q, k, v, the output and one float32 log-sum-exp per (row, head). No (seq x seq) array
    exists. The values are meaningless (elementwise stand-ins for the kernels' arithmetic)."""
    import jax
    import jax.numpy as jnp

    del window
    group = q.shape[2] // k.shape[2]

    def widen(x):  # kv heads -> query heads, as grouped-query attention reads them
        return jnp.repeat(x, group, axis=2) if group > 1 else x

    def narrow(x):  # query-head gradient -> kv-head gradient
        return x.reshape(*x.shape[:2], -1, group, x.shape[-1]).sum(3) if group > 1 else x

    @jax.custom_vjp
    def kernel(q, k, v):
        return q + widen(k) + widen(v)

    def forward(q, k, v):
        out = kernel(q, k, v)
        lse = jnp.sum(q.astype(jnp.float32), axis=-1)  # (batch, seq, heads)
        return out, (q, k, v, out, lse)

    def backward(residuals, d_out):
        q, k, v, out, lse = residuals
        d = (q + widen(k) + widen(v) + out).astype(jnp.float32) * d_out.astype(jnp.float32) * lse[..., None]
        return d.astype(q.dtype), narrow(d).astype(k.dtype), narrow(d).astype(v.dtype)

    kernel.defvjp(forward, backward)
    return kernel(q, k, v)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--recipe", default="olmo3_7b_stage1")
    p.add_argument("--devices", type=int, default=8)
    p.add_argument(
        "--set",
        action="append",
        default=None,
        metavar="KEY=VALUE",
        help=f"overrides (default: {' '.join(DEFAULT_SET)})",
    )
    p.add_argument("--buffers", type=int, default=0, help="list this many largest temporaries (dumps HLO)")
    p.add_argument(
        "--fused-attention-memory",
        action="store_true",
        help="replace attention by a fused kernel's memory stand-in (memory figures only)",
    )
    p.add_argument("--topology", help="compile for this TPU topology (v5p:4x4x4, tpu7x:4x4x4, ...)")
    p.add_argument("--num-slices", type=int, default=1)
    p.add_argument("--table", action="store_true", help="compile the ROWS one at a time, print the table")
    p.add_argument("--rows", default=None, help="comma-separated indices into ROWS (default: all)")
    p.add_argument("--json")
    args = p.parse_args(argv)
    if args.table:
        run_table([int(i) for i in args.rows.split(",")] if args.rows else list(range(len(ROWS))), args.json)
        return
    overrides = DEFAULT_SET if args.set is None else [o for o in args.set if o]
    dump = Path(tempfile.mkdtemp(prefix="olmax-compile-")) if args.buffers else None
    flags = [f"--xla_force_host_platform_device_count={args.devices}"]
    if dump:
        flags += [f"--xla_dump_to={dump}", "--xla_dump_hlo_module_re=.*train.*|.*step_fn.*"]
    os.environ["XLA_FLAGS"] = " ".join([os.environ.get("XLA_FLAGS", "")] + flags)
    os.environ.setdefault("JAX_PLATFORMS", "cpu")

    from olmax.compile_check import compile_report, format_report
    from olmax.recipes import resolve

    if args.fused_attention_memory:  # the stand-in as the backend table's entry for XLA:CPU
        from olmax.model import attention

        attention.BACKENDS["xla"] = fused_attention_stand_in

    report = compile_report(resolve(args.recipe, None, overrides), topology=args.topology, num_slices=args.num_slices)
    report["overrides"] = overrides
    if args.fused_attention_memory:
        report["attention"] = "fused-kernel memory stand-in"
    report["total_s"] = report["lower_s"] + report["compile_s"]
    report["under_goal"] = report["total_s"] < GOAL_S
    if dump:
        report["largest_temporaries"] = largest_temporaries(dump, args.buffers)
    print(format_report(report))
    print(
        f"overrides: {' '.join(overrides)}"
        + ("  [attention: fused-kernel memory stand-in]" if args.fused_attention_memory else "")
    )
    print(
        f"lower + compile {report['total_s']:.1f} s: {'under' if report['under_goal'] else 'OVER'} "
        f"the {GOAL_S:.0f} s goal"
    )
    for a in report.get("largest_temporaries", []):
        print(f"  {a['bytes'] / 2**30:8.2f} GiB  {a['value']:40s} {a['shape']}")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    sys.exit(main())
