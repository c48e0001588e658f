"""Time to lower and compile the 7B train step (scan over layer groups) on fake CPU devices, and
what its per-device temporaries are made of; or, with --topology / --table, the TPU compiler's
figures for the recipes on TPU slices (docs/performance/recipes-on-slices.md, "TPU compile-check").

    .venv/bin/python benchmarks/compile.py --table [--rows 0,2] [--json rows.jsonl]

--table compiles the recipes x topologies of ROWS one at a time, each in its own process (a 128- or
512-device 7B compile holds several GiB and takes many minutes on 2 cores), with the recipes' own
settings, and prints the markdown table docs/performance/recipes-on-slices.md shows. One row:

    .venv/bin/python benchmarks/compile.py --recipe olmo3_7b_stage1 --topology tpu7x:4x4x4 --set ''

--remat-sweep compiles each recipe and slice of SWEEP with each remat policy of SWEEP_POLICIES (or
--policy ...), olmax's step (twice: the backward pass's order left to the compiler, and serial,
model.remat_serial) and, with --maxtext-python / $MAXTEXT_PYTHON, MaxText's own
(maxtext_compile.py), and prints the compiler's heap, whether it fits and the recompute each policy
costs (docs/performance/remat.md, "A leaner backward and the remat sweep"):

    MAXTEXT_PYTHON=../maxtext-venv/bin/python .venv/bin/python benchmarks/compile.py --remat-sweep --sweep-rows 0

    .venv/bin/python benchmarks/compile.py [--recipe olmo3_7b_stage1 --devices 8 --set KEY=VALUE ...
                                            --buffers 12 --fused-attention-memory --json out.json]

Runs olmax.fit.compile_check.compile_report (the real step, abstract arrays: nothing of the model's size
is allocated) with the overrides the 7B needs to fit a device: one instance per micro-batch, the
output layer in chunks of 1024 positions, each block rematerialised. With --buffers N it also dumps
XLA's buffer assignment and lists the N largest temporary allocations with the HLO value that
owns each, which is how docs/performance/memory-and-fit.md attributes the temporaries. Goal: compile under 3 minutes.

XLA:CPU can only compile the `xla` attention backend, whose score blocks a GPU or TPU never holds
(cuDNN and splash attention keep their tiles on chip). --fused-attention-memory swaps the attention
for a stand-in with a fused kernel's memory behaviour and none of its arithmetic, so XLA's
temporaries are what the rest of the step needs: the figure to expect on a GPU or TPU (plus the
kernel's own small workspace). The step it compiles computes nonsense; it is for memory only.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

DEFAULT_SET = ["trainer.micro_batch_size=1", "trainer.loss_chunk=1024", "model.remat=full"]
GOAL_S = 180.0

# (recipe, topology, slices, overrides): the figures docs/performance/recipes-on-slices.md reports for the TPU slices.
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
    search = r["remat_search"]
    auto = (
        ""
        if search is None
        else " (auto: as recorded before)"
        if r["remat_search_from"]
        else f" (auto: {len(search)} compiles, {r['remat_search_s']:.0f} s)"
    )
    return (
        f"| {r['recipe']} | {r['topology']} x{r['num_slices']} | {r['devices']} | {r['mesh']['data']}x"
        f"{r['mesh']['fsdp']}x{r['mesh']['tensor']}{context} | {r['remat']}{', serial' if r['remat_serial'] else ''}"
        f"{auto} | "
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


# --remat-sweep: the policies tried for each recipe and slice, as sets of tags (olmax.config.remat.REMAT_TAGS),
# from least kept to most. SEEDS is what the MaxText OLMo 3 run kept.
SEEDS = "q_proj,k_proj,v_proj,attn_context,o_proj,mlp_gate,mlp_down"
SWEEP_POLICIES = [
    "full",
    "q_proj,k_proj,v_proj",
    "q_proj,k_proj,v_proj,o_proj,mlp_gate,mlp_down",
    SEEDS,
    SEEDS + ",mlp_up",
]
SWEEP = [
    ("olmo3_7b_stage1", "tpu7x:4x4x4"),
    ("olmo3_7b_stage1", "v5p:4x4x4"),
    ("olmo3_7b_stage1", "v5p:8x8x8"),
    ("olmo3_7b_hd256", "tpu7x:4x4x4"),
    ("olmo3_7b_stage2", "tpu7x:4x4x4"),
    ("olmo3_32b_stage1", "v5p:8x8x8"),
]
# olmax's tags under MaxText's names (its configs/base.yml, remat_policy=custom); layer_input is
# MaxText's decoder_layer_input, which it always keeps, once per scanned block
MAXTEXT_NAMES = {
    "q_proj": "query_proj",
    "k_proj": "key_proj",
    "v_proj": "value_proj",
    "attn_context": "context",
    "o_proj": "out_proj",
    "mlp_gate": "mlpwi_0",
    "mlp_up": "mlpwi_1",
    "mlp_down": "mlpwo",
}
# MaxText's names of the slices (its utils/accelerator_to_spec_map.py)
MAXTEXT_TOPOLOGIES = {
    "tpu7x:4x4x4": "tpu7x-128",
    "v5p:4x4x4": "v5p-128",
    "v5p:8x8x8": "v5p-1024",
    "v6e:16x16": "v6e-256",
}
# MaxText's model and overrides for a recipe's model
MAXTEXT_MODELS = {
    "olmo3_7b_stage1": ("olmo3-7b-pt", []),
    "olmo3_7b_stage2": ("olmo3-7b-pt", []),
    "olmo3_7b_hd256": (
        "olmo3-7b-pt",
        ["--set", "head_dim=256", "--set", "base_num_query_heads=16", "--set", "base_num_kv_heads=16"],
    ),
    "olmo3_32b_stage1": ("olmo3-32b", []),
}


SWEEP_HEAD = (
    "| recipe | slice | per-device batch (micro-batches) | kept (besides each block's input) | framework "
    "| heap GiB | limit GiB | fits | hardware / model FLOPs |\n" + "|---" * 9 + "|"
)


def compiler_heap(dump: Path) -> Optional[float]:
    """The heap the TPU compiler checks against HBM, in GiB (olmax.fit.compiler.tpu_heap_bytes: what
    jax 0.12 returns as total_allocation_bytes)."""
    from olmax.fit.compiler import tpu_heap_bytes

    heap = tpu_heap_bytes(dump)
    return None if heap is None else heap / 2**30


def heap_of(cmd: list[str], env: dict, dump: Path, timeout: float, limit: float) -> tuple[Optional[float], str]:
    """Run a compile with an XLA dump into `dump` and return (heap GiB or None, a note).

    The compiler writes its memory-usage report after its first buffer assignment. At or under the
    limit that is the final heap, and the compile is stopped there (the rest is code generation).
    Over it the compiler rematerialises further on its own and assigns again without a new report,
    so the compile runs to the end: it fails (out of HBM) or its JSON (`--json`, the last argument)
    gives the final figure: MaxText's heap, olmax's `per_device.heap_gib` (compile-check reads the
    report from the dump XLA_FLAGS names), or its peak where that heap was over the limit."""
    dump_flags = f"--xla_dump_to={dump} --xla_dump_hlo_module_re=.*train_step.*|.*step_fn.*"
    env = {**env, "XLA_FLAGS": f"{env.get('XLA_FLAGS', '')} {dump_flags}"}
    log = dump.with_suffix(".log")
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
        t0 = time.monotonic()
        while proc.poll() is None and time.monotonic() - t0 < timeout:
            first = compiler_heap(dump)
            if first is not None and first <= limit:
                time.sleep(2)  # the report is written in one go; let it land
                break
            time.sleep(5)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    first = compiler_heap(dump)
    if first is not None and first <= limit:
        return first, ""
    out = Path(cmd[-1])
    report = json.loads(out.read_text()) if out.exists() and out.stat().st_size else {}
    per_device = report.get("per_device", {})
    final = report.get("heap_gib") or per_device.get("heap_gib") or per_device.get("peak_gib")
    note = f"first assignment {first:.2f} GiB, over the limit; " if first is not None else ""
    if final is not None:
        return final, note + ("compiler rematerialised to fit" if first is not None else "")
    lines = log.read_text().splitlines()
    # the compiler's out-of-memory, else the runner's or the CLI's error (libtpu's start-up noise is not one)
    for marker in ("RESOURCE_EXHAUSTED", '"error":', "rror: "):
        found = [ln for ln in lines if marker in ln and "common_lib.cc" not in ln]
        if found:
            return None, note + found[-1][:300]
    return None, note + "no memory report"


def olmax_cmd(recipe: str, topology: str, policy: str, serial: bool, json_out: Path) -> list[str]:
    cmd = [sys.executable, "-m", "olmax.cli", "compile-check", "--recipe", recipe, "--topology", topology]
    return cmd + [f"model.remat={policy}", f"model.remat_serial={str(serial).lower()}", "--json", str(json_out)]


def maxtext_cmd(
    python: str, recipe: str, topology: str, per_device: int, micro: int, seq_len: int, saved, chip, json_out: Path
) -> list[str]:
    from olmax.fit.chips import libtpu_init_args

    model, extra = MAXTEXT_MODELS[recipe]
    save = ",".join(MAXTEXT_NAMES[t] for t in saved if t in MAXTEXT_NAMES)
    script = str(Path(__file__).resolve().parent / "maxtext_compile.py")
    return (
        [python, script, "--topology", MAXTEXT_TOPOLOGIES[topology], "--model", model]
        + [
            # MaxText's per_device_batch_size is one micro-batch; gradient_accumulation_steps multiplies it
            # (its pyconfig: global batch = devices x per_device_batch_size x accumulation steps)
            f"--per-device-batch={micro}",
            f"--accumulation={per_device // micro}",
            f"--seq-len={seq_len}",
            f"--save={save}",
            f"--flags={libtpu_init_args(chip)}",
        ]
        + extra
        + ["--json", str(json_out)]  # last: heap_of reads it
    )


def run_sweep(rows: list[int], policies: list[str], maxtext_python: Optional[str], timeout: float, json_path) -> None:
    """For each recipe and slice of SWEEP (`rows`), each policy of SWEEP_POLICIES compiled by olmax and,
    when MaxText's venv is there, by MaxText with the same kept tensors: the compiler's heap, whether
    it fits (heap at most chips.HBM_HEADROOM of the limit) and the recompute (hardware / model FLOPs)."""
    from olmax.config.recipes import resolve
    from olmax.config.remat import remat_policy_of
    from olmax.fit.chips import HBM_HEADROOM, chip_of_topology
    from olmax.fit.flops import exact_step_flops, recompute_flops
    from olmax.model.attention import resolve_backend

    print(SWEEP_HEAD)
    for i in rows:
        recipe, topology = SWEEP[i]
        chip = chip_of_topology(topology)
        for policy in policies:
            cfg = resolve(recipe, None, [f"model.remat={policy}"])
            devices = math.prod(int(n) for n in topology.split(":")[1].split("x")) * chip.devices_per_chip
            per_device = cfg.trainer.global_batch // devices
            micro = min(cfg.trainer.micro_batch_size or per_device, per_device)  # as olmax's batch_layout
            saved = remat_policy_of(policy).save
            model = exact_step_flops(cfg.model, cfg.data.seq_len, per_device).total
            work = Path(tempfile.mkdtemp(prefix="remat-sweep-"))
            backend = resolve_backend(
                cfg.model.attention, chip.platform, cfg.model.compute_dtype, doc_masking=cfg.data.doc_masking
            )
            # olmax twice: the backward's order left to the compiler, and serial (model.remat_serial)
            runs = [
                (name, olmax_cmd(recipe, topology, policy, serial, work / f"{name}.json"), backend)
                for name, serial in (("olmax", False), ("olmax-serial", True))
            ]
            if maxtext_python and recipe in MAXTEXT_MODELS and topology in MAXTEXT_TOPOLOGIES:
                out = work / "maxtext.json"
                seq = cfg.data.seq_len
                cmd = maxtext_cmd(maxtext_python, recipe, topology, per_device, micro, seq, saved, chip, out)
                # MaxText's splash names its output and log-sum-exp `context`, as olmax's splash does
                runs.append(("maxtext", cmd, "splash"))
            limit = chip.hbm_limit_gib
            for framework, cmd, backend in runs:
                heap, error = heap_of(cmd, dict(os.environ), work / f"{framework}-dump", timeout, limit)
                ratio = 1 + recompute_flops(cfg.model, cfg.data.seq_len, per_device, saved, backend=backend) / model
                fits = (
                    "OOM"
                    if heap is None and "RESOURCE_EXHAUSTED" in error
                    else ("?" if heap is None else ("yes" if heap <= HBM_HEADROOM * limit else "NO"))
                )
                row = {
                    "recipe": recipe,
                    "topology": topology,
                    "per_device_batch": per_device,
                    "micro_batch": micro,
                    "saved": list(saved),
                    "framework": framework,
                    "heap_gib": heap,
                    "hbm_limit_gib": limit,
                    "fits": fits,
                    "flops_ratio": ratio,
                    "error": error,
                }
                heap_text = (
                    f"{heap:.2f}" + (f" ({error})" if error else "") if heap is not None else f"- ({error[:80]})"
                )
                cells = [
                    recipe,
                    topology,
                    per_device if micro == per_device else f"{per_device} ({per_device // micro} x {micro})",
                    policy,
                    framework,
                    heap_text,
                    f"{limit:.2f}",
                    fits,
                    f"{ratio:.3f}",
                ]
                print("| " + " | ".join(map(str, cells)) + " |", flush=True)
                if json_path:
                    with open(json_path, "a") as f:
                        f.write(json.dumps(row) + "\n")


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
    p.add_argument(
        "--remat-sweep", action="store_true", help="every SWEEP_POLICIES policy per SWEEP row, olmax and MaxText"
    )
    p.add_argument("--sweep-rows", default=None, help="comma-separated indices into SWEEP (default: all)")
    p.add_argument("--policy", action="append", help="sweep only these model.remat values (default: SWEEP_POLICIES)")
    p.add_argument(
        "--maxtext-python", default=os.environ.get("MAXTEXT_PYTHON"), help="MaxText venv's python (maxtext_venv.sh)"
    )
    p.add_argument("--timeout", type=float, default=1800, help="seconds a compile may take to reach its heap")
    p.add_argument("--json")
    args = p.parse_args(argv)
    if args.remat_sweep:
        rows = [int(i) for i in args.sweep_rows.split(",")] if args.sweep_rows else list(range(len(SWEEP)))
        run_sweep(rows, args.policy or SWEEP_POLICIES, args.maxtext_python, args.timeout, args.json)
        return
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

    from olmax.config.recipes import resolve
    from olmax.fit.compile_check import compile_report, format_report

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
